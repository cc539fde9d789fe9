"""Reading one sglang tree for one command: what each patch's state is.

A command runs as read -> fetch -> plan -> transform -> commit.
``locked_session`` reads the tree once into a ``Snapshot`` (``patchkit.state.snapshot``:
its files, the record of what patchkit did that agrees with the tree, a
pending transaction) and wraps it in a ``Session``, the read side: each
codemod's finding (cached by file hash in ``.patchkit/cache.json``) and the
patch reports. ``status`` and ``verify`` need nothing more. A session never
writes the tree and never transforms: the commands that change it hand its
values (files, findings, parsed modules) down to ``patchkit.transform.transformer``
and plan and commit beside it (``patchkit.api.applying``, ``patchkit.api.reverting``, with
``patchkit.api.commit``: the runtime folder, the write check, the transaction;
``patchkit.api.merge``: a user's edits).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from patchkit import registry
from patchkit.errors import PatchkitError
from patchkit.findings import Finding, State
from patchkit.registry import Patch
from patchkit.results import (
    ABSENT,
    APPLIED,
    LEGACY,
    NATIVE,
    NOT_APPLICABLE,
    PARTIAL,
    STALE,
    CodemodResult,
    PatchReport,
    unified_diff,
)
from patchkit.state import Store, originals, sha256, vendoring
from patchkit.state.record import Record
from patchkit.state.snapshot import Snapshot, read_snapshot
from patchkit.transform.detection import Detection
from patchkit.tree import find_tree

if TYPE_CHECKING:
    from patchkit.transform.detection import CodemodRef


class Session:
    def __init__(self, snapshot: Snapshot, store: Store) -> None:
        self.snapshot = snapshot
        self.tree = snapshot.tree
        self.record: Record = snapshot.record
        self.store = store
        # The transform package, reached through its one door: findings (the
        # detection cache), parsed modules, the audit's counts.
        self.detection = Detection(self.tree.package, store.load_cache)
        self.findings = self.detection.findings  # handed down to the transform step, which adds to them
        self.modules = self.detection.modules  # parsed files, by the sha256 of their bytes (the same)
        self._saved = self.detection.learnt.copy()
        self.recovered: dict[str, bytes] = {}  # backups a clone recovered, by sha256 (``blob``)
        # What the commit writes (``api.commit``'s outcome), for an interrupt to report once
        # ``store.committed`` says the transaction is whole, wherever the signal lands.
        self.writing: object = None

    # -- reading ---------------------------------------------------------------

    def read(self, rel: str) -> Optional[bytes]:
        return self.snapshot.read(rel)

    def blob(self, digest: str, rel: str) -> bytes:
        """Backed-up bytes of ``rel``; in a clone (no backups travel through
        git) recovered from git history or the release, checked by sha256.
        Reading writes nothing: a recovered backup is kept by the session,
        stored by the commit or when the command ends well."""
        if digest in self.recovered:
            return self.recovered[digest]
        stored = self.store.read_blob(digest, missing_ok=self.snapshot.believed.source != "state")
        if stored is not None:
            return stored
        data = self.recovered[digest] = originals.find(self.tree, rel, digest)
        return data

    def sources(self, patches: Iterable[Patch]) -> dict[str, bytes]:
        """The bytes of ``patches``' target files that the tree has."""
        return {t.file: data for p in patches for t in p.targets if (data := self.read(t.file)) is not None}

    def read_for_revert(
        self, files: Iterable[str]
    ) -> tuple[dict[str, bytes], dict[str, tuple[bytes, bytes]], dict[str, bytes]]:
        """What a revert reads before it transforms, for each of ``files``
        (all patched by patchkit): its bytes now, the edits since apply (as
        ``edited_since_apply``), and its backup (a clone recovers it)."""
        files = list(files)
        current = {rel: self.read(rel) or b"" for rel in files}
        edited = self.edited_since_apply(files)
        backups = {rel: edited[rel][1] if rel in edited else self.backup(rel) for rel in files}
        return current, edited, backups

    def edited_since_apply(self, files: Iterable[str]) -> dict[str, tuple[bytes, bytes]]:
        """Of ``files``, those patchkit patched that were edited since:
        rel -> (the bytes patchkit wrote, the backup)."""
        return {rel: (self.written(rel), self.backup(rel)) for rel in self.edited_files(files)}

    def edited_files(self, files: Iterable[str]) -> list[str]:
        """Of ``files``, those patchkit patched whose bytes are no longer what
        it wrote. A file removed since counts as edited (to empty), as
        revert's merge sees it."""
        entries = self.record.files
        return [
            rel
            for rel in files
            if rel in entries and entries[rel].patched and sha256(self.read(rel) or b"") != entries[rel].patched
        ]

    def backup(self, rel: str) -> bytes:
        """The bytes of ``rel`` (a file patchkit patched, not one it created)
        before patchkit: its backup."""
        return self._blob_of(self.record.files[rel].original, rel)

    def written(self, rel: str) -> bytes:
        """The bytes patchkit wrote to ``rel``, from its blobs."""
        return self._blob_of(self.record.files[rel].patched, rel)

    def _blob_of(self, digest: Optional[str], rel: str) -> bytes:
        if digest is None:  # the record has no such bytes: a file patchkit created, or never wrote
            raise PatchkitError(f"{self.tree.path(rel)}: patchkit keeps no such backup of it (corrupt state?)")
        return self.blob(digest, rel)

    @property
    def runtime_mode(self) -> str:
        return self.record.runtime or vendoring.DEFAULT_MODE

    def runtime_info(self) -> Optional[dict]:
        """The runtime the applied patches use, for status and verify."""
        if not self.record.applied:
            return None
        return {
            "mode": self.runtime_mode,
            "api": self.record.runtime_api,
            "patchkit": self.record.patchkit or "?",
            "folder": vendoring.FOLDER,
            "recorded_in": ".patchkit/state.json" if self.snapshot.believed.source == "state" else vendoring.MANIFEST,
        }

    def detect(self, rel: str, codemod: "CodemodRef") -> Finding:
        """``codemod`` (a class, or its ``module:Class`` reference) on the file
        as it is on disk (``Detection.finding``: cached where it can be)."""
        data = self.read(rel)
        assert data is not None
        return self.detection.finding(rel, data, codemod)

    def keep_learnt(self) -> None:
        """Keep what the session learnt, when its command ends well: the
        backups it recovered (the next command need not recover them again)
        and its findings."""
        if self.recovered:
            self.store.put_blobs(self.recovered.values())
        self.save_cache()

    def save_cache(self) -> None:
        self.detection.shared.flush()
        # Only trees patchkit already manages get a cache: `status` on a pristine
        # tree leaves no trace.
        learnt = self.detection.learnt
        if learnt != self._saved and self.store.folder.is_dir() and os.access(self.store.folder, os.W_OK):
            self.store.save_cache(self.detection.cache_key, learnt.to_json())
            self._saved = learnt.copy()

    def audit_problems(self) -> int:
        """How many reads of the CPU mirror ``patchkit audit`` finds unguarded or stale."""
        return self.detection.audit_problems()

    def vendor_problems(self, targets: Iterable[str], release_own: Iterable[str] = ()) -> int:
        """How many of those reads are in the vendor's own code."""
        return self.detection.vendor_problems(targets, release_own)

    # -- status ----------------------------------------------------------------

    def report(self, patch: Patch) -> PatchReport:
        """``patch``'s state on the tree, made once: each target's findings,
        the state and reason they give, and the notes (a frozen value)."""
        results: list[CodemodResult] = []
        notes: list[str] = []
        for target in patch.targets:
            if self.read(target.file) is None:
                if target.optional:
                    notes.append(f"{target.file}: not applicable here ({target.why_missing(self.tree.release)})")
                    continue
                results.append(CodemodResult(target.file, "-", Finding.missing(target.file, "file not in this tree")))
                continue
            for ref in target.refs:  # classes or module:Class references, imported only on a cache miss
                name = registry.codemod_name(ref)
                results.append(CodemodResult(target.file, name, self.detect(target.file, ref)))
        applied_by_us = patch.id in self.record.applied
        state, reason = _state_of(results, applied_by_us, self._written_by_others(patch))
        if state == NATIVE and (self.snapshot.pending or self.snapshot.unrecorded):
            # Not the release's code: a killed run's half-written files, or patchkit's work without its record.
            state, reason = (
                PARTIAL,
                "patched by patchkit, not native: "
                + (self.snapshot.pending.line() if self.snapshot.pending else "its record is gone (see above)"),
            )
        # Parts a fork does its own way: said once, with where and why.
        notes.extend(dict.fromkeys(f"{r.finding.anchor}: {r.finding.detail}" for r in results if r.finding.by_tree))
        if applied_by_us and state != APPLIED:
            notes.append("recorded as applied by patchkit, but the tree no longer has all of it")
        if state == APPLIED:
            stale = self._stale_runtime(patch)
            if stale:
                state, reason = STALE, "; ".join(stale)
        return PatchReport(patch, state, reason, tuple(results), tuple(notes))

    def _written_by_others(self, patch: Patch) -> frozenset[tuple[str, str]]:
        """(file, codemod module) that another patch patchkit applied here lists too: what
        that one wrote (perhaps through a sibling class of the module, as verify_tree_mask_fits'
        release variants) is no part of ``patch`` (issue 69: a refused patch is absent, not partial)."""
        others = [p for p in registry.all_patches() if p.id != patch.id and p.id in self.record.applied]
        return frozenset(
            (t.file, _module(registry.codemod_name(ref))) for p in others for t in p.targets for ref in t.refs
        )

    def _stale_runtime(self, patch: Patch) -> list[str]:
        """Runtime files of ``patch`` that differ from what this patchkit writes."""
        if not patch.runtime:
            return []
        if self.record.legacy:
            return [LEGACY]
        mine = vendoring.runtime_files([patch], self.runtime_mode)
        # Shared files (package __init__s) carry every applied patch's name.
        wanted = vendoring.runtime_files(self.applied_patches() + [patch], self.runtime_mode)
        reasons = [why for rel in mine if (why := vendoring.stale_reason(rel, self.read(rel), wanted[rel]))]
        if self.runtime_mode == "package":
            installed = vendoring.installed_runtime_api()
            recorded = self.record.runtime_api
            if installed != recorded:
                reasons.append(
                    f"patched against runtime API {recorded}; the installed patchkit runtime provides "
                    + (f"API {installed}" if installed is not None else "none (not importable)")
                )
        return reasons

    def applied_patches(self, ids: Optional[Iterable[str]] = None) -> list[Patch]:
        ids = set(self.record.applied if ids is None else ids)
        return [p for p in registry.all_patches() if p.id in ids]

    def reports(self, patches: Optional[Iterable[Patch]] = None) -> list[PatchReport]:
        result = [self.report(p) for p in (registry.all_patches() if patches is None else patches)]
        self.save_cache()
        return result

    # -- diff ------------------------------------------------------------------

    def diff_against_original(self) -> str:
        out = []
        # Changed files first, then the ones patchkit added (as apply lists them).
        for rel, entry in sorted(self.record.files.items(), key=lambda item: (item[1].original is None, item[0])):
            original = None if entry.original is None else self.blob(entry.original, rel)
            out.append(unified_diff(self.tree, rel, original, self.read(rel)))
        return "".join(out)


