"""The kernels a GPU run compiled, carried to the next machine (after 2026-11-28h).

Every lease starts on a bare machine, so every run compiled the same kernels again: a
FlashInfer duel spent about 240 s in FlashInfer's JIT builds before its first round
(2026-11-28h: engines up in 196 s, warm-ups done 160 s later, where Triton's duel was timing
at 210 s), and an engine on fresh Triton and inductor caches started in 165 s where the same
engine on the caches its lane had left took 86 s (FA3 8B, ``start_s`` of fa3_8b_duel-r1 and -r3).

``pack`` (on the GPU machine, at the end of a run) puts the lanes' caches into one tar.gz:

- ``triton/``: every lane's ``TRITON_CACHE_DIR`` entries (one folder a kernel, named by its
  hash; the first lane's copy of a name is kept);
- ``inductor/``: every lane's ``TORCHINDUCTOR_CACHE_DIR`` files, by relative path;
- ``flashinfer/VERSION/ARCH/NAME/NAME.so``: each module FlashInfer's JIT built
  (``FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/VERSION/ARCH/cached_ops/NAME/NAME.so``).

``install`` (on the next machine, before the plan) puts triton/ and inductor/ into each lane's
folders and the FlashInfer modules into a ``flashinfer_jit_cache`` package of its own, which
FlashInfer reads as its ahead-of-time modules (``flashinfer.jit.env._get_aot_dir``: a module
found there is loaded, never built). That package answers for the FlashInfer it is imported
by: its ``__version__`` is that distribution's, and its folder is ``aot/VERSION/ARCH`` of that
version, so 0.5.17's FlashInfer never loads 0.5.12.post1's modules. The runners see it through
``PK_E2E_EXTRA_SITE`` (launch.py: after every site, so it shadows nothing).

The tar travels like a bundle: ``bundle_parts.py split`` there (parts a call brings back),
``bundle_parts.py join`` here; ``scripts/gpu_e2e.py split`` here and ``join`` there next time.
What a cache holds is keyed by what built it (Triton and inductor hash their sources, options
and versions; FlashInfer names a module by its parameters, and the version and arch are in the
path), so a stale entry is compiled again, not used. Standard library only.

plan.sh does both (``HARVEST=1``, ``CACHES=PATH``). The calls around it:

    # last call of a lease, after "all done" (4 parts a call: 8 files, 64 MiB back)
    cp -r /tmp/caches-[a-d] "$OUT"/
    # here: the parts into one folder (sha256 checked), kept out of git
    python3 gpu_e2e/bundle_parts.py join --part /work/.device/N/caches-a ... --dest .gpucaches
    python scripts/gpu_e2e.py split --folder .gpucaches --part-mib 40
    # next lease, before the call that starts the plan (its install runs once, at the start)
    python3 gpu_e2e/bundle_parts.py join --part .gpucaches-a --dest /tmp/caches-in
    CACHES=/tmp/caches-in/caches.tar.gz ... bash /tmp/plan.sh
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Optional

SHIM = "flashinfer_jit_cache"
SHIM_INIT = '''"""FlashInfer modules an earlier GPU machine built, as FlashInfer's ahead-of-time modules
(written by patchkit's gpu_e2e/compile_caches.py install)."""

import importlib.metadata
import os
from pathlib import Path

try:
    __version__ = importlib.metadata.version("flashinfer-python")
except importlib.metadata.PackageNotFoundError:  # no modules for an unknown version
    __version__ = "unknown"
    os.environ["FLASHINFER_DISABLE_VERSION_CHECK"] = "1"


def get_jit_cache_dir() -> str:
    """aot/VERSION/ARCH of the FlashInfer importing this, where one arch was packed."""
    root = Path(__file__).parent / "aot" / __version__
    archs = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    return str(archs[0] if len(archs) == 1 else root / "none")
'''


def _union(sources: Iterable[Path], dest: Path) -> int:
    """Copy every file under each source into ``dest`` by its relative path, the first
    source's copy kept; returns the files copied."""
    copied = 0
    for src in sources:
        if not src.is_dir():
            continue
        for path in sorted(src.rglob("*")):
            if path.is_symlink() or not path.is_file():
                continue
            target = dest / path.relative_to(src)
            if target.exists():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
            copied += 1
    return copied


def flashinfer_modules(bases: Iterable[Path]) -> dict[str, Path]:
    """``VERSION/ARCH/NAME/NAME.so`` -> the built module, over FlashInfer workspace bases."""
    found: dict[str, Path] = {}
    for base in bases:
        for so in sorted((base / ".cache" / "flashinfer").glob("*/*/cached_ops/*/*.so")):
            name = so.parent.name
            version, arch = so.parents[3].name, so.parents[2].name
            if so.name == f"{name}.so" and not so.is_symlink():
                found.setdefault(f"{version}/{arch}/{name}/{name}.so", so)
    return found


def pack(fi: list[Path], triton: list[Path], inductor: list[Path], out: Path, log=print) -> dict[str, int]:
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        stage = Path(tmp)
        counts = {"triton": _union(triton, stage / "triton"), "inductor": _union(inductor, stage / "inductor")}
        modules = flashinfer_modules(fi)
        for rel, so in modules.items():
            target = stage / "flashinfer" / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(so, target)
        counts["flashinfer"] = len(modules)
        # gzip, not xz: the pack runs on the lease's time, and xz's default level takes minutes
        # over a few hundred MB of kernels where gzip takes seconds (the transfers differ little)
        with tarfile.open(out, "w:gz", compresslevel=6) as tar:
            for top in ("triton", "inductor", "flashinfer"):
                if (stage / top).is_dir():
                    tar.add(stage / top, arcname=top)
    log(f"{out}: {out.stat().st_size / 2**20:.1f} MiB; files: {counts}")
    return counts


def install(src: Path, triton: list[Path], inductor: list[Path], flashinfer_site: Optional[Path], log=print) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp)
        with tarfile.open(src, "r:gz") as tar:
            # the "data" filter: no member lands outside the stage, no links out, no devices
            tar.extractall(stage, filter="data")
        counts = {
            "triton": sum(_union([stage / "triton"], d) for d in triton),
            "inductor": sum(_union([stage / "inductor"], d) for d in inductor),
            "flashinfer": 0,
        }
        if flashinfer_site is not None:
            package = flashinfer_site / SHIM
            package.mkdir(parents=True, exist_ok=True)
            counts["flashinfer"] = _union([stage / "flashinfer"], package / "aot")
            (package / "__init__.py").write_text(SHIM_INIT)
    log(f"{src}: installed {counts}")
    return counts


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="the lanes' caches into one tar.gz")
    p.add_argument("--fi", type=Path, action="append", default=[], help="a FLASHINFER_WORKSPACE_BASE")
    p.add_argument("--triton", type=Path, action="append", default=[], help="a TRITON_CACHE_DIR")
    p.add_argument("--inductor", type=Path, action="append", default=[], help="a TORCHINDUCTOR_CACHE_DIR")
    p.add_argument("--out", type=Path, required=True)
    i = sub.add_parser("install", help="a packed tar.gz into the lanes' cache folders")
    i.add_argument("--src", type=Path, required=True)
    i.add_argument("--triton", type=Path, action="append", default=[], help="a lane's TRITON_CACHE_DIR")
    i.add_argument("--inductor", type=Path, action="append", default=[], help="a lane's TORCHINDUCTOR_CACHE_DIR")
    i.add_argument("--flashinfer-site", type=Path, help="where the flashinfer_jit_cache package is written")
    args = ap.parse_args(argv)
    if args.cmd == "pack":
        pack(args.fi, args.triton, args.inductor, args.out)
    else:
        install(args.src, args.triton, args.inductor, args.flashinfer_site)
    return 0


if __name__ == "__main__":
    sys.exit(main())
