#!/usr/bin/env python3
"""Build ``sglang-patchkit-runtime``: the runtime alone, for serving images of trees
patched with ``--runtime package``.

It holds ``patchkit/runtime/`` and ``patchkit/backends/`` and nothing else (no
``patchkit/__init__.py``, no CLI): it depends on nothing, so libcst and click
stay out of the serving image. ``patchkit`` is then a namespace package, and
``import patchkit.runtime`` works as it does with the full patchkit installed.
Install one or the other in an environment, not both (they share those files).

    python scripts/build_runtime_wheel.py [--out dist/]

prints the path of the wheel. Built with setuptools through ``pip wheel``, from
a staging folder holding copies of the two packages (setuptools builds only
what lies under the project folder).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from patchkit import __version__  # noqa: E402

PACKAGES = ("runtime", "backends")

PYPROJECT = f"""\
[build-system]
requires = ["setuptools>=69"]
build-backend = "setuptools.build_meta"

[project]
name = "sglang-patchkit-runtime"
version = "{__version__}"
description = "The runtime code sglang trees patched by patchkit (package mode) import: standard library and torch only"
requires-python = ">=3.9"
dependencies = []

[tool.setuptools]
packages = [{", ".join(f'"patchkit.{p}"' for p in PACKAGES)}]
"""


def build(out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp)
        (stage / "pyproject.toml").write_text(PYPROJECT)
        for name in PACKAGES:
            shutil.copytree(
                ROOT / "patchkit" / name,
                stage / "patchkit" / name,
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
            )
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(stage)], check=True
        )
    wheel = out / f"sglang_patchkit_runtime-{__version__}-py3-none-any.whl"
    if not wheel.is_file():
        raise SystemExit(f"build_runtime_wheel: pip did not produce {wheel}")
    return wheel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "dist")
    print(build(parser.parse_args().out))


if __name__ == "__main__":
    main()
