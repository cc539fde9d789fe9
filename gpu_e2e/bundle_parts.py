"""A folder bigger than one device call carries, in parts (issue 57: 0.5.17's bundle).

A device call carries at most 64 MiB, the checkout (about 16 MiB) included. 0.5.17's
bundle (its own flashinfer, transformers, xgrammar, deep_gemm and sglang-kernel beside a tree
twice 0.5.12.post1's) and FA3's packed library are bigger than what is left, so they
travel in parts, one call each, on one warm machine:

    python scripts/gpu_e2e.py split --folder .gpubundle-17 --part-mib 40      # here
    # call 1, carry .gpubundle-17-a:
    python3 gpu_e2e/bundle_parts.py join --part .gpubundle-17-a --dest /tmp/b17
    # call 2, carry .gpubundle-17-b: the same with -b; it says "complete" once
    # every file is there, each checked against its sha256, and only then is
    # /tmp/b17 there (the parts gather in /tmp/b17.parts)

Files are packed whole where they fit (largest first, each into the first part with
room); a file bigger than a part is cut into chunks that ``join`` puts back together.
Every part holds the same index (``parts.json``: each file's size, sha256 and chunks),
so the parts may come in any order. Standard library only (``join`` runs on the GPU
machine from the checkout, before any bundle is unpacked).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path
from typing import Optional

INDEX = "parts.json"
MIB = 1024 * 1024
#: What a part may hold by default: 64 MiB less the checkout and some room. 40, not
#: 46: the checkout grows (17.9 MiB on 2026-11-27, results included), and the device
#: refused a 45.9 MiB part beside it as over 64 MiB (issue 57's first calls).
PART_BYTES = 40 * MIB


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _letters(n: int) -> list[str]:
    if n > 26:
        raise SystemExit(f"{n} parts: at most 26")
    return [chr(ord("a") + i) for i in range(n)]


def split(folder: Path, part_bytes: int = PART_BYTES, log=print) -> list[Path]:
    """Write ``<folder>-a``, ``<folder>-b``, … beside ``folder``; returns them."""
    folder = Path(folder)
    room = part_bytes - 64 * 1024  # the index, in every part
    if room <= 0:
        raise SystemExit(f"a part of {part_bytes} bytes leaves no room beside its index")
    files = {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()}
    index: dict = {"source": folder.name, "files": {}}
    pieces = []  # (name in the part, source file, offset, size)
    for rel, path in files.items():
        size = path.stat().st_size
        entry: dict = {"bytes": size, "sha256": _sha256(path), "chunks": []}
        if size <= room:
            pieces.append((rel, path, 0, size))
        else:
            for i, offset in enumerate(range(0, size, room)):
                name = f"{rel}.chunk-{i:02d}"
                entry["chunks"].append(name)
                pieces.append((name, path, offset, min(room, size - offset)))
        index["files"][rel] = entry
    bins: list[list] = []
    for piece in sorted(pieces, key=lambda p: -p[3]):
        target = next((b for b in bins if sum(p[3] for p in b) + piece[3] <= room), None)
        if target is None:
            bins.append(target := [])
        target.append(piece)
    parts = []
    for letter, content in zip(_letters(len(bins)), bins):
        part = folder.with_name(f"{folder.name}-{letter}")
        if part.exists():
            shutil.rmtree(part)
        for name, path, offset, size in content:
            out = part / name
            out.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "rb") as src, open(out, "wb") as dst:
                src.seek(offset)
                dst.write(src.read(size))
        (part / INDEX).write_text(
            json.dumps(
                {**index, "part": letter, "parts": len(bins), "holds": sorted(p[0] for p in content)},
                indent=1,
                sort_keys=True,
            )
            + "\n"
        )
        total = sum(p.stat().st_size for p in part.rglob("*") if p.is_file())
        log(f"{part}: {total / MIB:.1f} MiB, {len(content)} file(s) or chunk(s)")
        parts.append(part)
    return parts


def join(part: Path, dest: Path) -> list[str]:
    """Copy one part in and put together every file whose pieces are all there (each
    checked against its sha256). The parts gather in ``<dest>.parts``, which becomes
    ``dest`` once every file is there, so a folder at ``dest`` is always whole (a plan
    waiting for it may start at once). Returns the files still missing."""
    part, dest = Path(part), Path(dest)
    index = json.loads((part / INDEX).read_text())
    if dest.exists():
        raise SystemExit(f"{dest} is there already: remove it to join again")
    staging = dest.with_name(dest.name + ".parts")
    staging.mkdir(parents=True, exist_ok=True)
    for name in index["holds"]:
        target = (staging / name).resolve()
        if staging.resolve() not in target.parents:
            raise SystemExit(f"{name}: outside {staging}")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(part / name, target)
    missing = []
    for rel, entry in sorted(index["files"].items()):
        target = staging / rel
        chunks = [staging / c for c in entry["chunks"]]
        if chunks and all(c.exists() for c in chunks):
            joining = target.with_name(target.name + ".joining")
            with open(joining, "wb") as out:
                for chunk in chunks:
                    with open(chunk, "rb") as src:
                        shutil.copyfileobj(src, out, 1 << 22)
            joining.rename(target)
            for chunk in chunks:
                chunk.unlink()
        if not target.exists() or target.stat().st_size != entry["bytes"]:
            missing.append(rel)
        elif _sha256(target) != entry["sha256"]:
            raise SystemExit(f"{target}: sha256 is not the one split ({entry['sha256']})")
    if not missing:
        staging.rename(dest)
    return missing


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["join", "split"])
    ap.add_argument("--part", type=Path, action="append", help="join: a part folder carried by this call (repeatable)")
    ap.add_argument("--dest", type=Path, help="join: where the whole folder is put together")
    # split on the GPU machine: what a call brings back is files of 16 MiB at most
    # (compile_caches.py's tar, after a run)
    ap.add_argument("--folder", type=Path, help="split: the folder to cut into <folder>-a, -b, ...")
    ap.add_argument("--part-mib", type=float, default=PART_BYTES / MIB, help="split: a part's size")
    args = ap.parse_args(argv)
    if args.command == "split":
        if args.folder is None:
            ap.error("split needs --folder")
        split(args.folder, int(args.part_mib * MIB))
        return 0
    if not args.part or args.dest is None:
        ap.error("join needs --part and --dest")
    for part in args.part:  # every part named is joined, in the order given
        missing = join(part, args.dest)
        if missing:
            print(
                f"{args.dest}: part {json.loads((part / INDEX).read_text())['part']} in; "
                f"{len(missing)} file(s) still to come: {', '.join(missing)}"
            )
        else:
            print(f"{args.dest}: complete, every file's sha256 checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
