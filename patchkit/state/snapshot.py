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
            path = tree.path(rel)
            try:
                files[rel] = path.read_bytes()
            except FileNotFoundError:
                files[rel] = None
            except OSError as exc:
                raise PatchkitError(f"{path}: cannot read ({exc.strerror})") from None
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
    return Snapshot(tree, MappingProxyType(files), believed, store.pending())
