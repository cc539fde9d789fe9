"""apply, verify and status against the floor (libcst parsing and
regenerating every file apply touches, once), through the engine and the CLI,
with a cold and a warm transform cache; `git apply` of the same change; and
with --baseline, another patchkit checkout side by side."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import libcst
from timing import Bench, baseline_cmd, patchkit_cmd, quiet, run, with_env

from patchkit import registry
from patchkit.api.applying import apply_patches
from patchkit.engine import locked_session

TARGETS = {
    "apply cold (in-process)": 1.0,
    "apply warm (in-process)": 0.1,
    "apply warm (CLI)": 0.1,
    "verify (CLI)": 0.2,
    "status (CLI)": 0.2,
}
# Against the floor measured as the CLI is (a new process: Python's start and
# libcst's import included, a fresh copy's files; issue 45): key -> target (None: the ratio only).
NEW_PROCESS_FLOOR = "floor (libcst, new process)"
NEW_PROCESS_TARGETS = {"apply cold (CLI)": 1.2, "baseline: apply cold (CLI)": None}
# The floor as a program of its own: parse and regenerate each file named, once.
FLOOR_PROGRAM = (
    "import sys, libcst\n"
    "root = sys.argv[1]\n"
    "for rel in sys.argv[2:]:\n"
    "    with open(root + '/' + rel, 'rb') as f:\n"
    "        libcst.parse_module(f.read()).bytes\n"
)


def measure(bench: Bench) -> None:
    bench.section = __name__
    patches = list(registry.all_patches())

    def apply_in_process(tree: Path) -> None:
        with locked_session(tree, quiet, "apply") as session:
            outcome = apply_patches(session, patches)
        assert outcome.changed, "apply changed nothing"

    warm = {"PATCHKIT_TRANSFORM_CACHE": str(bench.warm_cache)}
    with_env(bench.empty_cache(), apply_in_process, bench.fresh())()  # warm-up: lazy imports, registry
    patched = bench.fresh()
    with_env(warm, apply_in_process, patched)()  # also fills the warm cache
    bench.patched = patched
    state = json.loads((patched / ".patchkit" / "state.json").read_text())
    # The files apply changed (not the runtime files it adds: nothing to parse there).
    bench.touched = sorted(rel for rel in state["files"] if (bench.pristine / rel).is_file())
    sources = {rel: (bench.pristine / rel).read_bytes() for rel in bench.touched}

    def floor() -> None:
        for rel in bench.touched:
            libcst.parse_module(sources[rel]).bytes  # noqa: B018 - the floor: a parse and its code generation

    def reports() -> None:
        with locked_session(patched, quiet) as session:
            session.reports()

    cmd = patchkit_cmd()
    diff = run([*cmd, "diff", str(patched)]).stdout
    patch_file = bench.work / "change.diff"
    patch_file.write_bytes(diff)
    bench.diff_lines = diff.count(b"\n")
    floor()  # libcst's lazy imports
    n = len(bench.touched)
    serial = {"PATCHKIT_JOBS": "1"}
    steps = [
        ("floor (libcst)", f"parse_module(data).bytes of the {n} touched files, one process", lambda: (floor,)),
        (
            NEW_PROCESS_FLOOR,
            "the same in a new `python -c` process (start-up, libcst's import, reading a fresh copy's "
            "files), as the CLI is measured",
            lambda: (run, [sys.executable, "-c", FLOOR_PROGRAM, str(bench.fresh()), *bench.touched]),
        ),
        (
            "apply cold (in-process)",
            "engine apply, fresh copy, empty transform cache (parallel)",
            lambda: (with_env(bench.empty_cache(), apply_in_process, bench.fresh()),),
        ),
        (
            "apply cold, 1 process (in-process)",
            "the same with PATCHKIT_JOBS=1",
            lambda: (with_env({**bench.empty_cache(), **serial}, apply_in_process, bench.fresh()),),
        ),
        (
            "apply warm (in-process)",
            "engine apply, fresh copy, files seen before",
            lambda: (with_env(warm, apply_in_process, bench.fresh()),),
        ),
        (
            "apply cold (CLI)",
            "`patchkit apply` subprocess, fresh copy, empty cache",
            lambda: (run, [*cmd, "-q", "apply", str(bench.fresh())], (0,), {**os.environ, **bench.empty_cache()}),
        ),
        (
            "apply warm (CLI)",
            "`patchkit apply` subprocess, fresh copy, warm cache",
            lambda: (run, [*cmd, "-q", "apply", str(bench.fresh())], (0,), {**os.environ, **warm}),
        ),
        (
            "verify (CLI)",
            "`patchkit verify` subprocess, patched tree",
            lambda: (run, [*cmd, "-q", "verify", str(patched)], (0, 1)),
        ),
        (
            "status (CLI)",
            "`patchkit status` subprocess, patched tree",
            lambda: (run, [*cmd, "-q", "status", str(patched)]),
        ),
        ("verify/status (in-process)", "engine reports() on the patched tree", lambda: (reports,)),
        (
            "git apply",
            f"`git apply` of `patchkit diff` ({bench.diff_lines} lines), fresh checkout copy",
            lambda: (lambda root: run(["git", "apply", str(patch_file)], cwd=root), bench.fresh("checkout")),
        ),
    ]
    if bench.args.baseline:
        bcmd, benv = baseline_cmd(Path(bench.args.baseline))
        bpatched = bench.fresh()
        run([*bcmd, "-q", "apply", str(bpatched)], env=benv)
        steps += [
            (
                "baseline: apply cold (CLI)",
                f"`patchkit apply` of {bench.args.baseline}, fresh copy, empty cache",
                lambda: (run, [*bcmd, "-q", "apply", str(bench.fresh())], (0,), {**benv, **bench.empty_cache()}),
            ),
            (
                "baseline: apply (CLI)",
                f"`patchkit apply` of {bench.args.baseline}, fresh copy",
                lambda: (run, [*bcmd, "-q", "apply", str(bench.fresh())], (0,), benv),
            ),
            (
                "baseline: verify (CLI)",
                f"`patchkit verify` of {bench.args.baseline}, its patched tree",
                lambda: (run, [*bcmd, "-q", "verify", str(bpatched)], (0, 1), benv),
            ),
        ]
    bench.rounds(bench.runs, steps, "apply/verify/status/floor")


def report(bench: Bench) -> list[str]:
    floor_w, floor_c = bench.med("floor (libcst)"), bench.med("floor (libcst)", cpu=True)
    new_w = bench.med(NEW_PROCESS_FLOOR) if NEW_PROCESS_FLOOR in bench.wall else None
    lines = [
        "| measurement | wall | vs floor | CPU | vs floor | target |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for key in bench.keys_of(__name__):
        w, c = bench.med(key), bench.med(key, cpu=True)
        verdict = ""
        if key in TARGETS:
            verdict = f"<= {TARGETS[key]}x: {'met' if w / floor_w <= TARGETS[key] else 'MISSED'} (wall)"
        if key in NEW_PROCESS_TARGETS and new_w:
            ratio, target = w / new_w, NEW_PROCESS_TARGETS[key]
            verdict = (
                f"{ratio:.2f}x the new-process floor (wall; CPU {c / bench.med(NEW_PROCESS_FLOOR, cpu=True):.2f}x)"
            )
            if target is not None:
                verdict += f": <= {target}x {'met' if ratio <= target else 'MISSED'}"
        lines.append(
            f"| {key} | {w * 1000:.0f} ms | {w / floor_w:.2f}x | {c * 1000:.0f} ms | {c / floor_c:.2f}x | {verdict} |"
        )
    return lines
