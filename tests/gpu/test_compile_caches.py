"""gpu_e2e/compile_caches.py: an earlier machine's compiled kernels, packed and installed
(the Triton and inductor caches per lane, FlashInfer's modules as its ahead-of-time ones)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from gpu_e2e import compile_caches, launch

FI_VERSION = "0.6.11.post1"


def _fi_workspace(base: Path, name: str, version: str = FI_VERSION) -> Path:
    ops = base / ".cache" / "flashinfer" / version / "90a" / "cached_ops" / name
    ops.mkdir(parents=True)
    (ops / f"{name}.so").write_bytes(b"module " + name.encode())
    (ops / f"{name}.cuda.o").write_bytes(b"object")  # the build's own files stay behind
    (ops / "build.ninja").write_text("rule")
    return base


def _lanes(tmp_path: Path) -> dict[str, list[Path]]:
    fi = [_fi_workspace(tmp_path / "fi0", "batch_decode_a"), _fi_workspace(tmp_path / "fi1", "batch_prefill_b")]
    _fi_workspace(tmp_path / "fi1", "batch_decode_a")  # built on both lanes: packed once
    triton = [tmp_path / "triton0", tmp_path / "triton1"]
    for lane, t in enumerate(triton):
        (t / "HASH1").mkdir(parents=True)
        (t / "HASH1" / "k.cubin").write_text(f"lane {lane}")
    (triton[1] / "HASH2").mkdir()
    (triton[1] / "HASH2" / "k.json").write_text("{}")
    inductor = tmp_path / "inductor0" / "fxgraph" / "ab"
    inductor.mkdir(parents=True)
    (inductor / "entry").write_text("graph")
    return {"fi": fi, "triton": triton, "inductor": [tmp_path / "inductor0", tmp_path / "missing"]}


def test_pack_then_install_puts_every_lanes_kernels_in_each_lane(tmp_path):
    lanes = _lanes(tmp_path / "old")
    tar = tmp_path / "caches.tar.gz"
    counts = compile_caches.pack(lanes["fi"], lanes["triton"], lanes["inductor"], tar, log=lambda *_: None)
    assert counts == {"triton": 2, "inductor": 1, "flashinfer": 2}
    with tarfile.open(tar) as t:
        names = set(t.getnames())
    assert f"flashinfer/{FI_VERSION}/90a/batch_decode_a/batch_decode_a.so" in names
    assert not any(n.endswith((".o", ".ninja")) for n in names)
    new = tmp_path / "new"
    got = compile_caches.install(
        tar, [new / "triton0", new / "triton1"], [new / "inductor0"], new / "site", log=lambda *_: None
    )
    assert got == {"triton": 4, "inductor": 1, "flashinfer": 2}
    assert (new / "triton1" / "HASH1" / "k.cubin").read_text() == "lane 0"  # the first lane's copy
    assert (new / "inductor0" / "fxgraph" / "ab" / "entry").read_text() == "graph"
    so = new / "site" / compile_caches.SHIM / "aot" / FI_VERSION / "90a" / "batch_prefill_b" / "batch_prefill_b.so"
    assert so.read_bytes() == b"module batch_prefill_b"


def _shim_answer(site: Path, dist: Path) -> list[str]:
    code = "import os, flashinfer_jit_cache as c; print(c.__version__); print(c.get_jit_cache_dir()); print(os.environ.get('FLASHINFER_DISABLE_VERSION_CHECK', ''))"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(dist), str(site)]), PYTHONNOUSERSITE="1")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


def _dist(root: Path, version: str) -> Path:
    info = root / f"flashinfer_python-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: flashinfer-python\nVersion: {version}\n")
    return root


def test_the_shim_answers_for_the_flashinfer_that_imports_it(tmp_path):
    """FlashInfer loads a module from the shim's folder without building it: the folder is
    that of the importing FlashInfer's own version, so another version finds nothing there."""
    tar = tmp_path / "caches.tar.gz"
    compile_caches.pack([_fi_workspace(tmp_path / "fi0", "m")], [], [], tar, log=lambda *_: None)
    site = tmp_path / "site"
    compile_caches.install(tar, [], [], site, log=lambda *_: None)
    version, folder, unchecked = _shim_answer(site, _dist(tmp_path / "d1", FI_VERSION))
    assert (version, Path(folder), unchecked) == (
        FI_VERSION,
        site / compile_caches.SHIM / "aot" / FI_VERSION / "90a",
        "",
    )
    version, folder, _ = _shim_answer(site, _dist(tmp_path / "d2", "0.6.99"))
    assert version == "0.6.99" and not Path(folder).exists()


def test_a_member_outside_the_stage_is_refused(tmp_path):
    tar = tmp_path / "evil.tar.gz"
    with tarfile.open(tar, "w:gz") as t:
        data = b"x"
        info = tarfile.TarInfo("../escaped")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    with pytest.raises(tarfile.OutsideDestinationError):
        compile_caches.install(tar, [tmp_path / "t"], [], None, log=lambda *_: None)
    assert not (tmp_path / "escaped").exists()


def test_the_runners_see_the_extra_site_last(tmp_path, monkeypatch):
    monkeypatch.setenv("PK_E2E_EXTRA_SITE", str(tmp_path / "aot"))
    env = launch.runner_env(
        tree=tmp_path / "tree",
        tree_name="patched",
        site_rel=tmp_path / "rel",
        site_common=tmp_path / "common",
        bundle=tmp_path / "b",
        info={"runtime_mode": "vendored"},
        sync_dir=tmp_path / "s",
        asked_env={},
    )
    assert env["PYTHONPATH"].split(os.pathsep)[-1] == str(tmp_path / "aot")
