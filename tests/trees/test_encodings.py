"""CRLF line endings and coding cookies survive patching and revert."""

from __future__ import annotations

import pytest
from support import PRIMARY, snapshot

pytestmark = pytest.mark.trees

MHA = "srt/layers/attention/trtllm_mha_backend.py"
HOOK = "trtllm-mha-overlap-hook"


def test_crlf_file_is_patched_with_crlf_and_reverted_exactly(make_tree, cli):
    tree = make_tree(PRIMARY)
    path = tree / MHA
    path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    before = snapshot(tree)
    assert cli("apply", tree, HOOK).exit_code == 0
    data = path.read_bytes()
    assert b"update_verify_buffers_to_fill_after_draft" in data
    assert data.count(b"\n") == data.count(b"\r\n")
    assert f"{HOOK}  applied" in cli("status", tree, HOOK).output
    assert cli("revert", tree).exit_code == 0
    assert snapshot(tree) == before


def test_coding_cookie_is_respected(make_tree, cli):
    tree = make_tree(PRIMARY)
    path = tree / MHA
    text = path.read_text(encoding="utf-8")
    path.write_bytes(("# -*- coding: latin-1 -*-\n# Vendor: Müller GmbH\n" + text).encode("latin-1"))
    before = snapshot(tree)
    assert cli("apply", tree, HOOK).exit_code == 0
    patched = path.read_bytes()
    assert "Müller".encode("latin-1") in patched
    assert "update_verify_buffers_to_fill_after_draft" in patched.decode("latin-1")
    assert cli("revert", tree).exit_code == 0
    assert snapshot(tree) == before
