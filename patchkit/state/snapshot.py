"""A tree read once, for one command.

``read_snapshot`` reads every file patchkit may look at (the target files of
every patch, the runtime folder, the manifest, the files a record names),
the local state, and a transaction a killed run left behind, and decides
which record to believe (``patchkit.state.reconcile``). The result is a value: the
rest of the command plans and transforms from it and never reads the tree
again; only the commit writes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Optional

from patchkit import registry
from patchkit.errors import PatchkitError
from patchkit.layout import IMPORT_ROOT
from patchkit.state import Pending, Store, recovery, sha256, vendoring
from patchkit.state.reconcile import Believed, reconcile
from patchkit.state.record import CorruptState, Record
from patchkit.tree import Tree


@dataclass(frozen=True)
class Snapshot:
    tree: Tree
    files: Mapping[str, Optional[bytes]]  # rel -> bytes (None: no such file)
    believed: Believed
    pending: Optional[Pending]
    unrecorded: Optional[str] = None  # patchkit's work is in the tree, its record is gone (``_unrecorded``)

    @property
    def record(self) -> Record:
        return self.believed.record

    def read(self, rel: str) -> Optional[bytes]:
        try:
            return self.files[rel]
        except KeyError:
            raise KeyError(f"{rel}: not read into the snapshot (add it in patchkit.state.snapshot)") from None

    def sha(self, rel: str) -> Optional[str]:
        data = self.read(rel)
        return None if data is None else sha256(data)

    def notes(self) -> list[str]:
        """Lines about the tree as a whole, for status and verify: a
        transaction a killed run left, leftovers of an earlier base."""
        lines = [] if self.pending is None else [self.pending.line()]
        if self.unrecorded:
            lines.append(self.unrecorded)
        if self.believed.source == "leftovers":
            lines.append(
                f"patchkit's files from sglang {self.believed.leftovers_of} are still here "
                f"({len(self.believed.leftovers)} files: {vendoring.FOLDER}/, manifest included); "
                "`patchkit revert` removes them, `patchkit apply` brings them up to date"
            )
        return lines


def read_snapshot(tree: Tree, store: Store) -> Snapshot:
    files: dict[str, Optional[bytes]] = {}

    def read(rel: str) -> Optional[bytes]:
        if rel not in files:
            try:
                files[rel] = tree.read(rel)
            except OSError as exc:
                raise PatchkitError(f"{tree.path(rel)}: cannot read ({exc.strerror})") from None
        return files[rel]

    patches = registry.all_patches()
    manifest_bytes = read(vendoring.MANIFEST)
    manifest = (
        None if manifest_bytes is None else vendoring.read_manifest(manifest_bytes, str(tree.path(vendoring.MANIFEST)))
    )
    try:
        local, corrupt = store.load(), None
    except CorruptState as exc:
        if manifest is None:
            raise PatchkitError(f"{exc}; `patchkit revert --recover` puts every file back from the backups") from None
        local, corrupt = None, "it cannot be read (not the expected JSON)"
    wanted = {rel for mode in vendoring.MODES for rel in vendoring.runtime_files(patches, mode)}
    on_disk = {
        path.relative_to(tree.package).as_posix()
        for path in tree.path(vendoring.FOLDER).rglob("*")
        if path.is_file() and path.suffix in (".py", ".json")
    }
    recorded = {rel for record in (local, manifest) if record is not None for rel in record.files}
    for rel in sorted({t.file for p in patches for t in p.targets} | wanted | on_disk | recorded):
        read(rel)

    def current_sha(rel: str) -> Optional[str]:
        data = read(rel)
        return None if data is None else sha256(data)

    believed = reconcile(tree.version, local, manifest, current_sha)
    if corrupt:  # the manifest is believed; a command that writes sets the state aside
        believed = dataclasses.replace(believed, disbelieved=corrupt)
    lost = recovery.lost_writes(store, believed.record, current_sha)
    if lost:
        raise PatchkitError(
            f"{tree.path(lost[0])}: holds bytes of an interrupted patchkit run whose journal is gone "
            f"({len(lost)} file(s) so); `patchkit revert --recover` puts every file back from the "
            "backups"
        )
    if believed.source == "manifest":
        # The manifest lists files, not which patch touched which.
        known = {patch.id: patch.files for patch in patches}
        record = believed.record.copy()
        record.applied = {
            pid: [f for f in known[pid] if f in record.files] if pid in known else files
            for pid, files in record.applied.items()
        }
        believed = dataclasses.replace(believed, record=record)
    targets = {t.file for p in patches for t in p.targets}
    unrecorded = _unrecorded(believed, {rel: data for rel, data in files.items() if rel in targets or rel in on_disk})
    return Snapshot(tree, MappingProxyType(files), believed, store.pending(), unrecorded)


def _unrecorded(believed: Believed, files: Mapping[str, Optional[bytes]]) -> Optional[str]:
    """Where no record is left (``.patchkit/`` and the manifest removed), the
    tree may still hold patchkit's work: runtime files with its header, target
    files that import them. What it patched is then no native code: the line
    that says so (None: no such trace)."""
    if believed.source != "none":
        return None
    runtime = [rel for rel, data in files.items() if rel.startswith(f"{vendoring.FOLDER}/") and data]
    ours = [rel for rel in runtime if vendoring.split_header(files[rel] or b"") is not None]
    importing = [rel for rel, data in files.items() if rel not in runtime and data and IMPORT_ROOT.encode() in data]
    if not (ours or importing):
        return None
    return (
        f"patchkit's work is in this tree ({len(ours)} runtime file(s) in {vendoring.FOLDER}/, {len(importing)} "
        f"file(s) importing {IMPORT_ROOT}) but no record of it (.patchkit/state.json and {vendoring.MANIFEST} are "
        "gone): nothing it patched counts as native; restore the files (git checkout, or reinstall the release), "
        "or bring back the record"
    )
