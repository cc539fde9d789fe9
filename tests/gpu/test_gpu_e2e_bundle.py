"""The GPU bundle: pins, slimming, overlay, size, and import coverage of the Engine path."""

from __future__ import annotations

import importlib.util
import json
import re
import tarfile

import pytest

from gpu_e2e import bundle, coverage, wheels


def test_pins_are_exact_and_never_twice():
    for rel in wheels.RELEASES:
        pins = wheels.all_pins([rel])
        seen: dict[str, str] = {}
        for group, group_pins in pins.items():
            for dist, ver in group_pins.items():
                assert re.fullmatch(r"\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?", ver), (dist, ver)
                name = wheels.normalise(dist)
                assert name not in seen, f"{name} pinned in {seen[name]} and {group}"
                seen[name] = group
        # nothing the image already has is carried, except where a release pins
        # another version than the image's (transformers 5.6.0 / 5.3.0, tokenizers 0.22.2;
        # 0.5.9's transformers 4.57.1 refuses the image's huggingface-hub 1.x)
        carried_on_image = {n for n in seen if n in wheels.IMAGE_PACKAGES}
        expected = {"transformers", "tokenizers"} | ({"huggingface-hub"} if rel == "0.5.9" else set())
        assert carried_on_image == expected, carried_on_image


def test_unknown_release_refused_and_a_release_may_override_a_common_pin():
    with pytest.raises(SystemExit, match="unknown release"):
        wheels.all_pins(["0.4.0"])
    # 0.5.13 (the upstream reference) needs sglang-kernel 0.4.3: alone, the common
    # group drops the common pin; beside 0.5.12.post1, which uses it, it keeps it
    # (the release's own site folder comes first on the path).
    alone = wheels.all_pins(["0.5.13"])
    assert "sglang-kernel" not in alone["common"] and alone["0.5.13"]["sglang-kernel"] == "0.4.3"
    both = wheels.all_pins(["0.5.12.post1", "0.5.13"])
    assert both["common"]["sglang-kernel"] == wheels.COMMON_PINS["sglang-kernel"]


def test_slimming_rules():
    keep = wheels.keep_member
    assert keep("sglang-kernel", "sgl_kernel/__init__.py")
    assert keep("sglang-kernel", "sgl_kernel/quantization/gguf.py")
    assert keep("sglang-kernel", "sgl_kernel/sm90/common_ops.abi3.so")
    assert keep("sglang-kernel", "sglang_kernel-0.4.2.post2.dist-info/METADATA")
    for dropped in (
        "sgl_kernel/flash_ops.abi3.so",
        "sgl_kernel/sm100/common_ops.abi3.so",
        "sgl_kernel/flashmla_ops.abi3.so",
        "lib/mscclpp_nccl.so",
        "_mscclpp.cpython-310-x86_64-linux-gnu.so",
        "include/dlpack/dlpack.h",
    ):
        assert not keep("sglang-kernel", dropped), dropped
    assert keep("flashinfer-python", "flashinfer/data/csrc/norm.cu")  # JIT-built on the GPU
    assert wheels.installed_name("x-1.0.data/purelib/x/a.py") == "x/a.py"
    assert wheels.installed_name("x-1.0.data/scripts/x") is None
    assert wheels.installed_name("x/a.py") == "x/a.py"


