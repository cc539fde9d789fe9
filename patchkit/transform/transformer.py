"""The transform step of apply, revert and export: what each file becomes.

A command that writes runs read -> fetch -> plan -> transform -> commit. The
read side (``patchkit.engine.Session``) hands down values: the files' bytes,
its findings (``FindingKey(codemod, sha256) -> Finding``, the detection cache) and its
parsed modules; the fetch step (``patchkit.fetch.release_sources``) the
release's bytes of each file, for the vendor-code check, fetched before any
transform (never inside one). A ``Transformer`` is built from those values and
knows no session: ``prepare`` computes every file's detection and transform
ahead (in parallel, or from the shared transform cache: ``patchkit.transform.parallel``),
``run`` gives one file's new bytes, using a prepared result where it is
provably the same as the serial path's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, NamedTuple, Optional, TypeVar

from patchkit import registry, transform
from patchkit.detection_cache import FindingKey
from patchkit.findings import Finding, State
from patchkit.transform.cache import Entry, TransformCache
from patchkit.tree import sha256

if TYPE_CHECKING:
    from pathlib import Path

    import libcst as cst

    from patchkit.registry import Patch
    from patchkit.transform.checks import Check
    from patchkit.transform.parallel import Progress
    from patchkit.tree import Tree


def codemods_for(rel: str, patches: Iterable["Patch"]) -> list:
    """The codemods (classes or ``module:Class`` references, imported when a
    transform must run them) of ``patches`` for one file, in order."""
    return [c for p in patches for t in p.targets if t.file == rel for c in t.refs]


T = TypeVar("T")


class Ran(NamedTuple, Generic[T]):
    """What a transform gives back: its result, and the notes it made (one line each)."""

    new: T
    notes: tuple[str, ...]


@dataclass
class Transformer:
    tree: "Tree"
    findings: dict[FindingKey, Finding]  # the read side's detection cache; results' findings are added
    modules: dict[str, "cst.Module"]  # parsed files, by the sha256 of their bytes
    sources: dict[str, bytes] = field(
        default_factory=dict
    )  # apply's target files as read: what prepare and transform_files work on
    pristine: dict[str, Optional[bytes]] = field(default_factory=dict)  # the fetch step's release bytes, by file
    risk_accepted: bool = False  # the fetch step downloaded nothing, by the user's choice (its note says so)
    cache: TransformCache = field(default_factory=TransformCache.default)  # shared by every tree of the user
    _prepared: dict[str, tuple[str, Entry]] = field(default_factory=dict)  # rel -> (sha256 of its source, entry)

    def named(self, rel: str) -> "Path":
        """The file ``rel`` as messages name it. The transform reads and
        writes no file (its bytes were read, and its path checked, through
        ``Tree.path``), so it checks no path again."""
        return self.tree.package / rel

    def release_bytes(self, rel: str) -> Optional[bytes]:
        """``rel`` as the tree's release ships it (the fetch step put it in
        ``pristine``). None: not in patchkit's cache, or not a release; a
        file transformed without it skips the vendor-code check
        (``release_notes`` says so)."""
        if rel not in self.pristine:
            raise KeyError(f"{rel}: its release bytes were not fetched before the transform")
        return self.pristine[rel]

    def release_notes(self, files: Iterable[str]) -> tuple[str, ...]:
        """The note that the vendor-code check was skipped, where one of
        ``files`` has no release bytes (said once); else none."""
        if all(self.release_bytes(rel) is not None for rel in files):
            return ()
        from patchkit.fetch import release_note

        known = self.tree.release is not None or self.risk_accepted
        note = release_note(self.tree.version, self.risk_accepted) if known else None
        return (note,) if note else ()

    def prepare(
        self,
        patches: Iterable["Patch"],
        progress: Optional["Progress"] = None,
        checks: Sequence["Check"] = (),
    ) -> tuple[str, ...]:
        """Detect and transform, per file of ``sources``, with the codemods of
        all ``patches`` (grouped by patch). Findings seed ``findings``; files
        whose findings are all known and none is TODO need nothing.
        ``checks``: the postconditions to check after the transform
        (``checks.declared``), whose head start goes to the worker
        processes, when files are computed there (``parallel.prepare``).
        Returns the notes of the files it prepared (``release_notes``)."""
        from patchkit.transform import parallel
        from patchkit.transform.checks import head_start

        start = head_start(list(checks), self.tree)

        sources = self.sources
        files: dict[str, list[list]] = {}
        for patch in patches:
            for target in patch.targets:
                if target.file in sources:
                    files.setdefault(target.file, []).append(list(target.refs))
        need = {}
        for rel, groups in files.items():
            digest = sha256(sources[rel])
            known = [self.findings.get(FindingKey(registry.codemod_name(r), digest)) for g in groups for r in g]
            if any(k is None or k.state is State.TODO for k in known):
                need[rel] = groups
        jobs = {rel: (self.named(rel), sources[rel], groups, self.release_bytes(rel)) for rel, groups in need.items()}
        for rel, entry in parallel.prepare(jobs, self.cache, progress, start).items():
            digest = sha256(sources[rel])
            for name, finding in entry.before.items():
                self.findings.setdefault(FindingKey(name, digest), finding)
            if entry.new is not None:
                new_digest = sha256(entry.new)
                for name, finding in (entry.after or {}).items():
                    self.findings[FindingKey(name, new_digest)] = finding
            self._prepared[rel] = (digest, entry)
        return self.release_notes(need)

    def transform_files(self, files: Iterable[str], patches: Sequence["Patch"]) -> Ran[dict[str, bytes]]:
        """Each of ``files`` (of ``sources``, their release bytes fetched)
        transformed with the codemods of ``patches``: the files it changes,
        with their new bytes, and the notes of their runs."""
        out: dict[str, bytes] = {}
        notes: list[str] = []
        for rel in files:
            new, said = self.run(rel, self.sources[rel], patches)
            notes.extend(said)
            if new != self.sources[rel]:
                out[rel] = new
        return Ran(out, tuple(dict.fromkeys(notes)))

    def transform_prefixes(
        self,
        originals: dict[str, bytes],
        steps: list[tuple[str, int]],
        patches: list["Patch"],
        progress: Optional["Progress"] = None,
    ) -> dict[tuple[str, int], bytes]:
        """Export's transforms: for each step ``(rel, k)``, the file's original
        with ``patches[: k + 1]``, as ``run`` computes it. Taken from the
        transform cache apply fills (a file's last step is usually apply's own
        key), else computed in parallel; where the preparation left a patch
        group out or failed, ``run`` does it and raises the precise error."""
        from patchkit.transform import parallel

        def groups(rel: str, k: int) -> list[list]:
            return [list(t.refs) for p in patches[: k + 1] for t in p.targets if t.file == rel]

        jobs = [(rel, (self.named(rel), originals[rel], groups(rel, k), self.release_bytes(rel))) for rel, k in steps]
        out = {}
        for (rel, k), (_, job), entry in zip(steps, jobs, parallel.prepare_all(jobs, self.cache, progress)):
            whole = [[registry.codemod_name(r) for r in g] for g in job[2]]
            if entry is not None and entry.new is not None and entry.groups == whole:
                out[rel, k] = entry.new  # every group ran, in order: the serial path's codemods over the same bytes
            else:
                out[rel, k] = self.run(rel, originals[rel], patches[: k + 1]).new
        return out

    def run(self, rel: str, source: bytes, patches: Sequence["Patch"]) -> Ran[bytes]:
        """Run ``patches``' codemods for the file ``rel`` over its ``source``;
        every one must end DONE. The file's release bytes must have been
        fetched (``pristine``). Its new bytes, and the notes of the run: the
        vendor code a codemod replaces on purpose, or its check skipped."""
        codemods = codemods_for(rel, patches)
        prepared = self._use_prepared(rel, source, codemods)
        if prepared is not None:
            return prepared
        digest = sha256(source)
        # Which patch each codemod is of (a codemod two patches share: the first), for messages.
        owners: dict[str, str] = {}
        for patch in patches:
            for name in (registry.codemod_name(c) for t in patch.targets if t.file == rel for c in t.refs):
                owners.setdefault(name, patch.id)
        # Findings already detected for these very bytes need no second detection.
        known = [self.findings.get(FindingKey(registry.codemod_name(c), digest)) for c in codemods]
        if all(k is not None and k.state in (State.DONE, State.SUPERSEDED) for k in known):
            return Ran(source, ())  # every change is there (a file a patch to apply leaves as it is): nothing to parse
        pristine = self.release_bytes(rel)
        classes = [registry.load_codemod(codemod) for codemod in codemods]
        path = self.named(rel)
        module = self.modules.get(digest) or transform.parse_for(rel, source, path, classes, pristine)
        result = transform.run(rel, path, module, classes, known, source, pristine, owners)
        new_digest = sha256(result.new)
        for name, finding in result.after.items():
            self.findings[FindingKey(name, new_digest)] = finding
        return Ran(result.new, (*self.release_notes([rel]), *result.notes))

    def _use_prepared(self, rel: str, source: bytes, codemods: list) -> Optional[Ran[bytes]]:
        """The prepared result of ``run(rel, source, codemods)``, where it is
        provably the same: the same bytes, ``codemods`` a subset of those the
        preparation ran (so their postconditions were checked) and containing,
        in the same order, every codemod that changed the file there (so the
        same edits happen in the same order)."""
        hit = self._prepared.get(rel)
        if hit is None or hit[0] != sha256(source):
            return None
        entry = hit[1]
        if entry.new is None:
            return None
        # A codemod two patches share (e.g. one draft-worker edit of FA3's and
        # FlashMLA's spec-v2) is listed twice but changes the file once: its
        # first place is where it acts, the second finds it done (were it to
        # act again, ``entry.transformed`` would name it twice: no match).
        names = list(dict.fromkeys(registry.codemod_name(c) for c in codemods))
        ran = {n for group in entry.groups for n in group}
        if not set(names) <= ran or [n for n in names if n in entry.transformed] != list(entry.transformed):
            return None
        return Ran(entry.new, tuple(entry.notes))
