"""The audit's counts, cached (``Session.audit_problems``,
``Session.vendor_problems``): by the audited files' bytes in the session's
learnt caches (``detection_cache.Learnt``), and the vendor's own reads
across trees as a fact of the transform cache. The audit parses every
module under srt/ that mentions the mirror: without these, ``verify`` would
take three times as long, and a warm ``apply`` would spend most of its time
auditing a tree it did not change."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from patchkit import detection_cache
from patchkit.detection_cache import AuditKey, Learnt, VendorKey
from patchkit.transform.cache import TransformCache
from patchkit.tree import sha256


@dataclass(frozen=True)
class VendorProblems:
    """How many reads of the mirror the audit finds in the vendor's own code
    (``Session.vendor_problems``): a fact of the transform cache."""

    KIND: ClassVar[str] = "vendor-problems"
    count: int

    def to_json(self) -> int:
        return self.count

    @classmethod
    def from_json(cls, data: object) -> VendorProblems:
        return cls(detection_cache.count_of(data))


def audit_problems(learnt: Learnt, package: Path) -> int:
    """How many reads of the CPU mirror ``patchkit audit`` finds unguarded
    or stale in ``package``, kept in ``learnt``."""
    from patchkit import audit

    key = AuditKey(audit.fingerprint(package))
    if key not in learnt.audit:
        learnt.audit[key] = len(audit.audit_tree(package).problems)
    return learnt.audit[key]


def vendor_problems(learnt: Learnt, package: Path, targets: Iterable[str], release_own: Iterable[str] = ()) -> int:
    """How many of those reads are in the vendor's own code
    (``audit.vendor_problems``; ``targets``: the files patchkit's patches
    change; ``release_own``: files this apply changed that were their
    release's bytes before, so hold no vendor code), kept in ``learnt``."""
    from patchkit import audit

    targets, sources = sorted(set(targets)), audit.sources(package)
    release_own = sorted(set(release_own))
    # ``release_own`` is not in the key: it only spares parsing files whose
    # reads are patchkit's or the release's, never the vendor's (same count).
    key = VendorKey(audit.fingerprint(package, sources), sha256(chr(0).join(targets).encode()))
    if key not in learnt.vendor:
        # Shared by every tree like a transform (a fresh copy of a release,
        # patched, has the same bytes), under patchkit's code fingerprint too.
        shared = TransformCache.default()
        fact = shared.get_fact(
            shared_key := shared.fact_key(VendorProblems, key.fingerprint, key.targets), VendorProblems
        )
        if fact is None:
            found = audit.audit_tree(package, sources=sources, vendor_only=True, release_own=release_own)
            fact = VendorProblems(len(audit.vendor_problems(found, targets)))
            shared.put_fact(shared_key, fact)
        learnt.vendor[key] = fact.count
    return learnt.vendor[key]
