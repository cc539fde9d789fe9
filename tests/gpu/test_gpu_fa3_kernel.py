"""The FA3 kernel's own transport for the GPU proof (gpu_e2e/fa3_kernel.py),
on a small stand-in library: pack, unpack, the sha256 check, install."""

from __future__ import annotations

import json
import shutil
import zipfile

import pytest

from gpu_e2e import fa3_kernel

pytestmark = pytest.mark.skipif(shutil.which("zstd") is None, reason="needs the zstd program")


@pytest.fixture
def packed(tmp_path):
    wheel = tmp_path / "sglang_kernel-0-cp310-abi3-any.whl"
    library = bytes(range(256)) * 4096 + b"FA3" * 1000
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(fa3_kernel.MEMBER, library)
        zf.writestr("sgl_kernel/__init__.py", "")
    out = tmp_path / "packed"
    # A fast level here: the real one (-19, a 1 GiB window) takes a minute even for a small file.
    info = fa3_kernel.pack(out, wheel, "0", log=lambda _: None, zstandard_wheel=False, level=("-3",))
    return out, info, library


def test_pack_then_unpack_gives_the_library_back(packed, tmp_path):
    out, info, library = packed
    assert info["bytes"] == len(library) and info["packed_bytes"] < len(library) // 10
    assert sorted(p.name for p in out.iterdir()) == [fa3_kernel.INFO, fa3_kernel.PACKED]
    lib = fa3_kernel.unpack(out, tmp_path / "unpacked")
    assert lib.read_bytes() == library
    site = tmp_path / "site"
    (site / "sgl_kernel").mkdir(parents=True)
    assert fa3_kernel.install(lib, site)["sha256"] == info["sha256"]
    assert (site / fa3_kernel.MEMBER).read_bytes() == library


def test_a_damaged_library_is_refused(packed, tmp_path):
    out, info, _ = packed
    lib = fa3_kernel.unpack(out, tmp_path / "unpacked")
    lib.write_bytes(lib.read_bytes()[:-1] + b"X")
    with pytest.raises(SystemExit, match="is not the packed kernel's"):
        fa3_kernel.install(lib, tmp_path)
    assert json.loads((tmp_path / "unpacked" / fa3_kernel.INFO).read_text())["sha256"] == info["sha256"]
