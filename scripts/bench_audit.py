#!/usr/bin/env python3
"""Whole-tree ``patchkit audit`` times on a real release, pristine and patched.

    python scripts/bench_audit.py [RELEASE] [--repeat N]

For each tree (a private copy of the cached release; the patched one applied
first, not timed), two measures:

* ``cli``: wall time of a fresh ``python -m patchkit audit TREE --format json``
  process (interpreter start and imports included). Cold: an empty audit cache
  (``PATCHKIT_TRANSFORM_CACHE`` points at a new folder), so every module that
  names the mirror is parsed; warm: the same command again, the per-module
  facts read back from that cache (the median of ``--repeat`` runs).
* ``in-process``: ``audit_tree`` alone in one process: the first call (cold,
  nothing cached in memory or on disk), then the median of the next calls.

Needs the release in patchkit's cache (``patchkit fetch RELEASE``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

IN_PROCESS = """
import statistics, sys, time
from pathlib import Path
from patchkit.audit import audit_tree
package, repeat = Path(sys.argv[1]), int(sys.argv[2])
start = time.perf_counter(); result = audit_tree(package); cold = time.perf_counter() - start
warm = []
for _ in range(repeat):
    start = time.perf_counter(); audit_tree(package); warm.append(time.perf_counter() - start)
print(cold, statistics.median(warm), len(result.modules), len(result.reads), len(result.problems))
"""


def _cli(tree: Path, env: dict) -> float:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "patchkit", "audit", str(tree), "--format", "json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
    )
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(proc.stderr.decode())
    return took


def measure(label: str, tree: Path, repeat: int, scratch: Path) -> None:
    from patchkit.tree import find_tree

    package = find_tree(tree).package
    env = dict(os.environ, PATCHKIT_TRANSFORM_CACHE=str(Path(tempfile.mkdtemp(dir=scratch))))
    cli_cold = _cli(tree, env)
    cli_warm = statistics.median(_cli(tree, env) for _ in range(repeat))
    env = dict(os.environ, PATCHKIT_TRANSFORM_CACHE=str(Path(tempfile.mkdtemp(dir=scratch))))
    out = subprocess.run(
        [sys.executable, "-c", IN_PROCESS, str(package), str(repeat)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    cold, warm, modules, reads, problems = float(out[0]), float(out[1]), *map(int, out[2:])
    files = sum(1 for _ in (package / "srt").rglob("*.py"))
    print(
        f"{label:9} {files:5} modules, {modules:3} read the mirror, {reads:4} reads, {problems:3} problems | "
        f"cli cold {cli_cold:5.2f}s warm {cli_warm:5.2f}s | in-process cold {cold:5.2f}s warm {warm:5.2f}s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("release", nargs="?", default="0.5.12.post1")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from patchkit.fetch import copy_tree

    print(f"sglang {args.release}, {os.cpu_count()} CPU(s), python {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        pristine = copy_tree(args.release, scratch / "pristine")
        patched = copy_tree(args.release, scratch / "patched")
        subprocess.run(
            [sys.executable, "-m", "patchkit", "-q", "apply", str(patched)],
            cwd=ROOT,
            check=True,
            env=dict(os.environ, PATCHKIT_TRANSFORM_CACHE=str(scratch / "transforms")),
        )
        measure("pristine", pristine, args.repeat, scratch)
        measure("patched", patched, args.repeat, scratch)


if __name__ == "__main__":
    main()
