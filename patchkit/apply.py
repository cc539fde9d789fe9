"""``patchkit apply``: plan -> transform -> check -> commit.

Plan: which selected patches still need applying (status of each, ``requires``
honoured). Transform: each touched file once, with the codemods of every patch
to apply (``Session.transform`` checks each codemod's postcondition and that
the result compiles). Check: every file writable, edits made since an earlier
apply carried onto the backup. Commit: backups, state, the runtime folder and
manifest, written as one transaction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import patchkit
from patchkit import git, vendoring
from patchkit.commit import check_writable, commit, sync_runtime
from patchkit.engine import APPLIED, LEGACY, NATIVE, NOT_APPLICABLE, STALE, Outcome, PatchReport, Session
from patchkit.errors import PatchkitError
from patchkit.merge import original_with_user_edits
from patchkit.record import FileRecord, Record
from patchkit.registry import Patch
from patchkit.state import sha256


@dataclass
class Plan:
    reports: dict[str, PatchReport]
    todo: list[Patch] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (patch id, why)
    files: list[str] = field(default_factory=list)  # target files of ``todo`` present in the tree


def apply_patches(session: Session, selected: list[Patch], dry_run: bool = False, runtime: Optional[str] = None) -> Outcome:
    """Apply ``selected``; ``runtime`` (vendored | package) switches the
    runtime mode, default: the tree's mode, or vendored on a fresh tree."""
    mode = runtime or session.runtime_mode
    if mode not in vendoring.MODES:
        raise PatchkitError(f"unknown runtime mode {mode!r} (choose {' or '.join(vendoring.MODES)})")
    if session.record.legacy:
        raise PatchkitError(f"{session.tree.package}: {LEGACY}")
    vendoring.check_mode([*session.applied_patches(), *selected], mode)
    plan = plan_apply(session, selected)
    check_writable(session.tree, plan.files)
    outcome = Outcome(list(plan.reports.values()), done=[p.id for p in plan.todo], skipped=plan.skipped)
    for rel in plan.files:
        old = session.read(rel)
        new = session.transform(rel, old, session.codemods_for(rel, plan.todo))
        if new != old:
            outcome.changed[rel] = (old, new)
    outcome.messages.extend(session.notes)  # vendor code replaced on purpose, or its check skipped
    record = _record(session, plan, outcome)
    if record.applied:
        if mode != session.runtime_mode and session.record.applied:
            outcome.messages.append(f"runtime: {session.runtime_mode} -> {mode}")
        record.runtime, record.runtime_api, record.patchkit = mode, vendoring.RUNTIME_API, patchkit.__version__
        # What the record was made on: a record of another release is never believed (patchkit.reconcile).
        record.sglang = session.tree.version
        record.base_commit = record.base_commit or git.head(session.tree.package)
        sync_runtime(session.snapshot, record, session.applied_patches(record.applied), outcome, force=True)
    if not dry_run and outcome.changed:
        commit(session, "apply", outcome, record)
    session.save_cache()
    return outcome


def plan_apply(session: Session, selected: list[Patch]) -> Plan:
    """Which of ``selected`` to apply now, which to skip and why."""
    session.prepare(selected)  # every file's detection and transform, in parallel or from the cache
    plan = Plan({r.patch.id: r for r in session.reports(selected)})
    usable = {pid for pid, r in plan.reports.items() if r.state in (APPLIED, NATIVE)} | set(session.record.applied)
    for patch in selected:
        report = plan.reports[patch.id]
        if report.state in (APPLIED, NATIVE, STALE):  # STALE: the runtime sync repairs it
            continue
        if report.state == NOT_APPLICABLE:
            if not report.ok:
                plan.skipped.append((patch.id, report.reason))
            continue
        blocked = [r for r in patch.requires if r not in usable and r not in {p.id for p in plan.todo}]
        if blocked:
            plan.skipped.append((patch.id, f"requires {blocked[0]}, which is not applied"))
            continue
        plan.todo.append(patch)
    files = [t.file for p in plan.todo for t in p.targets if session.read(t.file) is not None]
    plan.files = list(dict.fromkeys(files))
    return plan


def _record(session: Session, plan: Plan, outcome: Outcome) -> Record:
    """The record after this apply: patches applied, and per changed file its
    backup and what patchkit wrote (stored as blobs at commit)."""
    record = session.record.copy()
    keep = outcome.keep
    for patch in plan.todo:
        record.applied[patch.id] = [t.file for t in patch.targets if session.read(t.file) is not None]
    for rel, (old, new) in outcome.changed.items():
        entry = record.files.get(rel)
        if entry is None:
            entry = record.files[rel] = FileRecord(keep(old), None)
        elif sha256(old) != entry.patched:
            # Edited since an earlier apply: carry those edits onto the
            # backup too, or a later revert would silently drop them.
            merged = original_with_user_edits(session.tree.path(rel), old, session.blob(entry.patched, rel),
                                              session.blob(entry.original, rel))
            entry.original = keep(merged)
        entry.patched = keep(new)
    return record