def test_overlay_and_runtime_mode_detection(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for root in (a, b):
        (root / "srt").mkdir(parents=True)
        (root / "srt" / "same.py").write_text("x = 1\n")
    (a / "srt" / "m.py").write_text("y = 1\n")
    (b / "srt" / "m.py").write_text("from patchkit.runtime import add_or_none\ny = 1\n")
    (b / "srt" / "_patchkit").mkdir()
    (b / "srt" / "_patchkit" / "r.py").write_text("import os\n")
    (b / ".patchkit").mkdir()
    (b / ".patchkit" / "state.json").write_text("{}")
    changed, removed = bundle.overlay(a, b)
    assert sorted(changed) == ["srt/_patchkit/r.py", "srt/m.py"] and removed == []
    assert bundle.imports_patchkit(b, changed) == ["patchkit.runtime"]
    (b / "srt" / "m.py").write_text("from sglang.srt._patchkit.runtime import add_or_none\n")
    assert bundle.imports_patchkit(b, changed) == []


def _kernel_wheel_cached() -> bool:
    return wheels.find_wheel(wheels.wheel_cache(), "sglang-kernel", wheels.COMMON_PINS["sglang-kernel"]) is not None


@pytest.mark.trees
@pytest.mark.skipif(
    not _kernel_wheel_cached(),
    reason="needs the 322 MB sglang-kernel wheel in the patchkit cache: "
    "run `python scripts/gpu_e2e.py bundle --out DIR` once",
)
def test_build_bundle(tmp_path):
    dest = tmp_path / "bundle"
    # gzip: the same tars, minutes faster to write than xz (the devices' bundles use xz;
    # the orchestrator reads both: test_site_tars_are_read_in_either_compression)
    manifest = bundle.build(dest, ["0.5.12.post1"], log=lambda *_: None, site_compression="gz")
    total = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    assert total <= bundle.LIMIT_BYTES
    # every pinned distribution is there once, at its pinned version
    dists: dict[str, str] = {}
    for group in ("common", "0.5.12.post1"):
        with tarfile.open(dest / "site" / f"{group}.tar.gz") as tar:
            names = tar.getnames()
        for name in names:
            top = name.split("/")[0]
            if top.endswith(".dist-info") and name.endswith("/METADATA"):
                dist, ver = top[: -len(".dist-info")].rsplit("-", 1)
                key = wheels.normalise(dist)
                assert key not in dists, f"{key} twice"
                dists[key] = ver
        if group == "common":
            assert "sgl_kernel/sm90/common_ops.abi3.so" in names
            assert not any("flash_ops" in n or "/sm100/" in n for n in names)
    pins = {wheels.normalise(d): v for g in manifest["pins"].values() for d, v in g.items()}
    assert dists == pins
    rel = manifest["releases"]["0.5.12.post1"]
    assert "srt/speculative/eagle_info_v2.py" in rel["changed_files"]
    # the runtime mode follows what this checkout's patchkit writes into the tree
    assert (dest / "runtime").exists() == (rel["runtime_mode"] == "package")
    assert (rel["runtime_mode"] == "package") == bool(rel["patchkit_imports"])
    overlay = json.loads((dest / "trees" / "0.5.12.post1" / "overlay.json").read_text())
    assert sorted(overlay) == rel["changed_files"]
    assert (dest / "e2e" / "sitecustomize.py").exists()
    assert (dest / "e2e" / bundle.PKG_NAME / "runner.py").exists()
    for f, meta in manifest["files"].items():
        assert (dest / f).stat().st_size == meta["bytes"]


_HEAVY = [m for m in ("torch", "triton", "transformers") if importlib.util.find_spec(m) is None]


@pytest.mark.behaviour
@pytest.mark.trees
@pytest.mark.skipif(bool(_HEAVY), reason=f"behaviour environment missing: {_HEAVY}")
@pytest.mark.parametrize("release", ["0.5.12.post1", "0.5.10"])
def test_engine_path_imports_are_on_the_image_or_in_the_bundle(release):
    from patchkit.fetch import fetch_tree

    tree = fetch_tree(release)
    result = coverage.engine_path_imports(tree.parent, release)
    assert "error" not in result, result.get("error")
    assert "sglang" in result["modules"] and "transformers" in result["modules"]
    assert coverage.uncovered(result, release) == []
    # and the check does catch a missing one: without opentelemetry-api pinned,
    # fastapi's import of it is uncovered
    pins = dict(wheels.COMMON_PINS)
    try:
        del wheels.COMMON_PINS["opentelemetry-api"]
        assert any(x.startswith("opentelemetry") for x in coverage.uncovered(result, release))
    finally:
        wheels.COMMON_PINS.clear()
        wheels.COMMON_PINS.update(pins)


@pytest.mark.parametrize("compression", ["xz", "gz"])
def test_site_tars_are_read_in_either_compression(tmp_path, compression):
    import io

    from gpu_e2e import orchestrate

    (tmp_path / "site").mkdir()
    with tarfile.open(tmp_path / "site" / f"common.tar.{compression}", f"w:{compression}") as tar:
        data = b"x = 1\n"
        info = tarfile.TarInfo("pkg/__init__.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    site = orchestrate.unpacked_site(tmp_path, "common", tmp_path / "work")
    assert (site / "pkg" / "__init__.py").read_bytes() == b"x = 1\n"
    with pytest.raises(SystemExit, match="xz or gz"):
        bundle.build(tmp_path / "b", ["0.5.12.post1"], site_compression="bz2")


def test_reuse_site_copies_the_site_tars_of_the_same_pins(tmp_path, monkeypatch):
    # no wheels, no trees: only the site step and the manifest (a rebuild after a codemod
    # change compresses nothing again)
    monkeypatch.setattr(bundle, "download_wheels", lambda pins, cache: {})
    monkeypatch.setattr(bundle, "add_wheels_to_tar", lambda tar, wheels: 0)
    first = tmp_path / "first"
    bundle.build(first, [], log=lambda *_: None, site_compression="gz")
    (site,) = (first / "site").iterdir()
    site.write_bytes(b"built once")
    manifest = json.loads((first / "manifest.json").read_text())
    manifest["site_bytes"] = {group: 7 for group in manifest["pins"]}
    (first / "manifest.json").write_text(json.dumps(manifest))
    again = tmp_path / "again"
    built = bundle.build(again, [], log=lambda *_: None, site_compression="gz", reuse_site=first)
    assert (again / "site" / site.name).read_bytes() == b"built once"
    assert built["site_bytes"] == manifest["site_bytes"]
    manifest["pins"] = {group: {"other": "1"} for group in manifest["pins"]}  # pins changed: rebuilt
    (first / "manifest.json").write_text(json.dumps(manifest))
    bundle.build(again, [], log=lambda *_: None, site_compression="gz", reuse_site=first)
    assert (again / "site" / site.name).read_bytes() != b"built once"
