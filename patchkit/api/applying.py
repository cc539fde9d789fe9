"""``patchkit apply``: plan -> transform -> check -> commit.

Read and fetch first: the files, the checks patches declare, the release's
bytes. Plan: which selected patches still need applying (status of each,
``requires`` honoured), and the edits made since an earlier apply to their
files. Transform and check, in one step (``patchkit.transform.checked``):
each touched file once, with the codemods of every patch to apply
(``Transformer.run`` checks each codemod's postcondition and that the result
compiles), then the postconditions patches declare, on the tree as it would
be written. Commit: backups (edits carried onto them), state, the runtime
folder and manifest, written as one transaction. Values go down, and each
step's result is a new value: nothing is changed in place.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import patchkit
from patchkit import fetch, git, registry
from patchkit.api.commit import Outcome, commit
from patchkit.api.merge import original_with_user_edits
from patchkit.engine import Session
from patchkit.errors import PatchkitError
from patchkit.registry import Patch
from patchkit.results import APPLIED, LEGACY, NATIVE, NOT_APPLICABLE, STALE, PatchReport
from patchkit.state import vendoring
from patchkit.state.record import FileRecord, Record
from patchkit.transform import checked
from patchkit.transform.checks import declared
from patchkit.transform.transformer import Transformer
from patchkit.tree import sha256

if TYPE_CHECKING:
    from patchkit.transform.parallel import Progress
    from patchkit.tree import Tree


@dataclass(frozen=True)
class Plan:
    reports: dict[str, PatchReport]
    todo: tuple[Patch, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()  # (patch id, why)


def apply_patches(
    session: Session,
    selected: list[Patch],
    dry_run: bool = False,
    runtime: Optional[str] = None,
    progress: Optional["Progress"] = None,
    accept_vendor_code_risk: bool = False,
    say: Callable[[str], None] = lambda line: None,
) -> Outcome:
    """Apply ``selected``; ``runtime`` (vendored | package) switches the
    runtime mode, default: the tree's mode, or vendored on a fresh tree.
    ``progress(done, total)`` hears of each file transformed ahead.
    The fetch step downloads the release's bytes the vendor-code check needs
    (or refuses, offline), unless ``accept_vendor_code_risk``."""
    tree, record = session.tree, session.record
    mode = runtime or session.runtime_mode
    if mode not in vendoring.MODES:
        raise PatchkitError(f"unknown runtime mode {mode!r} (choose {' or '.join(vendoring.MODES)})")
    if record.legacy:
        raise PatchkitError(f"{tree.package}: {LEGACY}")
    # Read: the target files' bytes; the postconditions of the patches
    # selected or applied before, made. Fetch: the release's bytes the
    # vendor-code check compares with. What the patches are applied on.
    sources = session.sources(selected)
    applied = set(record.applied)
    checks = declared(registry.all_patches(), applied | {p.id for p in selected})
    pristine = fetch.release_sources(
        tree, sources, sources, download=True, accept_risk=accept_vendor_code_risk, say=say
    )
    base_commit = record.base_commit or git.head(tree.package)
    # Transform ahead: every file's detection and transform, in parallel or
    # from the transform cache (this seeds the findings the plan's reports
    # read), with the head start the checks ask of the workers.
    transformer = Transformer(
        tree, session.findings, session.modules, sources, pristine, risk_accepted=accept_vendor_code_risk
    )
    prepared = transformer.prepare(selected, progress, checks)
    # Plan; then, before the transform, what the plan's files need: edits
    # made since an earlier apply (a clone may recover backups).
    plan = plan_apply(session.reports(selected), selected, applied)
    edited = session.edited_since_apply(checked.files_of(plan.todo, sources))
    # Transform and check: a patch the vendor-code check or a postcondition
    # refuses is not written, nor those that require it. The commit checks
    # the runtime mode's rules and that every file to change is writable.
    done = checked.transform_checked(transformer, plan.todo, applied, checks, plan.skipped, not dry_run)
    changed: dict[str, tuple[Optional[bytes], Optional[bytes]]] = {
        rel: (sources[rel], new) for rel, new in done.changed.items()
    }
    messages = list(dict.fromkeys(prepared + done.notes))  # vendor code replaced on purpose, or its check skipped
    new_record, blobs = _record(tree, record, done, sources, edited)
    runtime_patches: Optional[list[Patch]] = None  # the runtime folder is planned for these (None: left as it is)
    if new_record.applied:
        if mode != session.runtime_mode and record.applied:
            messages.append(f"runtime: {session.runtime_mode} -> {mode}")
        new_record.runtime, new_record.runtime_api, new_record.patchkit = (
            mode,
            vendoring.RUNTIME_API,
            patchkit.__version__,
        )
        # What the record was made on: a record of another release is never believed (patchkit.state.reconcile).
        new_record.sglang, new_record.base_commit = tree.version, base_commit
        runtime_patches = [p for p in registry.all_patches() if p.id in new_record.applied]
    outcome = Outcome(
        list(plan.reports.values()),
        changed,
        [p.id for p in done.todo],
        list(done.skipped),
        messages,
        sorted(rel for rel in changed if pristine.get(rel) == sources[rel]),
        blobs,
    )
    # the session keeps what it learnt (its findings) when the command ends
    return commit(session, "apply", outcome, new_record, runtime_patches, force=True, dry_run=dry_run, mode_check=True)


def plan_apply(reports: list[PatchReport], selected: list[Patch], applied: set[str]) -> Plan:
    """Which of ``selected`` to apply now (their ``reports`` say each one's
    state; ``applied``: what patchkit applied before), which to skip and why."""
    by_id = {r.patch.id: r for r in reports}
    usable = {pid for pid, r in by_id.items() if r.state in (APPLIED, NATIVE)} | applied
    todo: list[Patch] = []
    skipped: list[tuple[str, str]] = []
    for patch in selected:
        report = by_id[patch.id]
        if report.state in (APPLIED, NATIVE, STALE):  # STALE: the runtime sync repairs it
            continue
        if report.state == NOT_APPLICABLE:
            if not report.ok:
                skipped.append((patch.id, refused_anchor(patch.id, report.reason)))
            continue
        blocked = [r for r in patch.requires if r not in usable and r not in {p.id for p in todo}]
        if blocked:
            skipped.append((patch.id, f"requires {blocked[0]}, which is not applied"))
            continue
        todo.append(patch)
    return Plan(by_id, tuple(todo), tuple(skipped))


def refused_anchor(pid: str, reason: str) -> str:
    """A patch whose anchor this tree lacks, in one line: why, and what the maintainer can do."""
    what = (
        "restore that file" if reason.endswith("file not in this tree") else "give that code the shape the patch needs"
    )
    return f"refused: {reason}; {what}, or {registry.skip_advice(pid)}"


def _record(
    tree: "Tree",
    record: Record,
    done: checked.Transformed,
    sources: Mapping[str, bytes],
    edited: dict[str, tuple[bytes, bytes]],
) -> tuple[Record, dict[str, bytes]]:
    """The record after this apply (``record`` is left as it is): patches
    applied, and per file it changes (``done.changed``: its new bytes) its
    backup and what patchkit wrote, with those bytes to store as blobs at
    commit. ``edited``: files changed since an earlier apply -> (what
    patchkit wrote, backup)."""
    record = record.copy()
    blobs: dict[str, bytes] = {}

    def keep(data: bytes) -> str:
        blobs[digest := sha256(data)] = data
        return digest

    for patch in done.todo:
        record.applied[patch.id] = [t.file for t in patch.targets if t.file in sources]
    for rel, new in done.changed.items():
        old = sources[rel]
        entry = record.files.get(rel)
        if entry is None:
            entry = record.files[rel] = FileRecord(keep(old), None)
        elif rel in edited:
            # Edited since an earlier apply: carry those edits onto the
            # backup too, or a later revert would silently drop them.
            entry.original = keep(original_with_user_edits(tree.path(rel), old, *edited[rel]))
        entry.patched = keep(new)
    return record, blobs
