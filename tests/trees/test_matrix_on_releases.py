"""The release matrix (patchkit matrix) on two real releases; without a
download: tests/unit/test_matrix.py."""

from __future__ import annotations

import json

import pytest
from support import ALL_NATIVE as NATIVE
from support import PRIMARY

from patchkit.api import matrix

HOOK = "trtllm-mha-overlap-hook"


@pytest.fixture(scope="module")
def doc():
    return matrix.run_matrix([PRIMARY, NATIVE], jobs=2)


@pytest.mark.trees
def test_two_releases_in_parallel(doc):
    assert doc["schema"] == "patchkit.matrix/1" and doc["jobs"] == 2
    primary, native = doc["releases"]
    assert [primary["release"], native["release"]] == [PRIMARY, NATIVE]
    for row in (primary, native):
        assert row["error"] is None, row["error"]
        assert set(row["patches"]) == {p["id"] for p in doc["patches"]}
        assert row["verify_ok"] and row["idempotent"] and row["revert_exact"], row
        assert row["changed_after_revert"] == []
    assert primary["patches"][HOOK] == {
        "before": "absent",
        "state": "applied",
        "ok": True,
        "reason": "",
        "notes": [],
        "files": ["srt/layers/attention/trtllm_mha_backend.py"],
    }
    assert "srt/layers/attention/trtllm_mha_backend.py" in primary["changed_files"]
    assert primary["patches"]["fa3-spec-v2"]["state"] == "applied"
    assert "srt/layers/attention/flashattention_backend.py" in primary["changed_files"]
    assert primary["patches"]["flashmla-spec-v2"]["state"] == "applied"
    assert "srt/layers/attention/flashmla_backend.py" in primary["changed_files"]
    # 0.5.23 has every change upstream but dsa-no-mirror's one line past upstream (sglang #33973).
    assert [f for f in native["changed_files"] if not f.startswith("srt/_patchkit/")] == [
        "srt/layers/attention/dsa_backend.py"
    ]
    assert {i for i, p in native["patches"].items() if p["state"] not in ("native", "not-applicable")} == {
        "dsa-no-mirror"
    }
    assert all(p["ok"] for p in native["patches"].values())
    assert doc["ok"]


@pytest.mark.trees
def test_markdown_and_json(doc):
    md = matrix.to_markdown(doc)
    lines = md.splitlines()
    ids = [p["id"] for p in doc["patches"]]
    assert (
        lines[0]
        == "| release | "
        + " | ".join(f"`{i}`" for i in ids)
        + " | files | verify | imports without patchkit | idempotent | revert exact | s |"
    )
    row = next(ln for ln in lines if ln.startswith(f"| {PRIMARY} |"))
    assert "applied (1)" in row and "| OK | yes | yes |" in row
    assert next(ln for ln in lines if ln.startswith(f"| {NATIVE} |")).count("native") >= 1
    assert json.loads(matrix.to_json(doc)) == doc
