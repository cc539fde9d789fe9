"""Write patchkit/known_releases.json: the sha256 of every file the patches
touch, per sglang release, from the cached release trees
(``$PATCHKIT_CACHE_DIR/trees/<version>``, as ``patchkit fetch`` leaves them).

apply's fetch step then needs no download for a file whose bytes are a known
release's own (no vendor code in it: nothing to check). Run it again when a
patch gains a target file or a release is added:

    PYTHONPATH=. python scripts/release_hashes.py [VERSION ...]   # default: every cached release

Listed: the patches' target files and every module under srt/ that reads
the CPU seq_lens mirror (the audit tells a release's own reads by them), each
distinct content once, with the releases that ship it.
"""

from __future__ import annotations

import hashlib
import json
import sys

from patchkit import known_releases, registry
from patchkit.api.matrix import DEFAULT_RELEASES
from patchkit.audit import facts as audit_facts
from patchkit.fetch import cache_dir


def table(versions: list[str]) -> dict:
    targets = {t.file for p in registry.all_patches() for t in p.targets}
    trees = {}
    for version in versions:
        tree = cache_dir() / "trees" / version
        if not (tree / ".complete").exists():
            sys.exit(f"sglang {version} is not in the cache: `patchkit fetch {version}` first")
        trees[version] = audit_facts.sources(tree / "sglang")
    # The audit's modules too (those that read the mirror in some release): it tells a
    # release's own reads without the release's tree.
    files = sorted(
        targets | {rel for srt in trees.values() for rel, data in srt.items() if audit_facts.reads_mirror(data)}
    )
    out: dict = {"releases": list(trees), "files": {rel: {} for rel in files}}
    for version, srt in trees.items():
        for rel in files:
            path = cache_dir() / "trees" / version / "sglang" / rel
            data = srt.get(rel) if rel in srt else (path.read_bytes() if path.exists() else None)
            if data is not None:  # a release without the file: absent from every list of it
                out["files"][rel].setdefault(hashlib.sha256(data).hexdigest(), []).append(version)
    out["files"] = {rel: {d: " ".join(v) for d, v in shas.items()} for rel, shas in out["files"].items()}
    return out


def _release_key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else -1 for p in version.replace(".post", ".").split(".")), version


def main() -> None:
    cached = sorted(p.parent.name for p in (cache_dir() / "trees").glob("*/.complete"))
    versions = sys.argv[1:] or sorted(set(DEFAULT_RELEASES) | set(cached), key=_release_key)
    known_releases.PATH.write_text(json.dumps(table(versions), indent=1, sort_keys=True) + "\n")
    print(f"{known_releases.PATH}: {len(versions)} release(s)")


if __name__ == "__main__":
    main()
