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

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Union
from collections.abc import Callable, Iterable

import patchkit
from patchkit import registry, transform
from patchkit.transform import cache as transform_cache
from patchkit.state import originals
from patchkit.state import vendoring
from patchkit.findings import Finding, State
from patchkit.results import ABSENT, APPLIED, LEGACY, NATIVE, NOT_APPLICABLE, PARTIAL, STALE, CodemodResult, PatchReport, unified_diff
from patchkit.state.record import Record
from patchkit.registry import Patch
from patchkit.state.snapshot import Snapshot, read_snapshot
from patchkit.state import Store, sha256
from patchkit.tree import base_release, find_tree

if TYPE_CHECKING:  # libcst and the codemods are imported only when a file must be parsed
    import libcst as cst

    from patchkit.codemods.common.base import PatchCodemod

    CodemodRef = Union[type[PatchCodemod], str]

class Session:
    def __init__(self, snapshot: Snapshot, store: Store) -> None:
        self.snapshot = snapshot
        self.tree = snapshot.tree
        self.record: Record = snapshot.record
        self.store = store
        # Handed down to the transform step (``patchkit.transform.transformer``), which adds to both.
        self.modules: dict[str, cst.Module] = {}  # parsed files, by the sha256 of their bytes
        # Findings are the code's verdicts: a patchkit whose codemods changed (same version or not)
        # must not trust an earlier one's, so the key is the transform cache's code fingerprint.
        self._cache_key = f"patchkit {patchkit.__version__} {transform_cache.fingerprint()[:16]}"
        self.findings: dict[str, list] = store.load_cache(self._cache_key)  # "codemod|sha256" -> finding
        self._saved = dict(self.findings)
        self.shared = transform_cache.SharedFindings(transform_cache.default_folder())
        self.recovered: dict[str, bytes] = {}  # backups a clone recovered, by sha256 (``blob``)

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
        if self.store.has_blob(digest) or self.snapshot.believed.source == "state":
            return self.store.get_blob(digest)
        data = self.recovered[digest] = originals.find(self.tree.path(rel), rel, digest, self.tree.version)
        return data

    def sources(self, patches: Iterable[Patch]) -> dict[str, bytes]:
        """The bytes of ``patches``' target files that the tree has."""
        return {t.file: data for p in patches for t in p.targets if (data := self.read(t.file)) is not None}

    def read_for_revert(self, files: Iterable[str]) -> tuple[dict[str, bytes], dict[str, tuple[bytes, bytes]], dict[str, bytes]]:
        """What a revert reads before it transforms, for each of ``files``
        (all patched by patchkit): its bytes now, the edits since apply (as
        ``edited_since_apply``), and its backup (a clone recovers it)."""
        current = {rel: self.read(rel) or b"" for rel in files}
        edited = self.edited_files(files)
        backups = self.backups(files, edited)
        return current, {rel: backups[rel] for rel in edited}, {rel: backups[rel][-1] for rel in files}

    def edited_since_apply(self, files: Iterable[str]) -> dict[str, tuple[bytes, bytes]]:
        """Of ``files``, those patchkit patched that were edited since:
        rel -> (the bytes patchkit wrote, the backup)."""
        edited = self.edited_files(files)
        return self.backups(edited, edited)

    def edited_files(self, files: Iterable[str]) -> list[str]:
        """Of ``files``, those patchkit patched whose bytes are no longer what
        it wrote. A file removed since counts as edited (to empty), as
        revert's merge sees it."""
        entries = self.record.files
        return [rel for rel in files if rel in entries and entries[rel].patched
                and sha256(self.read(rel) or b"") != entries[rel].patched]

    def backups(self, files: Iterable[str], edited: list[str]) -> dict[str, tuple[bytes, ...]]:
        """rel -> the backup of each of ``files`` (patched by patchkit), after
        (for those ``edited`` since apply) the bytes patchkit wrote."""
        out = {}
        for rel in files:
            entry = self.record.files[rel]
            digests = (entry.patched, entry.original) if rel in edited else (entry.original,)
            out[rel] = tuple(self.blob(digest, rel) for digest in digests)
        return out

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

    def module(self, rel: str) -> "cst.Module":
        data = self.read(rel)
        digest = sha256(data)
        if digest not in self.modules:
            self.modules[digest] = transform.parse(data, self.tree.path(rel))
        return self.modules[digest]

    def detect(self, rel: str, codemod: "CodemodRef") -> Finding:
        """``codemod`` (a class, or its ``module:Class`` reference) on the file
        as it is on disk. A cached finding (what detection gave for these very
        bytes) needs neither libcst nor the codemod module."""
        data = self.read(rel)
        assert data is not None
        key = f"{registry.codemod_name(codemod)}|{sha256(data)}"
        cached = self.findings.get(key)
        # An entry from before findings had lines (4 items) is detected again
        # where verify would show its line (todo, missing).
        if cached is not None and (len(cached) > 4 or cached[0] in (State.DONE.value, State.SUPERSEDED.value)):
            return Finding.from_list(cached)
        shared = transform_cache.cacheable([codemod])
        if shared:
            found = self.shared.get(rel, sha256(data), registry.codemod_name(codemod))
            with contextlib.suppress(ValueError, TypeError, KeyError, IndexError):
                if found is not None and len(found) > 4:
                    finding = Finding.from_list(found)
                    self.findings[key] = found
                    return finding
        finding = transform.detect(rel, data, lambda: self.module(rel), registry.load_codemod(codemod))
        self.findings[key] = finding.as_list()
        if shared:
            self.shared.add(rel, sha256(data), registry.codemod_name(codemod), finding.as_list())
        return finding

    def keep_learnt(self) -> None:
        """Keep what the session learnt, when its command ends well: the
        backups it recovered (the next command need not recover them again)
        and its findings."""
        if self.recovered:
            self.store.put_blobs(self.recovered.values())
        self.save_cache()

    def save_cache(self) -> None:
        self.shared.flush()
        # Only trees patchkit already manages get a cache: `status` on a pristine
        # tree leaves no trace.
        if self.findings != self._saved and self.store.folder.is_dir() and os.access(self.store.folder, os.W_OK):
            self.store.save_cache(self._cache_key, self.findings)
            self._saved = dict(self.findings)

    def audit_problems(self) -> int:
        """How many reads of the CPU mirror ``patchkit audit`` finds unguarded
        or stale. Cached like the findings, by the audited files' bytes: the
        audit parses every module under srt/ that mentions the mirror, which would triple the time of ``verify``."""
        from patchkit import audit

        key = f"audit|{audit.fingerprint(self.tree.package)}"
        if key not in self.findings:
            self.findings[key] = len(audit.audit_tree(self.tree.package).problems)
        return self.findings[key]

    def vendor_problems(self, targets: Iterable[str], release_own: Iterable[str] = ()) -> int:
        """How many of those reads are in the vendor's own code
        (``audit.vendor_problems``; ``targets``: the files patchkit's patches
        change; ``release_own``: files this apply changed that were their
        release's bytes before, so hold no vendor code). Cached like
        ``audit_problems``: a warm ``apply`` would otherwise spend most of its
        time auditing a tree it did not change."""
        from patchkit import audit
        from patchkit.transform.cache import Entry, TransformCache

        targets, sources = sorted(set(targets)), audit.sources(self.tree.package)
        release_own = sorted(set(release_own))
        # ``release_own`` is not in the key: it only spares parsing files whose
        # reads are patchkit's or the release's, never the vendor's (same count).
        key = f"vendor|{audit.fingerprint(self.tree.package, sources)}|{sha256(chr(0).join(targets).encode())}"
        if key not in self.findings:
            # Shared by every tree like a transform (a fresh copy of a release,
            # patched, has the same bytes), under patchkit's code fingerprint too.
            shared = TransformCache.default()
            entry = shared.get(shared_key := shared.key(key, []))
            count = entry.before.get("vendor_problems") if entry is not None else None
            if not isinstance(count, int):
                found = audit.audit_tree(self.tree.package, sources=sources, vendor_only=True, release_own=release_own)
                count = len(audit.vendor_problems(found, targets))
                shared.put(shared_key, Entry({"vendor_problems": count}, []))
            self.findings[key] = count
        return self.findings[key]

    # -- status ----------------------------------------------------------------

    def report(self, patch: Patch) -> PatchReport:
        report = PatchReport(patch, ABSENT)
        for target in patch.targets:
            if self.read(target.file) is None:
                if target.optional:
                    report.notes.append(f"{target.file}: not applicable here ({target.why_missing(base_release(self.tree.version))})")
                    continue
                report.results.append(
                    CodemodResult(target.file, "-", Finding.missing(target.file, "file not in this tree"))
                )
                continue
            for ref in target.refs:  # classes or module:Class references, imported only on a cache miss
                name = registry.codemod_name(ref)
                report.results.append(CodemodResult(target.file, name, self.detect(target.file, ref)))
        states = {r.finding.state for r in report.results}
        applied_by_us = patch.id in self.record.applied
        moot = next((r for r in report.results if r.finding.moots_patch), None)
        if moot is not None:  # what the patch changes never runs here: its other sites do not matter
            report.state, report.reason = NOT_APPLICABLE, f"{moot.file}: {moot.finding.detail}"
        elif State.MISSING in states:
            first = report.missing[0]
            report.state = NOT_APPLICABLE
            # A missing file's anchor is its path, and a detail that starts with FILE:LINE names it: named once.
            anchor = "" if first.finding.anchor == first.file else f"{first.finding.anchor}: "
            where, detail = first.file, first.finding.detail
            if detail.startswith(f"{where}:") and (line := detail[len(where) + 1:].split(":", 1)[0]).isdigit():
                where, detail = f"{where}:{line}", detail[len(where) + len(line) + 2:].lstrip()
            report.reason = f"{where}: {anchor}{detail}"
        elif states <= {State.SUPERSEDED}:
            report.state = NOT_APPLICABLE
            report.reason = "; ".join(sorted({r.finding.detail for r in report.results})) or "no targets in this tree"
        elif states <= {State.DONE, State.SUPERSEDED}:
            report.state = APPLIED if applied_by_us else NATIVE
        elif states <= {State.TODO, State.SUPERSEDED}:
            report.state = ABSENT
        else:
            report.state = PARTIAL
            todo = [r for r in report.results if r.finding.state is State.TODO]
            report.reason = "still to do: " + ", ".join(f"{r.file}: {r.finding.anchor}" for r in todo)
        # Parts a fork does its own way: said once, with where and why.
        report.notes.extend(dict.fromkeys(f"{r.finding.anchor}: {r.finding.detail}" for r in report.results if r.finding.by_tree))
        if applied_by_us and report.state != APPLIED:
            report.notes.append("recorded as applied by patchkit, but the tree no longer has all of it")
        if report.state == APPLIED:
            stale = self._stale_runtime(patch)
            if stale:
                report.state, report.reason = STALE, "; ".join(stale)
        return report

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
                reasons.append(f"patched against runtime API {recorded}; the installed patchkit runtime provides "
                               + (f"API {installed}" if installed is not None else "none (not importable)"))
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
        self._lock = None
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
            self.say(f"local state .patchkit/state.json set aside ({why}): kept as "
                     f".patchkit/{kept.relative_to(store.folder)}; the tree was read afresh")
        elif why:
            self.say(f"note: local state .patchkit/state.json is not believed ({why}); the tree was read "
                     "instead (the next apply or revert sets it aside)")
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
