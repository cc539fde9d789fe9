"""What a session learns of a tree's bytes, kept in ``.patchkit/cache.json``.

Three caches, each keyed by a frozen dataclass and holding one kind of value:

- ``findings``: a codemod's ``Finding`` on a file's bytes (``FindingKey``);
- ``audit``: how many reads of the CPU mirror the audit finds unguarded or
  stale, by the audited files' bytes (``AuditKey``);
- ``vendor``: how many of those are in the vendor's own code (``VendorKey``).

On disk each cache is a list of rows, the key's fields then the value (a
finding as ``Finding.as_list``). The file names its ``FORMAT`` in its key
(``Session``): a cache of another format is ignored, never misread, and a
damaged one is an empty one (the files are detected again).

Kept apart from libcst and the codemods, like ``patchkit.findings``: ``status``
and ``verify`` answered from this cache import neither.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass, field
from typing import Any

from patchkit.findings import Finding, State

FORMAT = 2


@dataclass(frozen=True)
class FindingKey:
    """A codemod's finding (``registry.codemod_name``) on the bytes of sha256 ``sha256``."""

    codemod: str
    sha256: str


@dataclass(frozen=True)
class AuditKey:
    """The audit's count on the audited files' bytes (``audit.fingerprint``)."""

    fingerprint: str


@dataclass(frozen=True)
class VendorKey:
    """The vendor's own unguarded reads on the audited files' bytes, for one set
    of patch targets (``targets``: the sha256 of their names)."""

    fingerprint: str
    targets: str


def count_of(value: Any) -> int:
    """``value``, a count read back from a cache (TypeError: it is not one)."""
    if type(value) is not int:
        raise TypeError(f"not a count: {value!r}")
    return value


def _finding(value: Any) -> Finding | None:
    """The finding a cached row holds; None for one written before findings
    had lines (4 items) that verify would show at its line (todo, missing):
    it is detected again."""
    finding = Finding.from_list(value)
    return finding if len(value) > 4 or finding.state in (State.DONE, State.SUPERSEDED) else None


@dataclass
class Learnt:
    """The three caches of one tree."""

    findings: dict[FindingKey, Finding] = field(default_factory=dict)
    audit: dict[AuditKey, int] = field(default_factory=dict)
    vendor: dict[VendorKey, int] = field(default_factory=dict)

    def copy(self) -> Learnt:
        return Learnt(dict(self.findings), dict(self.audit), dict(self.vendor))

    def to_json(self) -> dict[str, list[list[Any]]]:
        return {
            "findings": [[*astuple(key), finding.as_list()] for key, finding in self.findings.items()],
            "audit": [[*astuple(key), count] for key, count in self.audit.items()],
            "vendor": [[*astuple(key), count] for key, count in self.vendor.items()],
        }

    @classmethod
    def from_json(cls, data: Any) -> Learnt:
        """The caches ``to_json`` wrote; empty where ``data`` is damaged."""
        try:
            findings = {
                FindingKey(codemod, sha): found
                for codemod, sha, listed in data.get("findings", ())
                if (found := _finding(listed)) is not None
            }
            audit = {AuditKey(fingerprint): count_of(n) for fingerprint, n in data.get("audit", ())}
            vendor = {
                VendorKey(fingerprint, targets): count_of(n) for fingerprint, targets, n in data.get("vendor", ())
            }
        except (TypeError, ValueError, KeyError, AttributeError):
            return cls()
        return cls(findings, audit, vendor)
