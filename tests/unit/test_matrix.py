"""The release matrix (patchkit matrix / scripts/matrix.py) on releases stood in
for by a fake ``run_release``; on two real ones: tests/trees/test_matrix_on_releases.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from patchkit.api import matrix

ROOT = Path(__file__).resolve().parents[2]


def test_failures_are_rows_not_crashes(monkeypatch):
    def fake(version, workdir=None):
        if version == "bad":
            return {
                "release": "bad",
                "error": "fetch: cannot download",
                "patches": {},
                "changed_files": [],
                "verify_ok": None,
                "idempotent": None,
                "revert_exact": None,
                "seconds": 0.0,
                "ok": False,
            }
        return {
            "release": version,
            "error": None,
            "patches": {},
            "changed_files": ["x.py"],
            "verify_ok": True,
            "idempotent": True,
            "revert_exact": True,
            "seconds": 1.0,
            "ok": True,
        }

    monkeypatch.setattr(matrix, "run_release", fake)
    told: list[tuple] = []
    doc = matrix.run_matrix(["good", "bad"], jobs=1, progress=lambda *done: told.append(done))
    assert not doc["ok"]
    assert told == [(0, 2), (1, 2, "sglang good: ok"), (2, 2, "sglang bad: FAILED")]
    md = matrix.to_markdown(doc)
    assert "| bad | [1]" in md and "[1] bad: fetch: cannot download" in md and "overall: FAILED" in md


def test_cli_exit_code_and_quiet(monkeypatch, cli, tmp_path):
    monkeypatch.setattr(
        matrix,
        "run_release",
        lambda v, w=None: {
            "release": v,
            "error": None,
            "patches": {},
            "changed_files": [],
            "verify_ok": v != "x",
            "idempotent": True,
            "revert_exact": True,
            "seconds": 0.5,
            "ok": v != "x",
        },
    )
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

    monkeypatch.setattr(
        matrix,
        "run_release",
        lambda v, w=None: {
            "release": v,
            "error": None,
            "patches": {},
            "changed_files": [],
            "verify_ok": True,
            "idempotent": True,
            "revert_exact": True,
            "seconds": 0.5,
            "ok": True,
        },
    )
    assert cli("matrix", "a", "b").stderr == ""  # not a terminal
    monkeypatch.setattr(_NamedTextIOWrapper, "isatty", lambda self: True, raising=False)
    drawn = cli("matrix", "a", "b").stderr
    assert "matrix" in drawn and "2/2" in drawn and "sglang b: ok" in drawn
    assert cli("matrix", "-q", "a", "b").stderr == ""


def test_script_help():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "matrix.py"), "--help"], capture_output=True, text=True
    )
    # One command line: the script is `patchkit matrix`, options and all.
    assert proc.returncode == 0 and "-j, --jobs" in proc.stdout and "markdown" in proc.stdout
    assert "Usage: patchkit matrix [OPTIONS] [RELEASE]..." in proc.stdout
