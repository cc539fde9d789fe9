"""Reading one sglang tree for one command: what each patch's state is, and
what a file becomes.

A command runs as read -> plan -> transform -> commit. ``locked_session``
reads the tree once into a ``Snapshot`` (``patchkit.snapshot``: its files, the
record of what patchkit did that agrees with the tree, a pending transaction)
and wraps it in a ``Session``, which adds what a command computes from it:
each codemod's finding (cached by file hash in ``.patchkit/cache.json``), the
patch reports, and new file contents (``transform``, per file by the pure
``patchkit.transform``, prepared in parallel by ``patchkit.parallel``). A
session never writes the tree. The commands that change it plan and commit
beside it: ``patchkit.apply`` and ``patchkit.revert``, with
``patchkit.commit`` (the runtime folder, the write check, the transaction)
and ``patchkit.merge`` (a user's edits).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Optional, Union

import patchkit
from patchkit import originals, registry, transform, vendoring
from patchkit.findings import Finding, State
from patchkit.record import Record
from patchkit.registry import Patch
from patchkit.snapshot import Snapshot, read_snapshot
from patchkit.state import Store, sha256
from patchkit.transform_cache import Entry, TransformCache
from patchkit.tree import Tree, find_tree

if TYPE_CHECKING:  # libcst and the codemods are imported only when a file must be parsed
    import libcst as cst

    from patchkit.codemods.base import PatchCodemod

    CodemodRef = Union[type[PatchCodemod], str]

# Patch-level states, as `status` prints them. STALE: applied, but the runtime
# code vendored for it is not what this patchkit writes (`apply` updates it).
ABSENT, APPLIED, NATIVE, PARTIAL, NOT_APPLICABLE = "absent", "applied", "native", "partial", "not-applicable"
STALE = "stale"
LEGACY = ("patched by patchkit 0.1 (the patched code imports patchkit.runtime): run `patchkit revert`, "
          "then `patchkit apply` to vendor the runtime into the tree")


@dataclass
class CodemodResult:
    file: str
    codemod: str
    finding: Finding


@dataclass
class PatchReport:
    patch: Patch
    state: str
    reason: str = ""
    results: list[CodemodResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Does the tree have this change (or legitimately not need it)?"""
        if self.state in (APPLIED, NATIVE):
            return True
        # Upstream moved on (e.g. removed the code): nothing to carry.
        return self.state == NOT_APPLICABLE and all(r.finding.state is State.SUPERSEDED for r in self.results)

    @property
    def missing(self) -> list[CodemodResult]:
        return [r for r in self.results if r.finding.state is State.MISSING]


@dataclass
class Outcome:
    """What an apply or revert did (or, dry, would do)."""

    reports: list[PatchReport]
    # file -> (old, new); None: the file does not exist (created / removed)
    changed: dict[str, tuple[Optional[bytes], Optional[bytes]]] = field(default_factory=dict)
    done: list[str] = field(default_factory=list)  # patch ids applied/reverted now
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (patch id, why)
    messages: list[str] = field(default_factory=list)
    # Backups and kept copies, stored by sha256 at commit (a dry run stores none).
    blobs: dict[str, bytes] = field(default_factory=dict)

    def keep(self, data: bytes) -> str:
        digest = sha256(data)
        self.blobs[digest] = data
        return digest

    def diff(self, tree: Tree) -> str:
        return "".join(unified_diff(tree, rel, old, new) for rel, (old, new) in self.changed.items())


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


