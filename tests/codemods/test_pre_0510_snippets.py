"""Snippet tests of tests/trees/test_pre_0510.py (no release read; the quick loop runs them)."""

from __future__ import annotations

from patchkit import audit


def test_reads_are_vendor_only_when_the_release_is_known():
    """Without the release in the cache, apply's line says unknown origin,
    never the vendor's own code (a pristine release read as a fork)."""
    unknown = audit.vendor_line(3, "0.5.9", known=False)
    assert "unknown origin" in unknown and "vendor's own code" not in unknown
    assert "`patchkit fetch 0.5.9`" in unknown
    assert "vendor's own code" in audit.vendor_line(3, "0.5.9")
    assert audit.vendor_line(0, "0.5.9", known=False) is None
