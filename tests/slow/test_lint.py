"""The habits that keep the code readable, run with the tests (so `.ci/run`
runs them): ruff's lint and format check, and mypy on ``patchkit/`` and
``gpu_e2e/`` with ``check_untyped_defs``, each configured in pyproject.toml. Versions are pinned in the ``test`` extra, so a
new release of either tool never fails a landing on code that did not change."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff_check_is_clean():
    result = _run("ruff", "check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_leaves_every_file_as_it_is():
    result = _run("ruff", "format", "--check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_mypy_is_clean_on_patchkit_and_the_gpu_harness():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]
    assert config["files"] == ["patchkit", "gpu_e2e"] and config["check_untyped_defs"] is True, config
    result = _run("mypy", "--no-incremental")
    assert result.returncode == 0, result.stdout + result.stderr
