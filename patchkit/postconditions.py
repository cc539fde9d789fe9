"""What a patch says must hold on the tree it leaves: its postconditions.

A patch names them in its TOML, ``postconditions = ["module:Name"]`` (a
class of its own set, loaded on first use as its codemods are; patchkit's
own set names a module of patchkit:
``patchkit.checks.mirror_reads:MirrorReadsGuarded``).
``apply`` checks each one, once the files are transformed and before
anything is written, whenever its patch is applied now or was before
(``patchkit.transform.checked``): a check that fails names the patch to refuse
and why, in one line; that patch and those that require it are skipped, the
others are transformed again without them and applied.

The engine knows no check by name: this module is all it knows of them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    from patchkit.tree import Tree


Result = TypeVar("Result")


@dataclass
class HeadStart(Generic[Result]):
    """Work a check asks of the transform's worker processes
    (``patchkit.transform.parallel``; only when files are computed there):
    ``side(the files the workers transform)``, called then, gives callables
    run in a process of their own (needing no libcst, it is forked first; in
    a pool's worker already, queued behind the files), each result handed to
    ``take`` in the parent; ``after(rel, bytes read, new bytes)``, called in
    the worker for each file it transformed (where the ``ast`` of both is at
    hand: ``python_ast``). Only ever a head start: what it computes is
    computed again, or found in a cache, by whoever needs it, and its errors
    are ignored."""

    side: Callable[[frozenset], Sequence[Callable[[], Result]]] = lambda files: ()
    take: Callable[[Result], None] = lambda result: None
    after: Callable[[str, bytes, bytes], None] | None = None


@dataclass(frozen=True)
class Proposed:
    """The tree as an apply would leave it (nothing is written yet)."""

    tree: Tree
    changed: Mapping[str, bytes]  # package-relative path -> the bytes apply would write
    release: Mapping[str, bytes | None]  # the release's bytes of the files apply changes (None: unknown)
    applying: frozenset[str]  # the ids this apply writes
    applied: frozenset[str]  # the ids applied before
    owner: str  # the patch that declared the check

    def written(self, rel: str) -> bytes | None:
        """The file ``rel`` as apply would leave it (None: not in the tree)."""
        if rel in self.changed:
            return self.changed[rel]
        try:
            return self.tree.read(rel)
        except OSError:
            return None

    def line_on_disk(self, rel: str, line: int, code: bytes | None = None) -> int:
        """Line ``line`` of ``rel`` as written, in the file as it is on disk
        now (``map_line``): the line a ``Violation`` names."""
        if rel not in self.changed:
            return line
        try:
            return map_line(self.changed[rel], self.tree.read(rel) or b"", line, code)
        except OSError:
            return line


@dataclass(frozen=True)
class Violation:
    """A check that fails: ``refuse``, the patch not to write (the owner, or
    another patch of this apply whose change makes the check fail), and
    ``why``: one line, ``refused: FILE:LINE: ...`` where a line is to blame
    (the line of the file on disk, ``Proposed.line_on_disk``: apply names it
    in the file as it leaves it), saying what fails and what the maintainer
    can do (``--skip PATCH`` at least)."""

    refuse: str
    why: str


class Postcondition(ABC):
    """A check a patch declares. One instance per apply: what ``head_start``
    reads it may keep for ``check``."""

    def head_start(self, tree: Tree) -> HeadStart | None:
        """Work the transform's worker processes may do ahead for ``check``
        (``HeadStart``), or None. Only a head start: ``check`` must find the
        same answer without it."""
        return None

    @abstractmethod
    def check(self, proposed: Proposed) -> Violation | None:
        """None when the check holds on ``proposed``; else what to refuse.
        A violation naming no patch of ``proposed.applying`` is not this
        apply's doing: it is ignored (``status``, ``verify`` and the check's
        own command report it)."""

    def audit(self, tree: Tree) -> Report | None:
        """The check's whole report on ``tree`` as it stands, for
        ``patchkit audit`` (None: this check offers none)."""
        return None


class Report(Protocol):
    """What ``patchkit audit`` prints: text (``verbose``: every finding, not
    only the problems) or JSON; ``paths(rel)`` is a file as the user sees it."""

    @property
    def ok(self) -> bool: ...

    def text(self, paths: Callable[[str], str], verbose: bool = False) -> str: ...

    def json(self, tree: dict, paths: Callable[[str], str]) -> str: ...


def map_line(src: bytes, dst: bytes, line: int, code: bytes | None = None) -> int:
    """Line ``line`` of ``src`` in ``dst`` (another version of the file):
    lines both have map one to one; in a run that changed, the line of
    ``dst``'s run that holds ``code`` (default: the line's own text), else
    the run's first. So a line of the file as a check saw it is found on
    disk (``Proposed.line_on_disk``), and in the file as apply leaves it."""
    if src == dst:
        return line
    from difflib import SequenceMatcher

    old, new = src.splitlines(), dst.splitlines()
    at = line - 1
    code = (old[at].strip() if at < len(old) else b"") if code is None else code
    for tag, i1, i2, j1, j2 in SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if i1 <= at < i2 or (i1 == i2 == at):
            if tag == "equal":
                return j1 + (at - i1) + 1
            return next((j + 1 for j in range(j1, j2) if code and code in new[j]), j1 + 1 if j2 > j1 else max(j1, 1))
    return line
