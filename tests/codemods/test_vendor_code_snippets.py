"""Snippet tests of tests/trees/test_vendor_code.py (no release read; the quick loop runs them)."""

from __future__ import annotations

from patchkit import fetch
from patchkit.transform import vendor_code

PRISTINE = b"""\
class B:
    def f(self, mode):
        if mode in (A.X, A.Y):
            return g(1, k=2)
        return None
"""


def test_lost_names_the_vendor_token_and_line():
    fork = PRISTINE.replace(b"A.Y)", b"A.Y, A.VENDOR)")
    dropped = fork.replace(b"(A.X, A.Y, A.VENDOR)", b"(A.X,)")
    (found,) = vendor_code.lost(PRISTINE, fork, dropped)
    assert (found.line, found.token, found.scope) == (3, "A.VENDOR", "B.f")
    assert vendor_code.lost(PRISTINE, fork, fork.replace(b"A.Y, ", b"")) == []  # the release's member may go


def test_layout_and_moves_are_not_losses():
    fork = PRISTINE.replace(b"g(1, k=2)", b"g(1, k=2, vendor=3)")
    relaid = fork.replace(
        b"g(1, k=2, vendor=3)",
        b"g(\n                1,\n                k=2,\n                vendor=3,\n            )",
    )
    assert vendor_code.lost(PRISTINE, fork, relaid) == []
    wrapped = fork.replace(b"            return g(", b"            if ok:\n                return g(")
    assert vendor_code.lost(PRISTINE, fork, wrapped) == []
    assert vendor_code.lost(None, fork, b"") == [] and vendor_code.lost(PRISTINE, PRISTINE, b"") == []


def test_removed_vendor_statement_and_method():
    fork = PRISTINE.replace(
        b"        return None\n",
        b"        vendor_log(mode)\n        return None\n    def vendor_m(self):\n        pass\n",
    )
    gone = PRISTINE.replace(b"return None", b"return 0")
    tokens = {x.token for x in vendor_code.lost(PRISTINE, fork, gone)}
    assert {"vendor_log", "def vendor_m"} <= tokens


def test_pristine_source_never_downloads(tmp_path, monkeypatch):
    monkeypatch.setenv("PATCHKIT_CACHE_DIR", str(tmp_path))
    assert fetch.pristine_source("0.5.12.post1", "srt/managers/scheduler.py") is None
    assert fetch.pristine_source("unknown", "x.py") is None
    assert not any(tmp_path.iterdir())
