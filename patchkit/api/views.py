"""What ``diff`` and ``show`` read from a tree, as data (``output`` renders it).

Read only: these use the session's recorded originals and the files as they
are on disk, and write nothing (the read-command rule of the safety contract).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Optional

from patchkit import registry
from patchkit.engine import Session
from patchkit.layout import import_path
from patchkit.registry import Patch
from patchkit.results import unified_diff


@dataclass(frozen=True)
class FileDiff:
    rel: str  # relative to the sglang package folder
    path: str  # as in an upstream checkout (python/sglang/...)
    text: str  # the unified diff; "" when the file is as it was
    added: int  # lines
    removed: int
    status: str  # modified | added | removed


def _count(text: str) -> tuple[int, int]:
    added = removed = 0
    for line in text.splitlines():
        if line.startswith("+") and not line.startswith("+++"):
            added += 1
        elif line.startswith("-") and not line.startswith("---"):
            removed += 1
    return added, removed


def file_diffs(session: Session, patches: Optional[Iterable[Patch]] = None) -> list[FileDiff]:
    """Original -> now for every file patchkit changed or added, changed ones
    first (as apply lists them). With ``patches``: only the files those
    patches target (a file two patches change shows both changes; the
    runtime folder and manifest belong to no single patch)."""
    wanted = None if patches is None else {f for p in patches for f in p.files}
    out = []
    files = session.record.files
    for rel, entry in sorted(files.items(), key=lambda item: (item[1].original is None, item[0])):
        if wanted is not None and rel not in wanted:
            continue
        original = None if entry.original is None else session.blob(entry.original, rel)
        now = session.read(rel)
        text = unified_diff(session.tree, rel, original, now)
        if not text:
            continue
        status = "added" if original is None else "removed" if now is None else "modified"
        out.append(FileDiff(rel, session.tree.repo_path(rel), text, *_count(text), status))
    return out


@dataclass(frozen=True)
class CodemodView:
    file: str
    name: str
    description: str


def codemods(patch: Patch) -> list[CodemodView]:
    """Each codemod of ``patch`` and what it does (its DESCRIPTION; imports
    the codemod modules, so libcst)."""
    out = []
    for target in patch.targets:
        for ref in target.refs:
            codemod = registry.load_codemod(ref)
            description = (codemod.DESCRIPTION or (codemod.__doc__ or "").strip().split("\n\n")[0]).strip()
            out.append(CodemodView(target.file, registry.codemod_name(ref), " ".join(description.split())))
    return out


def runtime_modules(patch: Patch) -> list[str]:
    """Where patched code imports the patch's runtime from."""
    return [import_path(module.name) for module in patch.runtime]


def outcome_diffs(tree, outcome) -> list[FileDiff]:
    """What an apply or revert changed (or, dry, would change), per file, as
    ``file_diffs`` gives it: changed files first, then added ones."""
    out = []
    for rel, (old, new) in sorted(outcome.changed.items(), key=lambda item: (item[1][0] is None, item[0])):
        text = unified_diff(tree, rel, old, new)
        status = "added" if old is None else "removed" if new is None else "modified"
        out.append(FileDiff(rel, tree.repo_path(rel), text, *_count(text), status))
    return out
