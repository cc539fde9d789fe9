"""plan -> transform -> check -> commit, over one sglang tree.

A ``Session`` holds one tree for one command: it reads and parses each target
file at most once, detects each codemod's state (cached by file hash), and
computes new file contents; ``Store.commit`` writes them as one transaction.
"""

from __future__ import annotations

import copy
import difflib
import os
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional

import libcst as cst
from libcst.codemod import CodemodContext

import patchkit
from patchkit import originals, registry, vendoring
from patchkit.codemods.base import Finding, PatchCodemod, State
from patchkit.codemods.primitives import add_needed_imports
from patchkit.errors import PatchkitError
from patchkit.registry import Patch
from patchkit.state import Store, sha256
from patchkit.tree import Tree, find_tree

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

    def diff(self, tree: Tree) -> str:
        return "".join(unified_diff(tree, rel, old, new) for rel, (old, new) in self.changed.items())


def unified_diff(tree: Tree, rel: str, old: Optional[bytes], new: Optional[bytes]) -> str:
    """A unified diff; a side that is None (no such file) is /dev/null."""
    name = tree.repo_path(rel)
    lines = difflib.unified_diff(
        (old or b"").decode("utf-8", "surrogateescape").splitlines(keepends=True),
        (new or b"").decode("utf-8", "surrogateescape").splitlines(keepends=True),
        f"a/{name}" if old is not None else "/dev/null",
        f"b/{name}" if new is not None else "/dev/null",
    )
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


