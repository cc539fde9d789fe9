"""What one more patch costs. Issue 32's aim: as patches are added, an apply
costs the sum of their own transforms and nothing more (no re-parse, no
re-detection of the other patches' codemods per patch).

For each patch no other patch requires (the newest patch of a set is always
one), a cold one-process apply of every patch and one without it are
counted: ``parse_module`` calls (files and the snippets codemods insert),
modules regenerated, codemod detections and transforms (call counts from
cProfile: exact and repeatable, where this machine's CPU time varies by a
fifth from run to run, more than one patch's share). The difference is set
beside what the patch's own transform does: what an apply does for each of
its files (``transform.parallel.compute``: detection, transform,
postconditions, compile) with its codemods only, less the parse and
regeneration of files another patch touches too. Added <= own: the patch
adds its own work and nothing more (less where it shares a codemod with
another patch). Its own transform's CPU time is timed too (medians, its
files' parses included)."""

from __future__ import annotations

import cProfile
import os
import pstats
import sys
from collections import Counter
from pathlib import Path

from timing import Bench, quiet, with_env

from patchkit import registry, transform
from patchkit.api.applying import apply_patches
from patchkit.engine import locked_session
from patchkit.transform.parallel import compute
from patchkit.transform.transformer import codemods_for

KINDS = ("parses", "regenerations", "detections", "transforms")


def _kind(filename: str, name: str) -> str | None:
    """Which counted step a profiled function is, if any."""
    path = filename.replace(os.sep, "/")
    if name == "parse_module" and path.endswith("libcst/_parser/entrypoints.py"):
        return "parses"
    if name == "_codegen_impl" and path.endswith("libcst/_nodes/module.py"):
        return "regenerations"
    if name == "detect" and "/patchkit/codemods/" in path:
        return "detections"
    if name == "transform_module" and path.endswith("patchkit/codemods/common/base.py"):
        return "transforms"
    return None


def _counted(fn, *args) -> Counter:
    """The counted steps of ``fn(*args)``, by kind (a ``detect`` that calls
    its base class's counts twice: alike in every figure compared)."""
    profile = cProfile.Profile()
    profile.runcall(fn, *args)
    counts: Counter = Counter()
    for (filename, _, name), (_, calls, *_) in pstats.Stats(profile).stats.items():
        kind = _kind(filename, name)
        if kind:
            counts[kind] += calls
    return counts


def measure(bench: Bench) -> None:
    bench.section = __name__
    patches = list(registry.all_patches())
    required = {r for p in patches for r in p.requires}
    leaves = [p for p in patches if p.id not in required]

    def apply_cold(selected: list) -> Counter:
        def run(tree: Path) -> None:
            with locked_session(tree, quiet, "apply") as session:
                apply_patches(session, selected)

        env = {**bench.empty_cache(), "PATCHKIT_JOBS": "1"}
        return _counted(with_env(env, run, bench.fresh()))

    def own_work(patch) -> tuple[list, int]:
        """The jobs of ``patch`` alone, one per file of it, each file as the
        patches before it in the full apply leave it (built here, not
        counted); and how many of its files other patches touch too (their
        parse and regeneration are the apply's anyway)."""
        before = patches[: patches.index(patch)]
        others = [p for p in patches if p is not patch]
        jobs, shared = [], 0
        for rel in patch.files:
            path = bench.pristine / rel
            if not path.is_file():
                continue
            source = path.read_bytes()
            earlier = [registry.load_codemod(c) for c in codemods_for(rel, before)]
            if earlier:
                source = transform.run(rel, path, transform.parse(source, path), earlier).new
            jobs.append((rel, (path, source, [codemods_for(rel, [patch])], None)))
            shared += bool(codemods_for(rel, others))
        return jobs, shared

    def own_transform(jobs: list) -> None:
        """What an apply does for each file, with ``patch``'s codemods only:
        detection (the plan's), transform, postconditions, compile."""
        for rel, job in jobs:
            entry = compute(rel, job)
            assert entry is not None and entry.new is not None, f"{rel}: no transform"

    apply_cold(patches)  # warm-up: lazy imports, the registry's codemod classes
    every = apply_cold(patches)
    bench.patch_counts = {}
    steps = []
    for patch in leaves:
        jobs, shared = own_work(patch)
        without = apply_cold([p for p in patches if p is not patch])
        own = _counted(own_transform, jobs)
        own.subtract({"parses": shared, "regenerations": shared})  # files another patch parses and regenerates too
        added = every.copy()
        added.subtract(without)  # kept where negative (``every - without`` would drop it)
        bench.patch_counts[patch.id] = (added, own, len(jobs) - shared)
        steps.append(
            (
                f"own transform of {patch.id}",
                f"{patch.id}'s codemods alone over its files",
                lambda jobs=jobs: (own_transform, jobs),
            )
        )
        if not bench.args.quiet:
            print(f"  what one more patch costs: counted {patch.id}", file=sys.stderr, flush=True)
    bench.every_counts = every
    bench.rounds(bench.runs, steps, "own transforms")


def report(bench: Bench) -> list[str]:
    every = ", ".join(f"{bench.every_counts[k]} {k}" for k in KINDS)
    lines = [
        f"What one more patch costs (an apply of every patch: {every}). Per patch no other requires: "
        "what the apply does with it and not without it, and what its own transform does (its codemods "
        "alone over its files). Added <= own: the patch adds its own work and nothing more.",
        "",
        "| patch | files only it touches | parses added / own | regenerations added / own | detections added / own "
        "| transforms added / own | own transform, CPU |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for pid, (added, own, alone) in bench.patch_counts.items():
        cpu = bench.med(f"own transform of {pid}", cpu=True)
        lines.append(
            f"| {pid} | {alone} | {added['parses']} / {own['parses']} | {added['regenerations']} / {own['regenerations']} "
            f"| {added['detections']} / {own['detections']} | {added['transforms']} / {own['transforms']} "
            f"| {cpu * 1000:.0f} ms |"
        )
    return lines
