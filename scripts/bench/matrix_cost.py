"""`patchkit matrix` over releases with -j 2: a cold and a warm transform
cache, and with --baseline the other checkout's matrix."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from timing import ROOT, Bench, run

from patchkit.api.matrix import DEFAULT_RELEASES
from patchkit.fetch import fetch_tree

RELEASES = list(DEFAULT_RELEASES)


def measure(bench: Bench) -> None:
    bench.section = __name__
    releases = bench.args.matrix_releases
    for v in releases:
        fetch_tree(v)
    script = [sys.executable, str(ROOT / "scripts" / "matrix.py"), "-q", "--format", "json", *releases, "-j", "2"]
    k = len(releases)
    mwarm = {**os.environ, "PATCHKIT_TRANSFORM_CACHE": str(bench.work / "matrix-cache")}
    run(script, (0, 1), mwarm)  # fills that cache
    steps = [
        (
            f"matrix x{k} -j 2, cold cache",
            " ".join(releases),
            lambda: (run, script, (0, 1), {**os.environ, **bench.empty_cache()}),
        ),
        (f"matrix x{k} -j 2, warm cache", " ".join(releases), lambda: (run, script, (0, 1), mwarm)),
    ]
    if bench.args.baseline:
        base = Path(bench.args.baseline)
        bscript = [sys.executable, str(base / "scripts" / "matrix.py"), *script[2:]]
        steps.append(
            (
                f"matrix x{k} -j 2, baseline",
                str(base),
                lambda: (run, bscript, (0, 1), {**os.environ, "PYTHONPATH": str(base)}),
            )
        )
    bench.rounds(bench.args.matrix_runs, steps, "matrix")


def report(bench: Bench) -> list[str]:
    keys = bench.keys_of(__name__)
    return [
        f"| patchkit matrix ({bench.args.matrix_runs} run(s), median) | wall | CPU (all processes) |",
        "|---|---:|---:|",
    ] + [f"| {k} | {bench.med(k):.1f} s | {bench.med(k, True):.1f} s |" for k in keys]