class Session:
    def __init__(self, tree: Tree, say: Callable[[str], None] = lambda s: None) -> None:
        self.tree = tree
        self.store = Store(tree.state_dir)
        self.say = say
        self._bytes: dict[str, Optional[bytes]] = {}
        self._modules: dict[str, cst.Module] = {}
        self._cache_key = f"patchkit {patchkit.__version__}"
        self._cache = self.store.load_cache(self._cache_key)
        self._cache_dirty = False
        self.state = self.store.load()
        self.from_manifest = False
        if not self.store.has_state():
            self._load_manifest()

    @classmethod
    def open(cls, path: str | Path, say: Callable[[str], None] = lambda s: None) -> "Session":
        return cls(find_tree(path), say)

    # -- reading ---------------------------------------------------------------

    def _load_manifest(self) -> None:
        """A clone of a patched fork: no ``.patchkit`` state, but the tracked
        manifest says what patchkit applied. Backups are recovered on demand."""
        data = self.read(vendoring.MANIFEST)
        if data is None:
            return
        doc = vendoring.read_manifest(data, str(self.tree.path(vendoring.MANIFEST)))
        state = vendoring.state_from_manifest(doc)
        for patch in registry.all_patches():
            if patch.id in state["applied"]:
                state["applied"][patch.id]["files"] = [f for f in patch.files if f in state["files"]]
        self.state, self.from_manifest = state, True

    def blob(self, digest: str, rel: str) -> bytes:
        """Backed-up bytes of ``rel``; in a clone (no backups travel through
        git) recovered from git history or the release, checked by sha256."""
        if not self.store.has_blob(digest) and self.from_manifest:
            data = originals.find(self.tree.path(rel), rel, digest, self.tree.version)
            self.store.put_blob(data)
            return data
        return self.store.get_blob(digest)

    @property
    def runtime_mode(self) -> str:
        return self.state.get("runtime", vendoring.DEFAULT_MODE)

    def runtime_info(self) -> Optional[dict]:
        """The runtime the applied patches use, for status and verify."""
        if not self.state["applied"]:
            return None
        return {
            "mode": self.runtime_mode,
            "api": self.state.get("runtime_api"),
            "patchkit": self.state.get("patchkit", "?"),
            "folder": vendoring.FOLDER,
            "recorded_in": vendoring.MANIFEST if self.from_manifest else ".patchkit/state.json",
        }

    def read(self, rel: str) -> Optional[bytes]:
        if rel not in self._bytes:
            path = self.tree.path(rel)
            try:
                self._bytes[rel] = path.read_bytes()
            except FileNotFoundError:
                self._bytes[rel] = None
            except OSError as exc:
                raise PatchkitError(f"{path}: cannot read ({exc.strerror})") from None
        return self._bytes[rel]

    def module(self, rel: str) -> cst.Module:
        if rel not in self._modules:
            data = self.read(rel)
            try:
                self._modules[rel] = cst.parse_module(data)
            except cst.ParserSyntaxError as exc:
                raise PatchkitError(
                    f"{self.tree.path(rel)}:{exc.raw_line}: syntax error, cannot patch ({exc.message})"
                ) from None
        return self._modules[rel]

    def detect(self, rel: str, codemod: type[PatchCodemod]) -> Finding:
        data = self.read(rel)
        assert data is not None
        for needle in codemod.REQUIRED_TEXT:
            if needle.encode() not in data:
                return Finding.missing(needle, f"{needle} does not occur in the file")
        key = f"{codemod.name()}|{sha256(data)}"
        if key in self._cache:
            state, anchor, detail = self._cache[key]
            return Finding(State(state), anchor, detail)
        finding = codemod().detect(self.module(rel))
        self._remember(key, finding)
        return finding

    def _remember(self, key: str, finding: Finding) -> None:
        self._cache[key] = [finding.state.value, finding.anchor, finding.detail]
        self._cache_dirty = True

    def save_cache(self) -> None:
        # Only trees patchkit already manages get a cache: `status` on a pristine
        # tree leaves no trace.
        if self._cache_dirty and self.store.folder.is_dir() and os.access(self.store.folder, os.W_OK):
            self.store.save_cache(self._cache_key, self._cache)

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
            for codemod in target.codemods:
                report.results.append(CodemodResult(target.file, codemod.name(), self.detect(target.file, codemod)))
        states = {r.finding.state for r in report.results}
        applied_by_us = patch.id in self.state["applied"]
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
        if self._legacy():
            return [LEGACY]
        mine = vendoring.runtime_files([patch], self.runtime_mode)
        # Shared files (package __init__s) carry every applied patch's name.
        wanted = vendoring.runtime_files(self._applied_patches() + [patch], self.runtime_mode)
        reasons = [why for rel in mine if (why := vendoring.stale_reason(rel, self.read(rel), wanted[rel]))]
        if self.runtime_mode == "package":
            installed = vendoring.installed_runtime_api()
            recorded = self.state.get("runtime_api")
            if installed != recorded:
                reasons.append(f"patched against runtime API {recorded}; the installed patchkit runtime provides "
                               + (f"API {installed}" if installed is not None else "none (not importable)"))
        return reasons

    def _legacy(self) -> bool:
        """Patched by patchkit 0.1, whose patched code imports patchkit.runtime."""
        return bool(self.state["applied"]) and "runtime" not in self.state

    def _applied_patches(self, ids: Optional[Iterable[str]] = None) -> list[Patch]:
        ids = set(self.state["applied"] if ids is None else ids)
        return [p for p in registry.all_patches() if p.id in ids]

    def reports(self, patches: Optional[Iterable[Patch]] = None) -> list[PatchReport]:
        result = [self.report(p) for p in (registry.all_patches() if patches is None else patches)]
        self.save_cache()
        return result

    # -- transforming ------------------------------------------------------------

    def transform(self, rel: str, source: bytes, codemods: list[type[PatchCodemod]]) -> bytes:
        """Run ``codemods`` over one file's source; every one must end DONE."""
        on_disk = source == self.read(rel)
        module = self.module(rel) if on_disk else _parse(source, self.tree.path(rel))
        context = CodemodContext(filename=rel)
        instances = [codemod(context) for codemod in codemods]
        for inst in instances:
            # Until a codemod changes the tree, `status` already detected (and
            # cached) each finding for these very bytes: don't detect twice.
            finding = self.detect(rel, type(inst)) if on_disk else inst.detect(module)
            if finding.state is State.MISSING:
                raise PatchkitError(f"{self.tree.path(rel)}: anchor {finding.anchor} missing: {finding.detail}")
            if finding.state is State.TODO:
                module = inst.transform_module(module)
                on_disk = False
        module = add_needed_imports(module, context)
        new = module.bytes
        for inst in instances:
            after = inst.detect(module)
            if after.state not in (State.DONE, State.SUPERSEDED):
                raise PatchkitError(
                    f"{self.tree.path(rel)}: {inst.name()} did not reach its postcondition ({after.anchor}: {after.detail})"
                )
            self._remember(f"{inst.name()}|{sha256(new)}", after)
        try:
            compile(new, str(self.tree.path(rel)), "exec", dont_inherit=True)
        except SyntaxError as exc:  # a codemod bug, never the user's input
            raise PatchkitError(f"{self.tree.path(rel)}:{exc.lineno}: patched code does not compile: {exc.msg}") from None
        return new

    def codemods_for(self, rel: str, patches: Iterable[Patch]) -> list[type[PatchCodemod]]:
        return [c for p in patches for t in p.targets if t.file == rel for c in t.codemods]

    # -- apply -----------------------------------------------------------------

    def apply(self, selected: list[Patch], dry_run: bool = False, runtime: Optional[str] = None) -> Outcome:
        """Apply ``selected``; ``runtime`` (vendored | package) switches the
        runtime mode, default: the tree's mode, or vendored on a fresh tree."""
        mode = runtime or self.runtime_mode
        if mode not in vendoring.MODES:
            raise PatchkitError(f"unknown runtime mode {mode!r} (choose {' or '.join(vendoring.MODES)})")
        if self._legacy():
            raise PatchkitError(f"{self.tree.package}: {LEGACY}")
        reports = {r.patch.id: r for r in self.reports(selected)}
        outcome = Outcome(list(reports.values()))
        usable = {pid for pid, r in reports.items() if r.state in (APPLIED, NATIVE)}
        usable |= {pid for pid in self.state["applied"]}
        todo: list[Patch] = []
        for patch in selected:
            report = reports[patch.id]
            blocked = [r for r in patch.requires if r not in usable and r not in {p.id for p in todo}]
            if report.state in (APPLIED, NATIVE, STALE):  # STALE: the runtime sync below repairs it
                continue
            if report.state == NOT_APPLICABLE:
                if not report.ok:
                    outcome.skipped.append((patch.id, report.reason))
                continue
            if blocked:
                outcome.skipped.append((patch.id, f"requires {blocked[0]}, which is not applied"))
                continue
            todo.append(patch)
        files = [t.file for p in todo for t in p.targets if self.read(t.file) is not None]
        files = list(dict.fromkeys(files))
        self._check_writable(files)
        for rel in files:
            old = self.read(rel)
            new = self.transform(rel, old, self.codemods_for(rel, todo))
            if new != old:
                outcome.changed[rel] = (old, new)
        outcome.done = [p.id for p in todo]
        state = _copy_state(self.state)
        keep = sha256 if dry_run else self.store.put_blob  # a dry run stores no backup
        for patch in todo:
            state["applied"][patch.id] = {"files": [t.file for t in patch.targets if self.read(t.file) is not None]}
        for rel, (old, new) in outcome.changed.items():
            entry = state["files"].get(rel)
            if entry is None:
                entry = state["files"][rel] = {"original": keep(old)}
            elif sha256(old) != entry["patched"]:
                # Edited since an earlier apply: carry those edits onto the
                # backup too, or a later revert would silently drop them.
                entry["original"] = keep(self._original_with_user_edits(rel, old, entry))
            entry["patched"] = keep(new)
        if state["applied"]:
            if mode != self.runtime_mode and self.state["applied"]:
                outcome.messages.append(f"runtime: {self.runtime_mode} -> {mode}")
            state["runtime"], state["runtime_api"], state["patchkit"] = mode, _runtime_api(), patchkit.__version__
            self._sync_runtime(state, self._applied_patches(state["applied"]), mode, outcome, force=True)
        if not dry_run and outcome.changed:
            self._commit(outcome, state)
        self.save_cache()
        return outcome

    def _sync_runtime(self, state: dict, patches: list[Patch], mode: str, outcome: Outcome, force: bool) -> None:
        """Plan the runtime folder and manifest for ``patches`` (those applied
        once this command is done) into ``outcome.changed`` and ``state``.

        A runtime file the user edited is replaced only with ``force`` (apply
        repairs a stale runtime; a copy of the edited file is kept), else the
        command stops, as for edits that overlap a patch."""
        wanted = vendoring.runtime_files(patches, mode)
        ours = [rel for rel, e in state["files"].items() if e["original"] is None]  # runtime files, manifest
        created = [rel for rel in ours if rel != vendoring.MANIFEST]
        folder = self.tree.path(vendoring.FOLDER)
        if not ours and folder.exists():
            raise PatchkitError(
                f"{folder}: exists and was not written by patchkit; refusing to vendor the runtime there "
                "(nothing was changed)"
            )
        for rel in dict.fromkeys([*created, *wanted]):
            current, target = self.read(rel), wanted.get(rel)
            if target is not None and vendoring.stale_reason(rel, current, target) is None:
                continue  # same code (perhaps written by another patchkit version): leave it
            entry = state["files"].get(rel)
            if current is not None and entry is not None and sha256(current) != entry["patched"]:
                path = self.tree.path(rel)
                if not force:
                    raise PatchkitError(
                        f"{path}: runtime file edited after apply; nothing was reverted "
                        "(undo the edits, or pass --force to discard them)"
                    )
                kept = self.store.put_blob(current)
                outcome.messages.append(f"{path}: was edited; replaced by patchkit's runtime (your copy: .patchkit/blobs/{kept})")
            if current != target:
                outcome.changed[rel] = (current, target)
            if target is None:
                state["files"].pop(rel, None)
            else:
                state["files"].setdefault(rel, {"original": None, "patched": None})
                state["files"][rel]["patched"] = sha256(target)
        manifest = None
        if patches:
            manifest = vendoring.manifest_bytes(mode, self.tree.version, [p.id for p in patches], state["files"])
        current = self.read(vendoring.MANIFEST)
        if manifest != current:
            outcome.changed[vendoring.MANIFEST] = (current, manifest)
        if manifest is None:
            state["files"].pop(vendoring.MANIFEST, None)
        else:
            state["files"][vendoring.MANIFEST] = {"original": None, "patched": sha256(manifest)}

    def _commit(self, outcome: Outcome, state: dict) -> None:
        self.store.commit(
            self.tree.package,
            {rel: new for rel, (old, new) in outcome.changed.items()},
            {rel: None if old is None else sha256(old) for rel, (old, new) in outcome.changed.items()},
            state,
        )
        self.state, self.from_manifest = state, False

    def _check_writable(self, files: Iterable[str]) -> None:
        # Checked up front so a read-only file stops the whole run before any
        # write. Mode bits count too: root may write anything, but a file the
        # user marked read-only is not ours to replace (os.replace would).
        for rel in files:
            path = self.tree.path(rel)
            for what, node in (("file", path), ("folder", path.parent)):
                if not os.access(node, os.W_OK) or not node.stat().st_mode & stat.S_IWUSR:
                    raise PatchkitError(f"{path}: read-only {what}, cannot patch (nothing was changed)")

    # -- revert ----------------------------------------------------------------

    def revert(self, ids: list[str], cascade: bool = False, force: bool = False, dry_run: bool = False) -> Outcome:
        applied = [p for p in registry.all_patches() if p.id in self.state["applied"]]
        chosen = {registry.get(i).id for i in ids} if ids else {p.id for p in applied}
        outcome = Outcome([])
        for pid in list(chosen):
            if pid not in self.state["applied"]:
                outcome.skipped.append((pid, "not applied by patchkit"))
                chosen.discard(pid)
        for pid in sorted(chosen):
            for dep in registry.dependents(pid):
                if dep.id in self.state["applied"] and dep.id not in chosen:
                    if not cascade:
                        raise PatchkitError(
                            f"cannot revert {pid}: {dep.id} is applied and requires it (revert {dep.id} too, or pass --cascade)"
                        )
                    chosen.add(dep.id)
        remaining = [p for p in applied if p.id not in chosen]
        files = [f for pid in chosen for f in self.state["applied"][pid]["files"] if f in self.state["files"]]
        files = list(dict.fromkeys(files))
        self._check_writable(files)
        state = _copy_state(self.state)
        for rel in files:
            entry = self.state["files"][rel]
            current = self.read(rel) or b""
            original = self.blob(entry["original"], rel)
            still = self.codemods_for(rel, remaining)
            target = self.transform(rel, original, still) if still else original
            if sha256(current) != entry["patched"]:
                target = self._merge_user_edits(rel, current, entry, target, force, outcome)
            if target != current:
                outcome.changed[rel] = (current, target)
            if still:
                state["files"][rel]["patched"] = self.store.put_blob(target)
            else:
                del state["files"][rel]
        for pid in chosen:
            del state["applied"][pid]
        if chosen:
            self._sync_runtime(state, remaining, self.runtime_mode, outcome, force=force)
            if not state["applied"]:
                for key in ("runtime", "runtime_api", "patchkit"):
                    state.pop(key, None)
        outcome.done = sorted(chosen, key=lambda pid: [p.id for p in applied].index(pid))
        if not dry_run and chosen:
            self._commit(outcome, state)
        return outcome

    def _original_with_user_edits(self, rel: str, current: bytes, entry: dict) -> bytes:
        original = self.blob(entry["original"], rel)
        merged, clean = three_way_merge(current, self.blob(entry["patched"], rel), original)
        if not clean:
            raise PatchkitError(
                f"{self.tree.path(rel)}: edited after an earlier apply, overlapping patched code; "
                "revert (or undo the edits) before applying more patches to it"
            )
        return merged

    def _merge_user_edits(self, rel: str, current: bytes, entry: dict, target: bytes, force: bool, outcome: Outcome) -> bytes:
        """The file changed since patchkit wrote it: carry the user's edits onto
        the reverted text with a 3-way merge (base = what patchkit wrote)."""
        path = self.tree.path(rel)
        patched = self.blob(entry["patched"], rel)
        merged, clean = three_way_merge(current, patched, target)
        if clean:
            outcome.messages.append(f"{path}: kept your edits made after apply (3-way merge)")
            return merged
        if force:
            kept = self.store.put_blob(current)
            outcome.messages.append(f"{path}: your edits conflicted; --force discarded them (copy kept in .patchkit/blobs/{kept})")
            return target
        raise PatchkitError(
            f"{path}: edited after apply and the edits overlap the patch; nothing was reverted "
            "(resolve by hand, or pass --force to discard the edits)"
        )

    # -- diff ------------------------------------------------------------------

    def diff_against_original(self) -> str:
        out = []
        # Changed files first, then the ones patchkit added (as apply lists them).
        for rel, entry in sorted(self.state["files"].items(), key=lambda item: (item[1]["original"] is None, item[0])):
            original = None if entry["original"] is None else self.blob(entry["original"], rel)
            out.append(unified_diff(self.tree, rel, original, self.read(rel)))
        return "".join(out)


