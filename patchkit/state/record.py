"""What patchkit did to a tree, as one typed value.

A ``Record`` says which patches are applied and, per file patchkit wrote, the
sha256 of its bytes before (None: patchkit created it) and after. It is kept
in two places that must agree (``patchkit.state.reconcile``): the local
``.patchkit/state.json`` (with the backups) and the tracked manifest
``srt/_patchkit/manifest.json``. Both are written from a ``Record`` and read
back into one here; no other module reads their JSON keys. Every path and
sha256 they name is checked as it is read (``patchkit.tree``: paths inside the package): a file
that names a path outside the package is refused, never followed.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Optional

from patchkit.errors import PatchkitError
from patchkit.layout import FOLDER
from patchkit.tree import digest, relative

STATE_FORMAT = 1


class CorruptState(PatchkitError):
    """``state.json`` is not the JSON patchkit writes: the manifest, where
    there is one, is believed instead (``patchkit.state.snapshot``)."""


MANIFEST_SCHEMA = "patchkit.manifest/1"


@dataclass
class FileRecord:
    original: Optional[str]  # sha256 before patchkit; None: patchkit created the file
    patched: Optional[str]  # sha256 of what patchkit wrote


@dataclass
class Record:
    applied: dict[str, list[str]] = field(default_factory=dict)  # patch id -> its target files in the tree
    files: dict[str, FileRecord] = field(default_factory=dict)
    runtime: Optional[str] = None  # vendored | package (None: nothing applied, or patchkit 0.1)
    runtime_api: Optional[int] = None
    patchkit: Optional[str] = None  # the patchkit version that applied
    sglang: Optional[str] = None  # the release the record was made on
    base_commit: Optional[str] = None  # the fork's commit the patches were first applied on

    def copy(self) -> "Record":
        return copy.deepcopy(self)

    @property
    def empty(self) -> bool:
        return not self.applied and not self.files

    @property
    def legacy(self) -> bool:
        """Applied by patchkit 0.1, whose patched code imports patchkit.runtime."""
        return bool(self.applied) and self.runtime is None

    def changed(self) -> dict[str, FileRecord]:
        """Files patchkit patched (it has their originals)."""
        return {rel: f for rel, f in self.files.items() if f.original is not None}

    def created(self) -> list[str]:
        """Files patchkit created: the runtime folder and the manifest."""
        return [rel for rel, f in self.files.items() if f.original is None]

    def forget_runtime(self) -> None:
        """Nothing is applied any more: no runtime, no base commit."""
        self.runtime = self.runtime_api = self.patchkit = self.base_commit = None

    # -- .patchkit/state.json ----------------------------------------------------

    def to_state(self) -> dict:
        doc: dict = {
            "format": STATE_FORMAT,
            "applied": {pid: {"files": list(files)} for pid, files in self.applied.items()},
            "files": {rel: {"original": f.original, "patched": f.patched} for rel, f in self.files.items()},
        }
        for key in ("runtime", "runtime_api", "patchkit", "sglang", "base_commit"):
            if getattr(self, key) is not None:
                doc[key] = getattr(self, key)
        return doc

    @classmethod
    def from_state(cls, doc: dict, where: str) -> "Record":
        try:
            if doc["format"] > STATE_FORMAT:
                raise PatchkitError(
                    f"{where}: written by a newer patchkit (state format {doc['format']}); upgrade patchkit"
                )
            return cls(
                applied={
                    pid: [relative(rel, where) for rel in entry["files"]] for pid, entry in doc["applied"].items()
                },
                files={
                    relative(rel, where): _file(rel, f["original"], f["patched"], where)
                    for rel, f in doc["files"].items()
                },
                runtime=doc.get("runtime"),
                runtime_api=doc.get("runtime_api"),
                patchkit=doc.get("patchkit"),
                sglang=doc.get("sglang"),
                base_commit=doc.get("base_commit"),
            )
        except (KeyError, TypeError, AttributeError):
            raise CorruptState(f"{where}: corrupt patchkit state (not the expected JSON)") from None

    # -- srt/_patchkit/manifest.json (tracked) -------------------------------------

    def to_manifest(self, manifest_rel: str) -> dict:
        return {
            "schema": MANIFEST_SCHEMA,
            "patchkit": self.patchkit,
            "runtime": self.runtime,
            "runtime_api": self.runtime_api,
            "sglang": self.sglang,
            "base_commit": self.base_commit,
            "patches": list(self.applied),
            "files": {
                rel: {"before": f.original, "after": f.patched}
                for rel, f in sorted(self.files.items())
                if rel != manifest_rel
            },
        }

    @classmethod
    def from_manifest(cls, doc: dict, where: str) -> "Record":
        """A clone's record: patch files are filled in by the caller (the
        manifest lists files, not which patch touched which)."""
        try:
            if doc["schema"] != MANIFEST_SCHEMA:
                raise PatchkitError(f"{where}: unknown manifest schema {doc['schema']!r}; upgrade patchkit")
            return cls(
                applied={pid: [] for pid in doc["patches"]},
                files={
                    relative(rel, where): _file(rel, f["before"], f["after"], where) for rel, f in doc["files"].items()
                },
                runtime=doc["runtime"],
                runtime_api=doc.get("runtime_api"),
                patchkit=doc.get("patchkit", "?"),
                sglang=doc.get("sglang"),
                base_commit=doc.get("base_commit"),
            )
        except (KeyError, TypeError, AttributeError):
            raise PatchkitError(f"{where}: corrupt patchkit manifest (not the expected JSON)") from None


def _file(rel: object, original: object, patched: object, where: str) -> FileRecord:
    """One file's entry as ``where`` gave it, checked: a path inside the
    package, two sha256s; a file patchkit created (no original) lies in its
    runtime folder, the only place it creates files. A manifest that called
    a release file created made revert delete it."""
    entry = FileRecord(digest(original, where), digest(patched, where))
    if entry.original is None and not relative(rel, where).startswith(f"{FOLDER}/"):
        raise PatchkitError(
            f"{where}: says patchkit created {rel!r}, which is not in its runtime folder {FOLDER}/; "
            "refused (nothing was changed)"
        )
    return entry
