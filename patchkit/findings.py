"""What a codemod's detector says about one file: its ``State`` and the anchor.

Kept apart from ``patchkit.codemods.common.base`` (which imports libcst) so that
``status`` / ``verify`` answered from the detection cache, and the report
formats, never import libcst.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Optional


class State(str, enum.Enum):
    TODO = "todo"  # anchor found, change not there yet
    DONE = "done"  # the change (ours or upstream's) is there
    SUPERSEDED = "superseded"  # upstream moved on; nothing to do and nothing to add
    MISSING = "missing"  # an anchor the change needs is not in the file


@dataclass(frozen=True)
class Finding:
    state: State
    anchor: str = ""
    detail: str = ""
    # Done or superseded by this tree's own code (a fork that does it its own
    # way), not by patchkit or upstream: the patch's report says so in a note.
    by_tree: bool = False
    # The line verify and status point at (1-based): set by the detector that
    # makes the finding, for the findings they report (todo, missing); for a
    # missing anchor, the line of the closest enclosing code that was found.
    # None where nothing was found (the class or file is not there), and on
    # done and superseded findings (never reported at a line).
    line: Optional[int] = None
    # Superseded for the whole patch: this site decides that what the patch
    # changes never runs in this tree (e.g. no CUDA graph for a backend to
    # join), so the patch's other sites are moot and the patch is not
    # applicable, with this finding's detail as the reason.
    moots_patch: bool = False

    @classmethod
    def todo(cls, anchor: str, detail: str = "") -> "Finding":
        return cls(State.TODO, anchor, detail)

    @classmethod
    def done(cls, anchor: str, detail: str = "", by_tree: bool = False) -> "Finding":
        return cls(State.DONE, anchor, detail, by_tree)

    @classmethod
    def superseded(cls, anchor: str, detail: str, by_tree: bool = False, moots_patch: bool = False) -> "Finding":
        return cls(State.SUPERSEDED, anchor, detail, by_tree, moots_patch=moots_patch)

    def at(self, line: Optional[int]) -> "Finding":
        """This finding at ``line`` (the detector's own, where it has one)."""
        return self if self.line is not None or line is None else replace(self, line=line)

    def as_list(self) -> list:
        """The cached form (detection and transform caches)."""
        listed = [self.state.value, self.anchor, self.detail, self.by_tree, self.line]
        return listed + [True] if self.moots_patch else listed  # rare: the common form stays five items

    @classmethod
    def from_list(cls, cached: list) -> "Finding":
        # Entries written before ``by_tree`` existed have three items, before
        # ``line`` four, before ``moots_patch`` five.
        return cls(State(cached[0]), *cached[1:])

    @classmethod
    def missing(cls, anchor: str, detail: str) -> "Finding":
        return cls(State.MISSING, anchor, detail)