class Session:
    def __init__(self, snapshot: Snapshot, store: Store) -> None:
        self.snapshot = snapshot
        self.tree = snapshot.tree
        self.record: Record = snapshot.record
        self.store = store
        self._modules: dict[str, cst.Module] = {}
        self._cache_key = f"patchkit {patchkit.__version__}"
        self._cache = store.load_cache(self._cache_key)
        self._cache_dirty = False
        self.transform_cache = TransformCache.default()
        self._prepared: dict[str, tuple[str, Entry]] = {}  # rel -> (sha256 of its source, entry)
        self.last_transformed: list[str] = []  # codemods the last transform() ran, in order
        self.notes: list[str] = []  # what transforms report (vendor code replaced on purpose, a check skipped)
        self._pristine: dict[str, Optional[bytes]] = {}

    # -- reading ---------------------------------------------------------------

    def read(self, rel: str) -> Optional[bytes]:
        return self.snapshot.read(rel)

    def blob(self, digest: str, rel: str) -> bytes:
        """Backed-up bytes of ``rel``; in a clone (no backups travel through
        git) recovered from git history or the release, checked by sha256."""
        if not self.store.has_blob(digest) and self.snapshot.believed.source != "state":
            data = originals.find(self.tree.path(rel), rel, digest, self.tree.version)
            self.store.put_blob(data)
            return data
        return self.store.get_blob(digest)

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
        if rel not in self._modules:
            self._modules[rel] = transform.parse(self.read(rel), self.tree.path(rel))
        return self._modules[rel]

    def detect(self, rel: str, codemod: "CodemodRef") -> Finding:
        """``codemod`` (a class, or its ``module:Class`` reference) on the file
        as it is on disk. A cached finding (what detection gave for these very
        bytes) needs neither libcst nor the codemod module."""
        data = self.read(rel)
        assert data is not None
        key = f"{registry.codemod_name(codemod)}|{sha256(data)}"
        if key in self._cache:
            return Finding.from_list(self._cache[key])
        finding = transform.detect(rel, data, lambda: self.module(rel), registry.load_codemod(codemod))
        self._remember(key, finding)
        return finding

    def _remember(self, key: str, finding: Finding) -> None:
        self._cache[key] = finding.as_list()
        self._cache_dirty = True

    def save_cache(self) -> None:
        # Only trees patchkit already manages get a cache: `status` on a pristine
        # tree leaves no trace.
        if self._cache_dirty and self.store.folder.is_dir() and os.access(self.store.folder, os.W_OK):
            self.store.save_cache(self._cache_key, self._cache)

    def audit_problems(self) -> int:
        """How many reads of the CPU mirror ``patchkit audit`` finds unguarded
        or stale. Cached like the findings, by the audited files' bytes: the
        audit parses every module under srt/ that mentions the mirror, which would triple the time of ``verify``."""
        from patchkit import audit

        key = f"audit|{audit.fingerprint(self.tree.package)}"
        if key not in self._cache:
            self._cache[key] = len(audit.audit_tree(self.tree.package).problems)
            self._cache_dirty = True
        return self._cache[key]

    # -- status ----------------------------------------------------------------

    def report(self, patch: Patch) -> PatchReport:
        report = PatchReport(patch, ABSENT)
        for target in patch.targets:
            if self.read(target.file) is None:
                if target.optional:
                    report.notes.append(f"{target.file}: not applicable here ({target.when_missing or 'file not in this tree'})")
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
        if State.MISSING in states:
            first = report.missing[0]
            report.state = NOT_APPLICABLE
            report.reason = f"{first.file}: {first.finding.anchor}: {first.finding.detail}"
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

    # -- transforming ------------------------------------------------------------

    def transform(self, rel: str, source: bytes, codemods: list["CodemodRef"]) -> bytes:
        """Run ``codemods`` over one file's source; every one must end DONE."""
        prepared = self.prepared(rel, source, codemods)
        if prepared is not None:
            return prepared
        on_disk = source == self.read(rel)
        module = self.module(rel) if on_disk else transform.parse(source, self.tree.path(rel))
        classes = [registry.load_codemod(codemod) for codemod in codemods]
        # `status` already detected (and cached) each finding for the bytes on disk: don't detect twice.
        known = [self.detect(rel, c) for c in classes] if on_disk else []
        result = transform.run(rel, self.tree.path(rel), module, classes, known, source, self.pristine(rel))
        for line in result.notes:
            self._note(line)
        digest = sha256(result.new)
        for name, finding in result.after.items():
            self._remember(f"{name}|{digest}", finding)
        self.last_transformed = result.transformed
        return result.new

    def pristine(self, rel: str) -> Optional[bytes]:
        """``rel`` as the tree's release ships it, located (never downloaded)
        before any transform, for the vendor-code check (``patchkit.vendor_code``)."""
        if rel not in self._pristine:
            from patchkit import vendor_code

            self._pristine[rel] = data = vendor_code.pristine_source(self.tree.version, rel)
            if data is None and vendor_code.is_release(self.tree.version):
                self._note(vendor_code.release_note(self.tree.version))
        return self._pristine[rel]

    def _note(self, line: str) -> None:
        if line not in self.notes:
            self.notes.append(line)

    def codemods_for(self, rel: str, patches: Iterable[Patch]) -> list["CodemodRef"]:
        """The codemods (classes or ``module:Class`` references, imported when
        ``transform`` must run them) of ``patches`` for one file, in order."""
        return [c for p in patches for t in p.targets if t.file == rel for c in t.refs]

    # -- preparing: every file's detection and transform, before the plan ------

    def prepare(self, patches: Iterable[Patch]) -> None:
        """Detect and transform, per target file, with the codemods of all
        ``patches`` (grouped by patch): from the shared transform cache, or in
        parallel processes (``patchkit.parallel``). Findings seed the detection
        cache; ``transform`` then uses a result where it is exactly what it
        would compute itself. Files whose findings are all cached and none is
        TODO need nothing."""
        from patchkit import parallel

        files: dict[str, list[list]] = {}
        for patch in patches:
            for target in patch.targets:
                if self.read(target.file) is not None:
                    files.setdefault(target.file, []).append(list(target.refs))
        need = {}
        for rel, groups in files.items():
            digest = sha256(self.read(rel))
            known = [self._cache.get(f"{registry.codemod_name(r)}|{digest}") for g in groups for r in g]
            if any(k is None or k[0] == State.TODO.value for k in known):
                need[rel] = groups
        jobs = {rel: (self.tree.path(rel), self.read(rel), groups, self.pristine(rel)) for rel, groups in need.items()}
        for rel, entry in parallel.prepare(jobs, self.transform_cache).items():
            digest = sha256(self.read(rel))
            for name, finding in entry.before.items():
                self._cache.setdefault(f"{name}|{digest}", finding)
            if entry.new is not None:
                new_digest = sha256(entry.new)
                for name, finding in (entry.after or {}).items():
                    self._cache[f"{name}|{new_digest}"] = finding
            self._cache_dirty = True
            self._prepared[rel] = (digest, entry)

    def prepared(self, rel: str, source: bytes, codemods: list) -> Optional[bytes]:
        """The prepared result of ``transform(rel, source, codemods)``, where it
        is provably the same: the same bytes, ``codemods`` a subset of those the
        preparation ran (so their postconditions were checked) and containing,
        in the same order, every codemod that changed the file there (so the
        same edits happen in the same order)."""
        hit = self._prepared.get(rel)
        if hit is None or hit[1].new is None or hit[0] != sha256(source):
            return None
        entry = hit[1]
        # A codemod two patches share (e.g. one draft-worker edit of FA3's and
        # FlashMLA's spec-v2) is listed twice but changes the file once: its
        # first place is where it acts, the second finds it done (were it to
        # act again, ``entry.transformed`` would name it twice: no match).
        names = list(dict.fromkeys(registry.codemod_name(c) for c in codemods))
        ran = {n for group in entry.groups for n in group}
        if not set(names) <= ran or [n for n in names if n in entry.transformed] != list(entry.transformed):
            return None
        self.last_transformed = list(entry.transformed)
        for line in entry.notes:
            self._note(line)
        return entry.new

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

    def __enter__(self) -> Session:
        store = Store(self.tree.state_dir)
        if self.verb or (store.folder.is_dir() and os.access(store.folder, os.W_OK)):
            self._lock = store.locked(self.timeout)
            self._lock.__enter__()
        if self.verb:
            store.recover(self.verb, self.tree.package, self.say)
        session = Session(read_snapshot(self.tree, store), store)
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
        if self._lock is not None:
            self._lock.__exit__(*exc)