class locked_session:
    """Open a tree for one command. A command that writes (``verb``: apply or
    revert) takes the tree's lock, settles a transaction a killed run left
    behind (the same command finishes it, the other rolls it back) and sets
    aside local state that disagrees with the tree. A read command (no verb)
    writes nothing of the work tree: it reports what it finds instead, and
    takes the lock only where ``.patchkit`` already exists (so that it reads
    no half-written state)."""

    def __init__(self, path: str | Path, say: Callable[[str], None], verb: Optional[str] = None) -> None:
        from patchkit import settings

        self.tree = find_tree(path)
        self.say, self.verb = say, verb
        self.timeout = settings.lock_timeout()
        self._lock: Optional[AbstractContextManager[None]] = None
        self._session: Optional[Session] = None

    def __enter__(self) -> Session:
        store = Store(self.tree.state_dir)
        if self.verb or (store.folder.is_dir() and os.access(store.folder, os.W_OK)):
            self._lock = store.locked(self.timeout)
            self._lock.__enter__()
        try:
            return self._open(store)
        except BaseException as exc:  # __exit__ does not run: a caller in this process must get the lock back
            self.__exit__(type(exc), exc, exc.__traceback__)
            raise

    def _open(self, store: Store) -> Session:
        if self.verb:
            store.recover(self.verb, self.tree.package, self.say)
        session = self._session = Session(read_snapshot(self.tree, store), store)
        why = session.snapshot.believed.disbelieved
        if why and self.verb and store.has_state():
            kept = store.set_aside()
            self.say(
                f"local state .patchkit/state.json set aside ({why}): kept as "
                f".patchkit/{kept.relative_to(store.folder)}; the tree was read afresh"
            )
        elif why:
            self.say(
                f"note: local state .patchkit/state.json is not believed ({why}); the tree was read "
                "instead (the next apply or revert sets it aside)"
            )
        return session

    def __exit__(self, *exc) -> None:
        try:
            if exc[0] is None and self._session is not None:
                # What the command learnt (findings by file hash) is kept when it
                # ends well; a command that failed or was interrupted keeps nothing.
                self._session.keep_learnt()
        finally:
            if self._lock is not None:
                self._lock.__exit__(*exc)


