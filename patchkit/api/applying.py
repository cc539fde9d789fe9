"""``patchkit apply``: plan -> transform -> check -> commit.

Plan: which selected patches still need applying (status of each, ``requires``
honoured). Transform: each touched file once, with the codemods of every patch
to apply (``Transformer.run`` checks each codemod's postcondition and that
the result compiles). Check: the postconditions patches declare, on the tree
as it would be written (``patchkit.api.checking``); every file writable, edits
made since an earlier apply carried onto the backup. Commit: backups, state,
the runtime folder and manifest, written as one transaction.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Optional
from collections.abc import Callable

import patchkit
from patchkit import fetch, git, registry
from patchkit.api import checking
from patchkit.api.checking import Transformed
from patchkit.api.commit import Outcome, commit
from patchkit.api.merge import original_with_user_edits
from patchkit.engine import Session
from patchkit.errors import PatchkitError
from patchkit.registry import Patch
from patchkit.results import APPLIED, LEGACY, NATIVE, NOT_APPLICABLE, STALE, PatchReport
from patchkit.state import vendoring
from patchkit.state.record import FileRecord, Record
from patchkit.transform.transformer import Transformer
from patchkit.transform.vendor_code import VendorCodeLost

if TYPE_CHECKING:
    from patchkit.transform.parallel import Progress
    from patchkit.tree import Tree


@dataclass
class Plan:
    reports: dict[str, PatchReport]
    todo: list[Patch] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (patch id, why)
    files: list[str] = field(default_factory=list)  # target files of ``todo`` present in the tree


def apply_patches(session: Session, selected: list[Patch], dry_run: bool = False, runtime: Optional[str] = None,
                  progress: Optional["Progress"] = None, accept_vendor_code_risk: bool = False,
                  say: Callable[[str], None] = lambda line: None) -> Outcome:
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
    # Read: the target files' bytes. Fetch and prepare:
    # every file's detection and transform ahead, in parallel or from the
    # transform cache (this seeds the findings the plan's reports read).
    sources = session.sources(selected)
    pristine = fetch.release_sources(tree.version, sources, sources, download=True,
                                     accept_risk=accept_vendor_code_risk, say=say)
    transformer = Transformer(tree, session.findings, session.modules, sources, pristine,
                              risk_accepted=accept_vendor_code_risk)
    # The postconditions of the patches selected or applied before; their head start goes to the workers.
    applied = set(record.applied)
    checks = checking.declared(registry.all_patches(), applied | {p.id for p in selected})
    transformer.prepare(selected, progress, checking.head_start(checks, tree))
    # Plan; then, before any transform, what the plan's files need: edits made
    # since an earlier apply (a clone may recover backups). The commit checks
    # the runtime mode's rules and that every file to change is writable.
    plan = plan_apply(session.reports(selected), selected, applied, sources)
    # Transform and check: a patch a check refuses (api/checking.py) is not written, nor those that require it.
    done = checking.refuse_until_checks_hold(tree, plan.todo, applied, checks,
                                             lambda todo: _transform_refusing(transformer, todo, sources), pristine)
    changed, skipped = done.changed, plan.skipped + done.skipped
    if not dry_run:  # a refusal names the line of the file as this apply leaves it on disk
        skipped = [(pid, checking.lines_after(why, sources, changed)) for pid, why in skipped]
    plan = replace(plan, todo=done.todo, skipped=skipped, files=_files(done.todo, sources))
    edited = session.edited_since_apply(plan.files)
    outcome = Outcome(list(plan.reports.values()), done=[p.id for p in plan.todo], skipped=plan.skipped)
    for rel, new in changed.items():
        outcome.changed[rel] = (sources[rel], new)
    outcome.messages.extend(transformer.notes)  # vendor code replaced on purpose, or its check skipped
    outcome.release_own = sorted(rel for rel in outcome.changed if pristine.get(rel) == sources[rel])
    base_commit = record.base_commit or git.head(tree.package)  # what the patches are applied on
    new_record = _record(tree, record, plan, outcome, changed, sources, edited)
    runtime_patches: Optional[list[Patch]] = None  # the runtime folder is planned for these (None: left as it is)
    if new_record.applied:
        if mode != session.runtime_mode and record.applied:
            outcome.messages.append(f"runtime: {session.runtime_mode} -> {mode}")
        new_record.runtime, new_record.runtime_api, new_record.patchkit = mode, vendoring.RUNTIME_API, patchkit.__version__
        # What the record was made on: a record of another release is never believed (patchkit.state.reconcile).
        new_record.sglang, new_record.base_commit = tree.version, base_commit
        runtime_patches = [p for p in registry.all_patches() if p.id in new_record.applied]
    commit(session, "apply", outcome, new_record, runtime_patches, force=True, dry_run=dry_run, mode_check=True)
    return outcome  # the session keeps what it learnt (its findings) when the command ends


def plan_apply(reports: list[PatchReport], selected: list[Patch], applied: set[str], sources: dict[str, bytes]) -> Plan:
    """Which of ``selected`` to apply now (their ``reports`` say each one's
    state; ``applied``: what patchkit applied before), which to skip and why."""
    plan = Plan({r.patch.id: r for r in reports})
    usable = {pid for pid, r in plan.reports.items() if r.state in (APPLIED, NATIVE)} | applied
    for patch in selected:
        report = plan.reports[patch.id]
        if report.state in (APPLIED, NATIVE, STALE):  # STALE: the runtime sync repairs it
            continue
        if report.state == NOT_APPLICABLE:
            if not report.ok:
                plan.skipped.append((patch.id, refused_anchor(patch.id, report.reason)))
            continue
        blocked = [r for r in patch.requires if r not in usable and r not in {p.id for p in plan.todo}]
        if blocked:
            plan.skipped.append((patch.id, f"requires {blocked[0]}, which is not applied"))
            continue
        plan.todo.append(patch)
    plan.files = _files(plan.todo, sources)
    return plan


def refused_anchor(pid: str, reason: str) -> str:
    """A patch whose anchor this tree lacks, in one line: why, and what the maintainer can do."""
    what = "restore that file" if reason.endswith("file not in this tree") else "give that code the shape the patch needs"
    return f"refused: {reason}; {what}, or `--skip {pid}` (the other patches still apply)"


def _transform_refusing(transformer: Transformer, todo: list[Patch], sources: dict[str, bytes]) -> Transformed:
    """The files of ``todo`` transformed (rel -> new bytes, those that
    change). A patch the vendor-code check refuses is taken out, with the
    patches that require it, each skipped with its one-line reason; the
    others are transformed again without it (one refusal never blocks the rest)."""
    notes = list(transformer.notes)
    skipped: list[tuple[str, str]] = []
    while True:
        try:
            return Transformed(todo, transformer.transform_files(_files(todo, sources), todo), skipped)
        except VendorCodeLost as exc:
            if exc.patch is None or exc.patch not in {p.id for p in todo}:
                raise  # not one patch's doing (the import block): the whole apply stops
            transformer.notes[:] = notes  # what the refused attempt noted no longer holds
            skipped.append((exc.patch, f"{exc.site}; {exc.remedy}"))
            out = {exc.patch}
            for patch in todo:  # in order: a patch comes after those it requires
                if patch.id not in out and any(r in out for r in patch.requires):
                    skipped.append((patch.id, f"requires {next(r for r in patch.requires if r in out)}, "
                                              "which was refused"))
                    out.add(patch.id)
            todo = [p for p in todo if p.id not in out]


def _files(todo: list[Patch], sources: dict[str, bytes]) -> list[str]:
    return list(dict.fromkeys(t.file for p in todo for t in p.targets if t.file in sources))


def _record(tree: "Tree", record: Record, plan: Plan, outcome: Outcome, changed: dict[str, bytes],
            sources: dict[str, bytes], edited: dict[str, tuple[bytes, bytes]]) -> Record:
    """The record after this apply: patches applied, and per file it changes
    (``changed``: its new bytes) its backup and what patchkit wrote (stored as
    blobs of ``outcome`` at commit). ``edited``: files changed since an
    earlier apply -> (what patchkit wrote, backup)."""
    record = record.copy()
    keep = outcome.keep
    for patch in plan.todo:
        record.applied[patch.id] = [t.file for t in patch.targets if t.file in sources]
    for rel, new in changed.items():
        old = sources[rel]
        entry = record.files.get(rel)
        if entry is None:
            entry = record.files[rel] = FileRecord(keep(old), None)
        elif rel in edited:
            # Edited since an earlier apply: carry those edits onto the
            # backup too, or a later revert would silently drop them.
            entry.original = keep(original_with_user_edits(tree.path(rel), old, *edited[rel]))
        entry.patched = keep(new)
    return record
