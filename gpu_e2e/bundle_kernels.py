"""sglang-kernel libraries the slimmed bundle leaves out, carried inside it (issue 44).

The bundle keeps only sglang-kernel's sm90 ``common_ops``; FA3's library (about
1 GiB) travels on its own (:mod:`.fa3_kernel`). FlashMLA's ``flashmla_ops`` is
13 MiB, about 4 MiB gzipped, so it fits in a bundle: ``bundle --kernel flashmla``
puts it under ``kernels/`` with its sha256, and the orchestrator puts it back
beside the bundle's ``sgl_kernel`` (checked) before any engine starts. Standard
library only on both sides.

Whole wheels travel the same way (``bundle --wheel NAME``, :data:`WHEELS`): a package one
model's path needs and the release site leaves out, unpacked into the common site before
the engines start. Issue 72: DeepSeek sparse attention's indexer (``nsa/nsa_indexer.py``)
imports ``deep_gemm`` at module level on CUDA; 0.5.12.post1 pins sgl-deep-gemm 0.1.0, which
the Llama bundles (and so their sites) do without.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import zipfile
from pathlib import Path

#: Short name -> the wheel member it carries.
KERNELS = {"flashmla": "sgl_kernel/flashmla_ops.abi3.so"}
#: Distribution -> the version a bundle carries whole (0.5.12.post1's pin).
WHEELS = {"sgl-deep-gemm": "0.1.0"}
FOLDER = "kernels"
INDEX = "kernels.json"
WHEEL_INDEX = "wheels.json"


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def member_of(name: str) -> str:
    if name not in KERNELS:
        raise SystemExit(f"unknown kernel {name!r} (known: {', '.join(KERNELS)})")
    return KERNELS[name]


def add(dest: Path, wheel: Path, names) -> dict:
    """Write ``dest/kernels/<file>.gz`` for each name and their index; returns it."""
    folder = Path(dest) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    index = {}
    with zipfile.ZipFile(wheel) as zf:
        for name in names:
            member = member_of(name)
            data = zf.read(member)
            packed = folder / (Path(member).name + ".gz")
            with gzip.open(packed, "wb", compresslevel=9) as fh:
                fh.write(data)
            index[member] = {"sha256": _sha256_bytes(data), "bytes": len(data), "packed": packed.name}
    (folder / INDEX).write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    return index


def add_wheels(dest: Path, wheels: dict) -> dict:
    """Copy each ``{distribution: wheel path}`` under ``dest/kernels/`` and index them."""
    folder = Path(dest) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    index = {}
    for name, wheel in sorted(wheels.items()):
        if name not in WHEELS:
            raise SystemExit(f"unknown wheel {name!r} (known: {', '.join(WHEELS)})")
        shutil.copy2(wheel, folder / Path(wheel).name)
        index[name] = {"file": Path(wheel).name, "sha256": _sha256_bytes(Path(wheel).read_bytes())}
    (folder / WHEEL_INDEX).write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    return index


def install_wheels(bundle: Path, site: Path) -> list[str]:
    """Unpack every carried wheel into ``site`` (checked; once: a marker holds its sha256)."""
    folder = Path(bundle) / FOLDER
    if not (folder / WHEEL_INDEX).exists():
        return []
    done = []
    for name, info in sorted(json.loads((folder / WHEEL_INDEX).read_text()).items()):
        marker = Path(site) / f".pk-wheel-{name}"
        if not (marker.exists() and marker.read_text() == info["sha256"]):
            wheel = folder / info["file"]
            got = _sha256_bytes(wheel.read_bytes())
            if got != info["sha256"]:
                raise SystemExit(f"{info['file']}: sha256 {got} is not the carried wheel's {info['sha256']}")
            with zipfile.ZipFile(wheel) as zf:
                zf.extractall(site)
            marker.write_text(info["sha256"])
        done.append(info["file"])
    return done


def install(bundle: Path, site: Path) -> list[str]:
    """Unpack every carried kernel into ``site`` (where sgl_kernel is), and every carried
    wheel; check each. Returns what was installed (none when the bundle carries none)."""
    folder = Path(bundle) / FOLDER
    wheels = install_wheels(bundle, site)
    if not (folder / INDEX).exists():
        return wheels
    index = json.loads((folder / INDEX).read_text())
    done = []
    for member, info in sorted(index.items()):
        target = Path(site) / member
        if not (target.exists() and _sha256_bytes(target.read_bytes()) == info["sha256"]):
            part = target.with_name(target.name + ".part")
            with gzip.open(folder / info["packed"], "rb") as src, open(part, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 22)
            got = _sha256_bytes(part.read_bytes())
            if got != info["sha256"]:
                raise SystemExit(f"{member}: sha256 {got} is not the carried kernel's {info['sha256']}")
            part.chmod(0o755)
            part.rename(target)
        done.append(member)
    return wheels + done