def _module(codemod: str) -> str:
    """``module`` of a codemod's name, ``module.Class``."""
    return codemod.rpartition(".")[0] or codemod


def _state_of(
    results: list[CodemodResult], applied_by_us: bool, by_others: frozenset[tuple[str, str]] = frozenset()
) -> tuple[str, str]:
    """A patch's state and its reason, from its codemods' ``results`` (``applied_by_us``:
    patchkit recorded it as applied; ``by_others``: (file, codemod) another applied patch wrote)."""
    states = {r.finding.state for r in results}
    moot = next((r for r in results if r.finding.moots_patch), None)
    if moot is not None:  # what the patch changes never runs here: its other sites do not matter
        return NOT_APPLICABLE, f"{moot.file}: {moot.finding.detail}"
    if State.MISSING in states:
        first = next(r for r in results if r.finding.state is State.MISSING)
        # A missing file's anchor is its path, and a detail that starts with FILE:LINE names it: named once.
        anchor = "" if first.finding.anchor == first.file else f"{first.finding.anchor}: "
        where, detail = first.file, first.finding.detail
        if detail.startswith(f"{where}:") and (line := detail[len(where) + 1 :].split(":", 1)[0]).isdigit():
            where, detail = f"{where}:{line}", detail[len(where) + len(line) + 2 :].lstrip()
        return NOT_APPLICABLE, f"{where}: {anchor}{detail}"
    if states <= {State.SUPERSEDED}:
        return NOT_APPLICABLE, "; ".join(sorted({r.finding.detail for r in results})) or "no targets in this tree"
    if states <= {State.DONE, State.SUPERSEDED}:
        return (APPLIED if applied_by_us else NATIVE), ""
    if states <= {State.TODO, State.SUPERSEDED}:
        return ABSENT, ""
    own = {r.finding.state for r in results if (r.file, _module(r.codemod)) not in by_others}
    if not applied_by_us and own <= {State.TODO, State.SUPERSEDED}:  # only what other patches wrote is done
        return ABSENT, ""
    todo = [r for r in results if r.finding.state is State.TODO]
    return PARTIAL, "still to do: " + ", ".join(f"{r.file}: {r.finding.anchor}" for r in todo)