def three_way_merge(ours: bytes, base: bytes, theirs: bytes) -> tuple[bytes, bool]:
    """``git merge-file``: git's own 3-way merge, the one vendors already trust."""
    if shutil.which("git") is None:
        raise PatchkitError("git is needed to keep edits made after apply (3-way merge), and it is not installed")
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for name, data in (("ours", ours), ("base", base), ("theirs", theirs)):
            p = Path(tmp) / name
            p.write_bytes(data)
            paths.append(str(p))
        proc = subprocess.run(["git", "merge-file", "-p", *paths], capture_output=True)
    if proc.returncode < 0 or proc.returncode > 127:
        raise PatchkitError(f"git merge-file failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout, proc.returncode == 0


def _parse(source: bytes, path: Path) -> cst.Module:
    try:
        return cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        raise PatchkitError(f"{path}:{exc.raw_line}: syntax error ({exc.message})") from None


def _copy_state(state: dict) -> dict:
    return copy.deepcopy(state)


def _runtime_api() -> int:
    return vendoring.RUNTIME_API


class locked_session:
    """Open a tree for one command: take its lock, finish any transaction a
    killed run left behind, then load state. Read-only trees (an installed
    site-packages one cannot write) are inspected without a lock."""

    def __init__(self, path: str | Path, say: Callable[[str], None], timeout: float = 60.0, write: bool = True) -> None:
        self.tree = find_tree(path)
        self.say, self.timeout, self.write = say, timeout, write
        self._lock = None

    def __enter__(self) -> Session:
        store = Store(self.tree.state_dir)
        # Read-only commands on a tree patchkit never touched need no lock (and
        # must not create .patchkit there).
        if self.write or (store.folder.is_dir() and os.access(store.folder, os.W_OK)):
            self._lock = store.locked(float(os.environ.get("PATCHKIT_LOCK_TIMEOUT", self.timeout)))
            self._lock.__enter__()
            store.recover(self.tree.package, self.say)
        return Session(self.tree, self.say)

    def __exit__(self, *exc) -> None:
        if self._lock is not None:
            self._lock.__exit__(*exc)
