"""patchkit benchmark on a real tree (sglang 0.5.12.post1, fetched at run time).

    python scripts/bench [--runs N] [--version V] [--baseline DIR] [--matrix-releases ...]
                            [--matrix-runs N] [--no-matrix] [--no-profile] [--only export] [--json FILE]

One module per thing measured: apply_cost (apply, verify, status, the floor,
git apply, the baseline), patch_cost (what one more patch costs),
import_cost (the runtime's import cost), export_cost (`patchkit export`,
cold and warm), matrix_cost (`patchkit matrix`), profile_apply (where an
apply's time goes); timing is the shared harness.
Medians of N runs (default 5), side by side with the floor:

- apply, all patches, on a fresh copy: in-process through the engine
  (``locked_session(...).apply``; modules already imported, one warm-up run
  not counted) and through the CLI in a subprocess (start-up included);
  cold (an empty transform cache, fresh for every run: every file parsed and
  transformed, in parallel processes), cold with one process
  (``PATCHKIT_JOBS=1``: the work itself), and warm (the transform cache has
  seen these files: no parse at all);
- with ``--baseline DIR`` (a checkout of another patchkit, e.g. the commit
  before a change): its CLI apply and verify in the same rounds, and its matrix;
- verify and status on a patched tree (CLI subprocess and in-process);
- the floor: parse and regenerate every file apply touches, once, with
  libcst (``libcst.parse_module(data).bytes``) in one process; and the same
  in a new ``python -c`` process on a fresh copy, measured as the CLI is
  (Python's start and libcst's import included): the cold CLI apply's floor;
- ``git apply`` of the same change as a unified diff (``patchkit diff``);
- what one more patch costs, counted (parses, regenerations, detections,
  transforms): for each patch no other requires, a cold one-process apply of
  every patch against one without it, beside that patch's own transform (its
  codemods alone over its files), whose CPU time is timed;
- import cost of ``patchkit.runtime`` / ``patchkit.backends`` (every
  submodule) in a fresh interpreter, against bare ``python -c pass``;
- ``patchkit export`` of a patched tree from the CLI: cold (empty transform
  cache), after apply (the cache the apply left) and warm (an export before);
- ``patchkit matrix`` over the releases (default: all 16) with ``-j 2``: cold
  and warm transform cache, and the baseline's;
- a cProfile summary of one in-process apply (where the time goes).

Targets (issue 12), in wall time: cold apply <= 1.0x floor (CPU time shown
next to it: both cores are used), warm apply <= 0.1x, verify/status from the
CLI <= 0.2x; runtime import < 10 ms; (issue 45) the cold CLI apply <= 1.2x the
new-process floor.
Copies are made outside the timed region. The machine's load average is
printed: other processes running at the same time skew every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Optional

import apply_cost
import export_cost
import import_cost
import matrix_cost
import patch_cost
import profile_apply
from timing import ROOT, Bench

from patchkit import registry


def _version(dist: str) -> str:
    from importlib.metadata import version

    try:
        return version(dist)
    except Exception:  # noqa: BLE001 - a figure in the header, never a failure
        return "?"


# What each module measures, in the order run and reported (--only picks some).
MODULES = {
    "apply": apply_cost,
    "patch": patch_cost,
    "import": import_cost,
    "export": export_cost,
    "matrix": matrix_cost,
}


def report(bench: Bench, profile: Optional[str]) -> str:
    lines = [
        f"patchkit bench: sglang {bench.args.version}, {len(registry.all_patches())} patches, "
        + (f"{len(bench.touched)} files touched, " if hasattr(bench, "touched") else "")  # measured by apply_cost
        + f"{bench.runs} interleaved rounds (medians)",
        f"python {sys.version.split()[0]}, libcst {_version('libcst')}, {os.cpu_count()} CPUs, patchkit bytecode "
        f"precompiled (as installed), "
        f"load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
    ]
    for module in MODULES.values():
        if bench.keys_of(module.__name__):
            lines += ["", *module.report(bench)]
    if profile:
        lines += ["", profile]
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default="0.5.12.post1", help="sglang release (default 0.5.12.post1)")
    parser.add_argument("--runs", type=int, default=5, help="runs per measurement (median; default 5)")
    parser.add_argument(
        "--matrix-releases",
        nargs="+",
        default=matrix_cost.RELEASES,
        help="releases for the matrix measurement (default: all)",
    )
    parser.add_argument("--matrix-runs", type=int, default=1, help="runs of each matrix measurement (default 1)")
    parser.add_argument(
        "--baseline",
        help="a checkout of another patchkit to measure side by side (e.g. `git worktree add /tmp/base <commit>`)",
    )
    parser.add_argument("--no-matrix", action="store_true", help="skip the matrix measurement")
    parser.add_argument("--no-profile", action="store_true", help="skip the cProfile summary")
    parser.add_argument(
        "--only",
        action="append",
        choices=list(MODULES),
        help="measure only this (repeatable; implies --no-profile); default: all",
    )
    parser.add_argument("--json", help="also write the raw figures here")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    args = parser.parse_args(argv)
    # An installed patchkit has bytecode (pip compiles it at install); a source
    # checkout under PYTHONDONTWRITEBYTECODE=1 would recompile every module on
    # every CLI start. Compile both trees measured, so both start as installed.
    import compileall

    for root in [ROOT] + ([Path(args.baseline)] if args.baseline else []):
        compileall.compile_dir(str(root / "patchkit"), quiet=1)
    bench = Bench(args)
    try:
        for name, module in MODULES.items():
            if name in (args.only or MODULES) and not (name == "matrix" and args.no_matrix):
                module.measure(bench)
        profile = None if args.no_profile or args.only else profile_apply.profile_apply(bench)
        sys.stdout.write(report(bench, profile))
        if args.json:
            Path(args.json).write_text(
                json.dumps(
                    {
                        "version": args.version,
                        "runs": args.runs,
                        "loadavg": os.getloadavg(),
                        "wall_s": bench.wall,
                        "cpu_s": bench.cpu,
                        "what": bench.what,
                        "touched": getattr(bench, "touched", None),
                        "importtime": getattr(bench, "importtime", None),
                    },
                    indent=2,
                )
            )
    finally:
        shutil.rmtree(bench.work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
