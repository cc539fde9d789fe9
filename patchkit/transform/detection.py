"""The read side's one door into the transform package.

A ``Session`` (``patchkit.engine``) asks what each codemod finds on a file's
bytes, and how many reads of the CPU mirror the audit finds; it never parses,
detects or touches a cache itself. ``Detection`` answers from the caches
first: the session's own (``detection_cache.Learnt``, kept in
``.patchkit/cache.json`` under ``cache_key``), the findings shared by every
tree of the user (``cache.SharedFindings``), then a parse. The parsed
modules it keeps are handed, with the findings, to the transform step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

import patchkit
from patchkit import detection_cache, registry, transform
from patchkit.detection_cache import FindingKey, Learnt
from patchkit.findings import Finding
from patchkit.transform import audit_counts
from patchkit.transform.cache import SharedFindings, cacheable, default_folder, fingerprint
from patchkit.tree import inside, sha256

if TYPE_CHECKING:  # libcst and the codemods are imported only when a file must be parsed
    import libcst as cst

    from patchkit.codemods.common.base import PatchCodemod

    CodemodRef = Union[type[PatchCodemod], str]


class Detection:
    """What a session learns of a tree's files: ``learnt`` (the session's
    cache, read back with ``load``: its entries under ``cache_key``), the
    parsed modules by the sha256 of their bytes, and the shared findings."""

    def __init__(self, package: Path, load: Callable[[str], Any]) -> None:
        self.package = package
        # Findings are the code's verdicts: a patchkit whose codemods changed (same version or not)
        # must not trust an earlier one's, so the key is the transform cache's code fingerprint.
        self.cache_key = f"patchkit {patchkit.__version__} {fingerprint()[:16]} cache {detection_cache.FORMAT}"
        self.learnt = Learnt.from_json(load(self.cache_key))
        self.findings = self.learnt.findings  # the detection cache, by codemod and file sha256
        # Handed down to the transform step (``patchkit.transform.transformer``), which adds to both.
        self.modules: dict[str, cst.Module] = {}  # parsed files, by the sha256 of their bytes
        self.shared = SharedFindings(default_folder())

    def finding(self, rel: str, data: bytes, codemod: "CodemodRef") -> Finding:
        """``codemod`` (a class, or its ``module:Class`` reference) on ``data``,
        the bytes of the file ``rel``. A cached finding (what detection gave
        for these very bytes) needs neither libcst nor the codemod module."""
        name, digest = registry.codemod_name(codemod), sha256(data)
        key = FindingKey(name, digest)
        cached = self.findings.get(key)
        if cached is not None:
            return cached
        # status on a tree patchkit does not manage keeps no cache of its own: the
        # findings shared by path and bytes (the user's cache folder) spare the parse.
        shared = cacheable([codemod])
        if shared and (found := self.shared.get(rel, digest, name)) is not None:
            self.findings[key] = found
            return found
        finding = self.findings[key] = transform.detect(
            rel, data, lambda: self._module(rel, data, digest), registry.load_codemod(codemod)
        )
        if shared:
            self.shared.add(rel, digest, name, finding)
        return finding

    def _module(self, rel: str, data: bytes, digest: str) -> "cst.Module":
        if digest not in self.modules:
            self.modules[digest] = transform.parse(data, inside(self.package, rel))
        return self.modules[digest]

    def audit_problems(self) -> int:
        """How many reads of the CPU mirror ``patchkit audit`` finds unguarded or stale (``audit_counts``)."""
        return audit_counts.audit_problems(self.learnt, self.package)

    def vendor_problems(self, targets: Iterable[str], release_own: Iterable[str] = ()) -> int:
        """How many of those reads are in the vendor's own code (``audit_counts``)."""
        return audit_counts.vendor_problems(self.learnt, self.package, targets, release_own)
