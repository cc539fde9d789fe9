"""What `pip install` gets: the wheel holds patchkit, its patch definitions and
runtime, and not the GPU proof harness, the tests or the examples; its
console script runs from a clean virtual environment. Slow (a build and an
install): run once."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from support import PRIMARY, pristine

from patchkit import __version__, registry
from patchkit.registry import sets as patch_sets

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # No build isolation: setuptools comes from this environment (no download).
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("*.whl")
    return built


def test_wheel_contents(wheel):
    assert wheel.name.startswith(f"sglang_patchkit-{__version__}-")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        metadata = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        entry_points = zf.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert "Name: sglang-patchkit" in metadata
    assert "patchkit = patchkit.__main__:run" in entry_points
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"patchkit"}  # no gpu_e2e, tests, examples or scripts
    assert not any("gpu_e2e" in n for n in names)
    shipped = {n.rsplit("/", 1)[1] for n in names if n.startswith("patchkit/patches/") and n.endswith(".toml")}
    assert shipped == {f.name for f in patch_sets.definition_files()} and shipped
    for module in (
        "patchkit/cli/__init__.py",
        "patchkit/registry/__init__.py",
        "patchkit/runtime/seq_lens.py",
        "patchkit/backends/trtllm_mha.py",
        "patchkit/codemods/common/primitives/__init__.py",
        "patchkit/testing.py",
        "patchkit/known_releases.json",
    ):  # the last: the vendor-code check's hashes
        assert module in names


def test_console_script_from_a_clean_venv(wheel, tmp_path):
    venv = tmp_path / "venv"
    # Clean: nothing of this checkout on the path (the build's egg-info there
    # would read as sglang-patchkit already installed).
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", str(wheel)],
        check=True,
        capture_output=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
    )
    patchkit = str(venv / "bin" / "patchkit")

    def run(*args):
        return subprocess.run([patchkit, *args], capture_output=True, text=True, cwd=tmp_path, env=env)

    version = run("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"patchkit, version {__version__}"
    listed = run("list")
    assert listed.returncode == 0 and [line.split()[0] for line in listed.stdout.splitlines()] == [
        p.id for p in registry.all_patches()
    ]
    status = run("status", str(pristine(PRIMARY)))
    assert status.returncode == 0 and status.stdout.startswith(f"sglang {PRIMARY} at "), status.stderr


def _listing(folder: Path) -> set[str]:
    """Every path under ``folder``, git-ignored ones too (build/, *.egg-info),
    bytecode caches aside (tests running beside this one write them)."""
    return {
        str(p.relative_to(folder))
        for p in folder.rglob("*")
        if not {"__pycache__", ".pytest_cache"} & set(p.relative_to(folder).parts)
    }


def test_installing_the_example_set_leaves_its_folder_as_it_was(tmp_path):
    """`pip install ./examples/acme-patches` builds out of the source folder
    (flit_core): no build/ or *.egg-info there to break the example's tests."""
    pytest.importorskip("flit_core", reason="the [test] extra installs flit_core, the example's build backend")
    example = ROOT / "examples" / "acme-patches"
    before = _listing(example)
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(example),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    assert _listing(example) == before
    (info,) = target.glob("acme_sglang_patches-*.dist-info")
    points = (info / "entry_points.txt").read_text().replace(" ", "")
    assert "[patchkit.patches]\nacme=acme_patches" in points
    shipped = {p.name for p in (target / "acme_patches").iterdir()}
    assert {"__init__.py", "torch_native.py", "acme_runtime.py", "torch-native-spec-v2.toml"} <= shipped
