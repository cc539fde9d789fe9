"""What the read side hands back: each patch's report and state. Values
only: made by ``patchkit.engine``, printed by ``patchkit.output``; they call
nothing back. What an apply or revert changes (``Outcome``) lives with the
step that writes it, ``patchkit.api.commit``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from patchkit.findings import Finding, State
from patchkit.tree import Tree

if TYPE_CHECKING:
    from patchkit.registry.definitions import Patch

# Patch-level states, as `status` prints them. STALE: applied, but the runtime
# code vendored for it is not what this patchkit writes (`apply` updates it).
ABSENT, APPLIED, NATIVE, PARTIAL, NOT_APPLICABLE = "absent", "applied", "native", "partial", "not-applicable"
STALE = "stale"
LEGACY = (
    "patched by patchkit 0.1 (the patched code imports patchkit.runtime): run `patchkit revert`, "
    "then `patchkit apply` to vendor the runtime into the tree"
)


@dataclass(frozen=True)
class CodemodResult:
    file: str
    codemod: str
    finding: Finding


@dataclass(frozen=True)
class PatchReport:
    patch: Patch
    state: str
    reason: str = ""
    results: tuple[CodemodResult, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """Does the tree have this change (or legitimately not need it)?"""
        if self.state in (APPLIED, NATIVE):
            return True
        # Upstream moved on (e.g. removed the code): nothing to carry.
        # Or one site says the rest is moot here (Finding.moots_patch).
        return self.state == NOT_APPLICABLE and (
            all(r.finding.state is State.SUPERSEDED for r in self.results)
            or any(r.finding.moots_patch for r in self.results)
        )

    @property
    def missing(self) -> list[CodemodResult]:
        return [r for r in self.results if r.finding.state is State.MISSING]


def unified_diff(tree: Tree, rel: str, old: Optional[bytes], new: Optional[bytes]) -> str:
    """A unified diff; a side that is None (no such file) is /dev/null."""
    import difflib

    name = tree.repo_path(rel)
    lines = difflib.unified_diff(
        (old or b"").decode("utf-8", "surrogateescape").splitlines(keepends=True),
        (new or b"").decode("utf-8", "surrogateescape").splitlines(keepends=True),
        f"a/{name}" if old is not None else "/dev/null",
        f"b/{name}" if new is not None else "/dev/null",
    )
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)
