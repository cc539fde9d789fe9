"""The release matrix (patchkit matrix / scripts/matrix.py) on two real releases."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support import ALL_NATIVE as NATIVE, PRIMARY
from patchkit.api import matrix

ROOT = Path(__file__).resolve().parents[2]
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
        "before": "absent", "state": "applied", "ok": True, "reason": "", "notes": [],
        "files": ["srt/layers/attention/trtllm_mha_backend.py"],
    }
    assert "srt/layers/attention/trtllm_mha_backend.py" in primary["changed_files"]
    assert primary["patches"]["fa3-spec-v2"]["state"] == "applied"
    assert "srt/layers/attention/flashattention_backend.py" in primary["changed_files"]
    assert primary["patches"]["flashmla-spec-v2"]["state"] == "applied"
    assert "srt/layers/attention/flashmla_backend.py" in primary["changed_files"]
    # 0.5.23 and later have every change upstream: nothing is written.
    assert native["changed_files"] == []
    assert {p["state"] for p in native["patches"].values()} <= {"native", "not-applicable"}
    assert all(p["ok"] for p in native["patches"].values())
    assert doc["ok"]


@pytest.mark.trees
def test_markdown_and_json(doc):
    md = matrix.to_markdown(doc)
    lines = md.splitlines()
    ids = [p["id"] for p in doc["patches"]]
    assert lines[0] == "| release | " + " | ".join(f"`{i}`" for i in ids) + " | files | verify | imports without patchkit | idempotent | revert exact | s |"
    row = next(ln for ln in lines if ln.startswith(f"| {PRIMARY} |"))
    assert "applied (1)" in row and "| OK | yes | yes |" in row
    assert next(ln for ln in lines if ln.startswith(f"| {NATIVE} |")).count("native") >= 1
    assert json.loads(matrix.to_json(doc)) == doc


def test_failures_are_rows_not_crashes(monkeypatch):
    def fake(version, workdir=None):
        if version == "bad":
            return {"release": "bad", "error": "fetch: cannot download",
                    "patches": {}, "changed_files": [], "verify_ok": None, "idempotent": None,
                    "revert_exact": None, "seconds": 0.0, "ok": False}
        return {"release": version, "error": None, "patches": {}, "changed_files": ["x.py"], "verify_ok": True,
                "idempotent": True, "revert_exact": True, "seconds": 1.0, "ok": True}

    monkeypatch.setattr(matrix, "run_release", fake)
    told: list[tuple] = []
    doc = matrix.run_matrix(["good", "bad"], jobs=1, progress=lambda *done: told.append(done))
    assert not doc["ok"]
    assert told == [(0, 2), (1, 2, "sglang good: ok"), (2, 2, "sglang bad: FAILED")]
    md = matrix.to_markdown(doc)
    assert "| bad | [1]" in md and "[1] bad: fetch: cannot download" in md and "overall: FAILED" in md


def test_cli_exit_code_and_quiet(monkeypatch, cli, tmp_path):
    monkeypatch.setattr(matrix, "run_release", lambda v, w=None: {
        "release": v, "error": None, "patches": {}, "changed_files": [], "verify_ok": v != "x",
        "idempotent": True, "revert_exact": True, "seconds": 0.5, "ok": v != "x"})
    result = cli("-q", "matrix", "a", "b", "--format", "json")
    assert result.exit_code == 0 and json.loads(result.output)["ok"]
    out = tmp_path / "m.md"
    result = cli("matrix", "a", "x", "-o", out)
    assert result.exit_code == 1 and result.output == ""
    assert "| x |" in out.read_text() and "**FAILED**" in out.read_text()


def test_progress_bar_on_a_terminal_only(monkeypatch, cli):
    """`patchkit matrix` draws click's progress bar on stderr where it is a
    terminal, and nothing with -q (patchkit.terminal.progress_bar)."""
    from click.testing import _NamedTextIOWrapper

    monkeypatch.setattr(matrix, "run_release", lambda v, w=None: {
        "release": v, "error": None, "patches": {}, "changed_files": [], "verify_ok": True,
        "idempotent": True, "revert_exact": True, "seconds": 0.5, "ok": True})
    assert cli("matrix", "a", "b").stderr == ""  # not a terminal
    monkeypatch.setattr(_NamedTextIOWrapper, "isatty", lambda self: True, raising=False)
    drawn = cli("matrix", "a", "b").stderr
    assert "matrix" in drawn and "2/2" in drawn and "sglang b: ok" in drawn
    assert cli("matrix", "-q", "a", "b").stderr == ""


def test_script_help():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "matrix.py"), "--help"], capture_output=True, text=True)
    # One command line: the script is `patchkit matrix`, options and all.
    assert proc.returncode == 0 and "-j, --jobs" in proc.stdout and "markdown" in proc.stdout
    assert "Usage: patchkit matrix [OPTIONS] [RELEASE]..." in proc.stdout
