"""What one more patch costs. For each patch no other patch requires (the
newest patch of a set is always one), a cold one-process apply of every patch
against the same apply without it: the difference is what adding that patch
costs. Beside it, the patch's own transform: its codemods alone over its
files as the full apply hands them over (detection, transform,
postconditions, compile), plus parse and codegen of the files no other patch
touches. Issue 32's aim: the difference is the own transform and nothing
more, so that the cost of an apply does not grow with the number of patches
beyond the sum of their transforms. CPU seconds are compared (one process:
its CPU time is its work, and far less sensitive to load than wall time)."""

from __future__ import annotations

from pathlib import Path

from timing import Bench, quiet, with_env

from patchkit import registry, transform
from patchkit.api.applying import apply_patches
from patchkit.engine import locked_session
from patchkit.transform.transformer import codemods_for

ALL = "apply cold, 1 process, every patch"


def _without(pid: str) -> str:
    return f"apply cold, 1 process, without {pid}"


def _own(pid: str) -> str:
    return f"own transform of {pid}"


def measure(bench: Bench) -> None:
    bench.section = __name__
    patches = list(registry.all_patches())
    required = {r for p in patches for r in p.requires}
    leaves = [p for p in patches if p.id not in required]
    bench.leaves = [p.id for p in leaves]

    def apply_cold(selected: list) -> None:
        def run(tree: Path) -> None:
            with locked_session(tree, quiet, "apply") as session:
                apply_patches(session, selected)

        return with_env({**bench.empty_cache(), "PATCHKIT_JOBS": "1"}, run, bench.fresh())

    def own_transform(patch) -> tuple:
        """(fn,) timing ``patch``'s codemods over its files: each file as the
        patches before it in the full apply leave it (built untimed), parsed
        untimed unless only ``patch`` touches it."""
        before = patches[: patches.index(patch)]
        others = [p for p in patches if p is not patch]
        work = []
        for rel in patch.files:
            path = bench.pristine / rel
            if not path.is_file():
                continue
            source = path.read_bytes()
            earlier = [registry.load_codemod(c) for c in codemods_for(rel, before)]
            if earlier:
                source = transform.run(rel, path, transform.parse(source, path), earlier).new
            mine = [registry.load_codemod(c) for c in codemods_for(rel, [patch])]
            alone = not codemods_for(rel, others)
            work.append((rel, path, source, None if alone else transform.parse(source, path), mine))

        def run() -> None:
            for rel, path, source, module, mine in work:
                transform.run(rel, path, module or transform.parse(source, path), mine)

        return (run,)

    apply_cold(patches)()  # warm-up, untimed: lazy imports, the registry's codemod classes
    steps = [(ALL, "engine apply, PATCHKIT_JOBS=1, empty transform cache, fresh copy", lambda: (apply_cold(patches),))]
    for patch in leaves:
        rest = [p for p in patches if p is not patch]
        steps += [
            (_without(patch.id), f"the same, {len(rest)} patches", lambda rest=rest: (apply_cold(rest),)),
            (_own(patch.id), f"{patch.id}'s codemods alone over its files", lambda patch=patch: own_transform(patch)),
        ]
    bench.rounds(bench.runs, steps, "what one more patch costs")


def report(bench: Bench) -> list[str]:
    whole = bench.med(ALL, cpu=True)
    lines = [
        f"What one more patch costs (CPU seconds, one process; every patch: {whole * 1000:.0f} ms)",
        "",
        "| patch (required by none) | every patch minus without it | its own transform | ratio |",
        "|---|---:|---:|---:|",
    ]
    for pid in bench.leaves:
        added = whole - bench.med(_without(pid), cpu=True)
        own = bench.med(_own(pid), cpu=True)
        lines.append(f"| {pid} | {added * 1000:.0f} ms | {own * 1000:.0f} ms | {added / own:.2f} |")
    return lines
