"""FA3's kernels for the GPU proof: too big for the bundle, so they travel alone.

sglang-kernel's ``sgl_kernel/flash_ops.abi3.so`` (FA3, about 1 GiB) is what
``attention_backend="fa3"`` needs and what the bundle's slimmed sglang-kernel
leaves out. ``zstd -19 --long=30`` packs it to about 49 MB, under what one
device call carries. So a FA3 proof takes two calls on one warm machine:

1. carry the packed kernel (``pack`` made it, here) and ``unpack`` it into the
   machine's /tmp, checking its sha256;
2. carry the bundle and run the orchestrator with ``--fa3-lib`` naming the
   unpacked file: it is checked again and copied beside the bundle's
   ``sgl_kernel`` before any engine starts.

``unpack`` needs only the standard library plus either the ``zstd`` program
or the ``zstandard`` wheel that ``pack`` puts beside the kernel.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any, Optional

MEMBER = "sgl_kernel/flash_ops.abi3.so"
PACKED = "flash_ops.abi3.so.zst"
INFO = "fa3.json"
ZSTD_LEVEL = ("-19", "--long=30")
WINDOW = 1 << 31  # --long=30 needs a window of 1 GiB; allow up to 2


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def pack(
    out: Path,
    kernel_wheel: Path,
    version: str,
    log=print,
    zstandard_wheel: bool = True,
    level: tuple[str, ...] = ZSTD_LEVEL,
) -> dict:
    """``out``/flash_ops.abi3.so.zst, its fa3.json and (``zstandard_wheel``) a
    zstandard wheel for a machine without the zstd program (here, no GPU)."""
    if shutil.which("zstd") is None:
        raise SystemExit("packing FA3's kernels needs the zstd program (apt-get install zstd)")
    out.mkdir(parents=True, exist_ok=True)
    raw = out / "flash_ops.abi3.so"
    with zipfile.ZipFile(kernel_wheel) as wheel, wheel.open(MEMBER) as src, open(raw, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 24)
    info: dict[str, Any] = {
        "file": MEMBER,
        "sha256": _sha256(raw),
        "bytes": raw.stat().st_size,
        "sglang_kernel": version,
    }
    log(f"packing {raw.stat().st_size / 2**20:.0f} MiB with zstd {' '.join(level)} (a few minutes)")
    subprocess.run(["zstd", *level, "-T0", "-q", "-f", str(raw), "-o", str(out / PACKED)], check=True)
    raw.unlink()
    if zstandard_wheel:
        _download_zstandard(out, log)
    info["packed_bytes"] = (out / PACKED).stat().st_size
    (out / INFO).write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
    log(f"{out / PACKED}: {info['packed_bytes'] / 2**20:.1f} MiB")
    return info


def _download_zstandard(out: Path, log) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.12",
            "--implementation",
            "cp",
            "--platform",
            "manylinux_2_17_x86_64",
            "--platform",
            "manylinux2014_x86_64",
            "-d",
            str(out),
            "zstandard",
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        log(f"no zstandard wheel beside the kernel ({proc.stderr.strip()[-200:]}): unpack needs the zstd program")


def _decompress(src: Path, dest: Path, wheels: Path) -> None:
    if shutil.which("zstd") is not None:
        subprocess.run(["zstd", "-d", "--long=31", "-q", "-f", str(src), "-o", str(dest)], check=True)
        return
    wheel = next(iter(sorted(wheels.glob("zstandard-*.whl"))), None)
    if wheel is None:
        raise SystemExit("neither the zstd program nor a zstandard wheel is here")
    site = dest.parent / "zstandard-site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(site), str(wheel)],
        check=True,
    )
    sys.path.insert(0, str(site))
    import zstandard

    with open(src, "rb") as fin, open(dest, "wb") as fout:
        zstandard.ZstdDecompressor(max_window_size=WINDOW).copy_stream(fin, fout)


def unpack(src: Path, dest: Path) -> Path:
    """Unpack the carried kernel into ``dest`` (on the GPU machine); check it."""
    info = json.loads((src / INFO).read_text())
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / Path(MEMBER).name
    if not target.exists() or _sha256(target) != info["sha256"]:
        _decompress(src / PACKED, target, src)
    check(target, info)
    shutil.copy2(src / INFO, dest / INFO)
    return target


def check(lib: Path, info: Optional[dict] = None) -> dict:
    """The unpacked kernel is the one packed (its sha256), or stop."""
    info = info or json.loads((lib.parent / INFO).read_text())
    got = _sha256(lib)
    if got != info["sha256"]:
        raise SystemExit(f"{lib}: sha256 {got} is not the packed kernel's {info['sha256']}")
    return info


def install(lib: Path, site: Path) -> dict:
    """Put the checked kernel beside the bundle's slimmed sgl_kernel."""
    info = check(lib)
    built_for = {d.name[len("sglang_kernel-") : -len(".dist-info")] for d in site.glob("sglang_kernel-*.dist-info")}
    if built_for and info["sglang_kernel"] not in built_for:
        raise SystemExit(
            f"FA3 library of sglang-kernel {info['sglang_kernel']}, but {site} holds "
            f"sglang-kernel {', '.join(sorted(built_for))}: pack the matching one (fa3-pack --kernel-version)"
        )
    target = site / MEMBER
    if not target.exists() or target.stat().st_size != lib.stat().st_size:
        shutil.copy2(lib, target)
    return info


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["unpack"])
    ap.add_argument("--src", required=True, type=Path, help="the folder pack wrote (carried by the device call)")
    ap.add_argument("--dest", default=Path("/tmp/pk_fa3"), type=Path)
    args = ap.parse_args(argv)
    lib = unpack(args.src, args.dest)
    print(f"{lib}: {lib.stat().st_size} bytes, sha256 checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
