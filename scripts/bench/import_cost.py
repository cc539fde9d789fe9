"""What importing the runtime (patchkit.runtime, patchkit.backends) costs a
fresh interpreter, against bare start-up and the stdlib sglang imports anyway;
-X importtime per module; `import patchkit.cli` for reference."""

from __future__ import annotations

import os
import pkgutil
import statistics
import sys

from timing import ROOT, Bench, run


def measure(bench: Bench) -> None:
    bench.section = __name__
    runs = max(bench.runs, 15)
    mods = ["patchkit.runtime", "patchkit.backends"]
    for pkg in list(mods):
        path = ROOT / pkg.replace(".", "/")
        mods += [f"{pkg}.{m.name}" for m in pkgutil.iter_modules([str(path)])]
    bench.runtime_modules = mods
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    # sglang has imported these long before it reaches patched code: what
    # patchkit adds inside a real sglang process is the difference there.
    stdlib = "import logging, typing, numbers, dataclasses, enum, functools"
    imports = "import " + ", ".join(mods)

    def py(code):
        return lambda: (lambda: run([sys.executable, "-c", code], env=env),)

    py("pass")()[0]()
    bench.rounds(
        runs,
        [
            ("python -c pass", "bare interpreter start-up", py("pass")),
            ("import runtime+backends", f"fresh interpreter importing {len(mods)} modules", py(imports)),
            ("python + stdlib", "interpreter + stdlib sglang always imports", py(stdlib)),
            ("python + stdlib + runtime", "the same, then the runtime modules", py(f"{stdlib}; {imports}")),
        ],
        "imports",
    )
    bench.rounds(
        max(bench.runs, 5),
        [("import patchkit.cli", "what every CLI command pays", py("import patchkit.cli"))],
        "import patchkit.cli",
    )
    # -X importtime: in-process import times, immune to start-up noise (us)
    # Lines after the first patchkit one are what the import statement
    # triggers (site's own start-up imports come before); a name with one
    # leading space is top level, its cumulative time includes its children.
    bench.importtime = {}
    bench.import_total_us: list[int] = []
    for _ in range(5):
        proc = run([sys.executable, "-X", "importtime", "-c", imports], env=env)
        ours, total = False, 0
        for line in proc.stderr.decode().splitlines():
            parts = line.split("|")
            if len(parts) != 3 or not parts[0].split(":")[-1].strip().isdigit():
                continue
            name = parts[2].rstrip()
            ours = ours or name.strip().startswith("patchkit")
            if not ours:
                continue
            self_us, cum_us = int(parts[0].split(":")[-1]), int(parts[1])
            bench.importtime.setdefault(name.strip(), []).append((self_us, cum_us))
            if not name.startswith("  "):
                total += cum_us
        bench.import_total_us.append(total)
    bench.mods = mods


def report(bench: Bench) -> list[str]:
    base, rt = bench.med("python -c pass"), bench.med("import runtime+backends")
    sb, sr = bench.med("python + stdlib"), bench.med("python + stdlib + runtime")
    it = {name.strip(): statistics.median(s for s, _ in v) for name, v in bench.importtime.items()}
    cum = {name.strip(): statistics.median(c for _, c in v) for name, v in bench.importtime.items()}
    own = sum(v for k, v in it.items() if k.startswith("patchkit"))
    top = statistics.median(bench.import_total_us)
    return [
        f"| start-up ({len(bench.mods)} modules: {', '.join(bench.mods)}) | wall | added |",
        "|---|---:|---:|",
        f"| python -c pass | {base * 1000:.1f} ms | |",
        f"| + import runtime/backends | {rt * 1000:.1f} ms | {(rt - base) * 1000:+.1f} ms |",
        f"| python + stdlib sglang imports anyway (logging, typing, numbers, ...) | {sb * 1000:.1f} ms | |",
        f"| + import runtime/backends | {sr * 1000:.1f} ms | {(sr - sb) * 1000:+.1f} ms |",
        f"| import patchkit.cli (reference) | {bench.med('import patchkit.cli') * 1000:.1f} ms "
        f"| {(bench.med('import patchkit.cli') - base) * 1000:+.1f} ms |",
        "",
        f"-X importtime (medians of 5, in-process, no start-up noise): patchkit's own modules self "
        f"{own / 1000:.2f} ms; everything `import patchkit...` pulls in, cumulative {top / 1000:.2f} ms "
        f"(target < 10 ms: {'met' if top / 1000 < 10 else 'MISSED'}). Per module (self us): "
        + ", ".join(f"{k} {v:.0f}" for k, v in it.items() if k.startswith("patchkit"))
        + ". Largest stdlib imports it triggers (cumulative us): "
        + ", ".join(
            f"{k} {cum[k]:.0f}"
            for k in sorted((k for k in cum if not k.startswith("patchkit")), key=lambda k: -cum[k])[:5]
        ),
    ]
