"""``patchkit revert``: plan -> transform -> check -> commit.

Plan: the patches to revert (dependents refused, or added with ``cascade``).
Transform: each of their files goes back to its backup, re-patched with the
patches that stay. Check: a file edited since apply keeps the edits (3-way
merge) or stops the run. Commit: files, runtime folder and state in one
transaction; nothing of patchkit's is left once the last patch goes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

from patchkit import fetch, registry
from patchkit.api.commit import Outcome, commit
from patchkit.api.merge import keep_user_edits
from patchkit.engine import Session
from patchkit.errors import PatchkitError
from patchkit.registry import Patch
from patchkit.state.record import Record
from patchkit.transform.transformer import Transformer
from patchkit.tree import sha256


@dataclass(frozen=True)
class RevertPlan:
    chosen: frozenset[str]  # the patch ids to revert
    skipped: tuple[tuple[str, str], ...]  # (patch id, why): asked for, not applied by patchkit


def revert_patches(
    session: Session, ids: list[str], cascade: bool = False, force: bool = False, dry_run: bool = False
) -> Outcome:
    """Revert ``ids`` (every applied patch when empty)."""
    plan = plan_revert(session.record, registry.all_patches(), ids, cascade)
    applied = session.applied_patches()
    remaining = [p for p in applied if p.id not in plan.chosen]
    files = [f for pid in plan.chosen for f in session.record.applied[pid] if f in session.record.files]
    files = list(dict.fromkeys(files))
    again = {t.file for p in remaining for t in p.targets}  # files the remaining patches re-patch
    # Read and fetch, before any transform: each file now, its backup and
    # (edited since apply) what patchkit wrote, which a clone may recover
    # from git history or the release; the release's bytes for the files
    # the remaining patches re-patch.
    current, edited, original = session.read_for_revert(files)
    pristine = fetch.release_sources(session.tree, [rel for rel in files if rel in again])
    transformer = Transformer(session.tree, session.findings, session.modules, pristine=pristine)
    record = session.record.copy()
    changed: dict[str, tuple[Optional[bytes], Optional[bytes]]] = {}
    messages: list[str] = []
    blobs: dict[str, bytes] = {}
    for rel in files:
        target = transformer.run(rel, original[rel], remaining).new if rel in again else original[rel]
        if rel in edited:
            merged = keep_user_edits(session.tree.path(rel), current[rel], edited[rel][0], target, force)
            target = merged.data
            messages.append(merged.message)
            blobs.update(merged.blobs)
        if target != current[rel]:
            changed[rel] = (current[rel], target)
        if rel in again:
            record.files[rel].patched = sha256(target)
            blobs[sha256(target)] = target
        else:
            del record.files[rel]
    for pid in plan.chosen:
        del record.applied[pid]
    # Leftovers of an earlier base (a runtime folder and manifest, no patch
    # applied to this release) go with a plain `revert` too.
    leftovers = not ids and session.snapshot.believed.source == "leftovers"
    if leftovers:
        messages.append(f"removed patchkit's files left from sglang {session.snapshot.believed.leftovers_of}")
    order = [p.id for p in applied]
    outcome = Outcome([], changed, sorted(plan.chosen, key=order.index), list(plan.skipped), messages, blobs=blobs)
    if plan.chosen or leftovers:
        return commit(session, "revert", outcome, record, remaining, force=force, dry_run=dry_run)
    return outcome


def plan_revert(record: Record, patches: Sequence[Patch], ids: list[str], cascade: bool) -> RevertPlan:
    """The patch ids to revert: those asked for that patchkit applied, plus
    (with ``cascade``) the applied patches that require them (``patches``:
    every patch known, in registry order); those asked for that patchkit
    did not apply are skipped."""
    applied = record.applied
    chosen = {registry.by_id(i).id for i in ids} if ids else set(applied)
    skipped = tuple((pid, "not applied by patchkit") for pid in sorted(chosen - set(applied)))
    chosen &= set(applied)
    for pid in sorted(chosen):
        for dep in dependents(pid, patches):
            if dep.id in applied and dep.id not in chosen:
                if not cascade:
                    raise PatchkitError(
                        f"cannot revert {pid}: {dep.id} is applied and requires it (revert {dep.id} too, or pass --cascade)"
                    )
                chosen.add(dep.id)
    return RevertPlan(frozenset(chosen), skipped)


def dependents(pid: str, patches: Sequence[Patch]) -> list[Patch]:
    """Of ``patches`` (in registry order), those that require ``pid``,
    directly or through others."""
    out: list[Patch] = []
    for patch in patches:
        if pid in patch.requires or any(d.id in patch.requires for d in out):
            out.append(patch)
    return out
