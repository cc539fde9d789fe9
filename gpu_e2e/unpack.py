"""GPU side: the bundle's tars unpacked into trees and site folders, checked by sha256.

Kept apart from :mod:`.orchestrate` (which runs the engines) because tests and
a warm machine's reuse rules need only this part: what lies where after unpacking.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
import time
from pathlib import Path


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def unpack(tar_path: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tar_path) as tar:
        tar.extractall(dest, filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(dest)


def prepare_trees(bundle: Path, release: str, work: Path) -> dict[str, Path]:
    """``{"pristine": parent_dir, "patched": parent_dir}`` (each holds ``sglang/``);
    a reference release (upstream, no overlay) gives ``{"upstream": parent_dir}``."""
    tdir = bundle / "trees" / release
    pristine = work / release / "pristine"
    patched = work / release / "patched"
    for d in (pristine, patched):
        if d.exists():
            shutil.rmtree(d)
    unpack(tdir / "pristine.tar.gz", pristine)
    if not (tdir / "overlay.tar.gz").exists():
        log(f"{release}: upstream tree ready (the reference: no overlay)")
        return {"upstream": pristine}
    trees = {"pristine": pristine}
    for overlay_tar in sorted(tdir.glob("overlay*.tar.gz")):
        # overlay.tar.gz: every patch; overlay-minus-ID.tar.gz: every patch but ID.
        name = (
            overlay_tar.name[len("overlay-") : -len(".tar.gz")] if overlay_tar.name != "overlay.tar.gz" else "patched"
        )
        tree = work / release / name
        if tree.exists():
            shutil.rmtree(tree)
        shutil.copytree(pristine, tree)
        unpack(overlay_tar, tree)
        expected = json.loads(overlay_tar.with_name(overlay_tar.name.replace(".tar.gz", ".json")).read_text())
        for rel, sha in expected.items():
            got = hashlib.sha256((tree / "sglang" / rel).read_bytes()).hexdigest()
            if got != sha:
                raise SystemExit(f"{release}: {name} {rel} has sha256 {got}, expected {sha}")
        trees[name] = tree
        log(f"{release}: {name} tree ready ({len(expected)} patched file(s) checked)")
    return trees


def unpacked_site(bundle: Path, group: str, work: Path) -> Path:
    """The bundle's ``site/<group>.tar.xz`` (``.tar.gz`` in bundles built before) unpacked under ``work``, reused by later
    calls on a warm machine only when it is the same tar (named by its sha256: two
    bundles' "common" groups differ, e.g. 0.5.13's lacks sglang-kernel 0.4.2)."""
    tar = next(
        (t for t in (bundle / "site" / f"{group}.tar.xz", bundle / "site" / f"{group}.tar.gz") if t.exists()),
        bundle / "site" / f"{group}.tar.xz",
    )
    sha = hashlib.sha256(tar.read_bytes()).hexdigest()[:16]
    dest = work / "site" / f"{group}-{sha}"
    if not dest.exists():
        part = dest.with_name(dest.name + ".part")
        shutil.rmtree(part, ignore_errors=True)  # left by a call cut short
        unpack(tar, part)
        part.rename(dest)
    return dest
