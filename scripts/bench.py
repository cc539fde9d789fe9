#!/usr/bin/env python3
"""patchkit benchmark on a real tree (sglang 0.5.12.post1, fetched at run time).

    python scripts/bench.py [--runs N] [--version V] [--baseline DIR] [--matrix-releases ...]
                            [--matrix-runs N] [--no-matrix] [--no-profile] [--json FILE]

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
  libcst (``libcst.parse_module(data).bytes``) in one process;
- ``git apply`` of the same change as a unified diff (``patchkit diff``);
- import cost of ``patchkit.runtime`` / ``patchkit.backends`` (every
  submodule) in a fresh interpreter, against bare ``python -c pass``;
- ``patchkit matrix`` over the releases (default: all 16) with ``-j 2``: cold
  and warm transform cache, and the baseline's;
- a cProfile summary of one in-process apply (where the time goes).

Targets (issue 12), in wall time: cold apply <= 1.0x floor (CPU time shown
next to it: both cores are used), warm apply <= 0.1x, verify/status from the
CLI <= 0.2x; runtime import < 10 ms.
Copies are made outside the timed region. The machine's load average is
printed: other processes running at the same time skew every figure.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pkgutil
import pstats
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import libcst  # noqa: E402

from patchkit import registry  # noqa: E402
from patchkit.apply import apply_patches  # noqa: E402
from patchkit.engine import locked_session  # noqa: E402
from patchkit.fetch import fetch_tree  # noqa: E402

from patchkit.matrix import DEFAULT_RELEASES  # noqa: E402

MATRIX_RELEASES = list(DEFAULT_RELEASES)


def quiet(_: str) -> None:
    pass


def patchkit_cmd() -> list[str]:
    script = Path(sys.executable).parent / "patchkit"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from patchkit.cli import main; sys.exit(main())"]


def baseline_cmd(root: Path) -> tuple[list[str], dict]:
    """The CLI of another patchkit checkout (same interpreter and libcst), with its own patches."""
    code = ("import sys; sys.path.insert(0, sys.argv.pop(1)); import patchkit, importlib.resources; "
            "from patchkit.cli import main; sys.exit(main())")
    return [sys.executable, "-c", code, str(root)], {**os.environ, "PYTHONPATH": str(root)}


def with_env(env: dict, fn: Callable, *args) -> Callable[[], object]:
    """``fn(*args)`` with ``env`` set in this process (the engine reads it per session)."""
    def call():
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            return fn(*args)
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return call


def cpu_now() -> float:
    """CPU seconds (user + sys) of this process and its waited-for children:
    far less sensitive than wall time to other load on the machine."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def run(cmd: list[str], ok=(0,), env: Optional[dict] = None, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, env=env, **kw)
    if proc.returncode not in ok:
        raise SystemExit(f"bench: {' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.decode()[-2000:]}")
    return proc


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.runs = args.runs
        self.work = Path(tempfile.mkdtemp(prefix="patchkit-bench-"))
        self.pristine = fetch_tree(args.version)
        self.warm_cache = self.work / "warm-cache"
        self._caches = 0
        self.wall: dict[str, list[float]] = {}
        self.cpu: dict[str, list[float]] = {}
        self.what: dict[str, str] = {}
        self._n = 0

    def fresh(self, layout: str = "package") -> Path:
        """A fresh copy: ``<dir>/sglang`` (package) or ``<dir>/python/sglang`` (checkout root returned)."""
        self._n += 1
        base = self.work / f"t{self._n}"
        if layout == "package":
            shutil.copytree(self.pristine, base / "sglang")
            return base / "sglang"
        shutil.copytree(self.pristine, base / "python" / "sglang")
        return base

    def once(self, key: str, what: str, fn: Callable[..., object], *args) -> None:
        """Time one run of ``fn(*args)`` (wall and CPU) under ``key``."""
        self.what[key] = what
        c0, w0 = cpu_now(), time.perf_counter()
        fn(*args)
        wall, cpu = time.perf_counter() - w0, cpu_now() - c0
        self.wall.setdefault(key, []).append(wall)
        self.cpu.setdefault(key, []).append(cpu)

    def rounds(self, runs: int, steps: list[tuple[str, str, Callable[[], Optional[tuple]]]], label: str) -> None:
        """``runs`` rounds; each round runs every step once, interleaved, so
        load on the machine hits every measurement alike. A step returns the
        (function, *args) to time, its setup (copies) done untimed."""
        for i in range(runs):
            for key, what, prepare in steps:
                fn, *args = prepare()
                self.once(key, what, fn, *args)
            if not self.args.quiet:
                print(f"  {label}: round {i + 1}/{runs}", file=sys.stderr, flush=True)

    def empty_cache(self) -> dict:
        self._caches += 1
        return {"PATCHKIT_TRANSFORM_CACHE": str(self.work / f"cold-cache-{self._caches}")}

    def med(self, key: str, cpu: bool = False) -> float:
        return statistics.median((self.cpu if cpu else self.wall)[key])

    # -- the measurements ------------------------------------------------------

    def measure(self) -> None:
        patches = list(registry.all_patches())

        def apply_in_process(tree: Path) -> None:
            with locked_session(tree, quiet, "apply") as session:
                outcome = apply_patches(session, patches)
            assert outcome.changed, "apply changed nothing"

        warm = {"PATCHKIT_TRANSFORM_CACHE": str(self.warm_cache)}
        with_env(self.empty_cache(), apply_in_process, self.fresh())()  # warm-up: lazy imports, registry
        patched = self.fresh()
        with_env(warm, apply_in_process, patched)()  # also fills the warm cache
        self.patched = patched
        state = json.loads((patched / ".patchkit" / "state.json").read_text())
        # The files apply changed (not the runtime files it adds: nothing to parse there).
        self.touched = sorted(rel for rel in state["files"] if (self.pristine / rel).is_file())
        sources = {rel: (self.pristine / rel).read_bytes() for rel in self.touched}

        def floor() -> None:
            for rel in self.touched:
                libcst.parse_module(sources[rel]).bytes

        def reports() -> None:
            with locked_session(patched, quiet) as session:
                session.reports()

        cmd = patchkit_cmd()
        diff = run([*cmd, "diff", str(patched)]).stdout
        patch_file = self.work / "change.diff"
        patch_file.write_bytes(diff)
        self.diff_lines = diff.count(b"\n")
        floor()  # libcst's lazy imports
        n = len(self.touched)
        serial = {"PATCHKIT_JOBS": "1"}
        steps = [
            ("floor (libcst)", f"parse_module(data).bytes of the {n} touched files, one process", lambda: (floor,)),
            ("apply cold (in-process)", "engine apply, fresh copy, empty transform cache (parallel)",
             lambda: (with_env(self.empty_cache(), apply_in_process, self.fresh()),)),
            ("apply cold, 1 process (in-process)", "the same with PATCHKIT_JOBS=1",
             lambda: (with_env({**self.empty_cache(), **serial}, apply_in_process, self.fresh()),)),
            ("apply warm (in-process)", "engine apply, fresh copy, files seen before",
             lambda: (with_env(warm, apply_in_process, self.fresh()),)),
            ("apply cold (CLI)", "`patchkit apply` subprocess, fresh copy, empty cache",
             lambda: (run, [*cmd, "-q", "apply", str(self.fresh())], (0,), {**os.environ, **self.empty_cache()})),
            ("apply warm (CLI)", "`patchkit apply` subprocess, fresh copy, warm cache",
             lambda: (run, [*cmd, "-q", "apply", str(self.fresh())], (0,), {**os.environ, **warm})),
            ("verify (CLI)", "`patchkit verify` subprocess, patched tree",
             lambda: (run, [*cmd, "-q", "verify", str(patched)], (0, 1))),
            ("status (CLI)", "`patchkit status` subprocess, patched tree", lambda: (run, [*cmd, "-q", "status", str(patched)])),
            ("verify/status (in-process)", "engine reports() on the patched tree", lambda: (reports,)),
            ("git apply", f"`git apply` of `patchkit diff` ({self.diff_lines} lines), fresh checkout copy",
             lambda: (lambda root: run(["git", "apply", str(patch_file)], cwd=root), self.fresh("checkout"))),
        ]
        if self.args.baseline:
            bcmd, benv = baseline_cmd(Path(self.args.baseline))
            bpatched = self.fresh()
            run([*bcmd, "-q", "apply", str(bpatched)], env=benv)
            steps += [
                ("baseline: apply (CLI)", f"`patchkit apply` of {self.args.baseline}, fresh copy",
                 lambda: (run, [*bcmd, "-q", "apply", str(self.fresh())], (0,), benv)),
                ("baseline: verify (CLI)", f"`patchkit verify` of {self.args.baseline}, its patched tree",
                 lambda: (run, [*bcmd, "-q", "verify", str(bpatched)], (0, 1), benv)),
            ]
        self.rounds(self.runs, steps, "apply/verify/status/floor")

    def measure_imports(self) -> None:
        runs = max(self.runs, 15)
        mods = ["patchkit.runtime", "patchkit.backends"]
        for pkg in list(mods):
            path = ROOT / pkg.replace(".", "/")
            mods += [f"{pkg}.{m.name}" for m in pkgutil.iter_modules([str(path)])]
        self.runtime_modules = mods
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        # sglang has imported these long before it reaches patched code: what
        # patchkit adds inside a real sglang process is the difference there.
        stdlib = "import logging, typing, numbers, dataclasses, enum, functools"
        imports = "import " + ", ".join(mods)

        def py(code):
            return lambda: (lambda: run([sys.executable, "-c", code], env=env),)

        py("pass")()[0]()
        self.rounds(runs, [
            ("python -c pass", "bare interpreter start-up", py("pass")),
            ("import runtime+backends", f"fresh interpreter importing {len(mods)} modules", py(imports)),
            ("python + stdlib", "interpreter + stdlib sglang always imports", py(stdlib)),
            ("python + stdlib + runtime", "the same, then the runtime modules", py(f"{stdlib}; {imports}")),
        ], "imports")
        self.rounds(max(self.runs, 5), [("import patchkit.cli", "what every CLI command pays", py("import patchkit.cli"))],
                    "import patchkit.cli")
        # -X importtime: in-process import times, immune to start-up noise (us)
        # Lines after the first patchkit one are what the import statement
        # triggers (site's own start-up imports come before); a name with one
        # leading space is top level, its cumulative time includes its children.
        self.importtime = {}
        self.import_total_us: list[int] = []
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
                self.importtime.setdefault(name.strip(), []).append((self_us, cum_us))
                if not name.startswith("  "):
                    total += cum_us
            self.import_total_us.append(total)
        self.mods = mods

    def measure_matrix(self) -> None:
        releases = self.args.matrix_releases
        for v in releases:
            fetch_tree(v)
        script = [sys.executable, str(ROOT / "scripts" / "matrix.py"), "-q", "--format", "json", *releases, "-j", "2"]
        k = len(releases)
        mwarm = {**os.environ, "PATCHKIT_TRANSFORM_CACHE": str(self.work / "matrix-cache")}
        run(script, (0, 1), mwarm)  # fills that cache
        steps = [
            (f"matrix x{k} -j 2, cold cache", " ".join(releases),
             lambda: (run, script, (0, 1), {**os.environ, **self.empty_cache()})),
            (f"matrix x{k} -j 2, warm cache", " ".join(releases), lambda: (run, script, (0, 1), mwarm)),
        ]
        if self.args.baseline:
            base = Path(self.args.baseline)
            bscript = [sys.executable, str(base / "scripts" / "matrix.py"), *script[2:]]
            steps.append((f"matrix x{k} -j 2, baseline", str(base),
                          lambda: (run, bscript, (0, 1), {**os.environ, "PYTHONPATH": str(base)})))
        self.rounds(self.args.matrix_runs, steps, "matrix")

    def profile_apply(self) -> str:
        patches = list(registry.all_patches())
        tree = self.fresh()
        prof = cProfile.Profile()

        def profiled() -> None:
            prof.enable()
            with locked_session(tree, quiet, "apply") as session:
                apply_patches(session, patches)
            prof.disable()

        # Cold and in this process, so the profile sees every file's work.
        with_env({**self.empty_cache(), "PATCHKIT_JOBS": "1"}, profiled)()
        stats = pstats.Stats(prof)
        total = sum(v[2] for v in stats.stats.values())  # tottime
        buckets: dict[str, float] = {}
        for (filename, _line, func), (_cc, _nc, tt, _ct, _callers) in stats.stats.items():
            buckets[_bucket(filename, func)] = buckets.get(_bucket(filename, func), 0.0) + tt
        out = io.StringIO()
        out.write(f"cProfile of one in-process cold apply, one process: {total:.2f} s of own time (profiling inflates visitor-heavy "
                  "code; read the shares)\n\nphases (cumulative, overlapping where nested):\n")
        phases = [
            ("Session.prepare (every file: parse, detect, transform, check)", "patchkit/engine.py", "prepare"),
            ("Session.reports (status before apply: from the findings prepare cached)", "patchkit/engine.py", "reports"),
            ("Session.transform (detect, transform, imports, re-detect, compile)", "patchkit/engine.py", "transform"),
            ("  Session.module / parse (first parse of each file)", "patchkit/engine.py", "module"),
            ("  ClassCodemod.detect (all calls)", "patchkit/codemods/base.py", "detect"),
            ("  codemod transform_module (all calls)", "patchkit/codemods/base.py", "transform_module"),
            ("  add_needed_imports", "patchkit/codemods/primitives/imports.py", "add_needed_imports"),
            ("  libcst Module.bytes (codegen)", "libcst/_nodes/module.py", "bytes"),
            ("  compile()", "~", "<built-in method builtins.compile>"),
            ("Store.commit (blobs, journal, fsync, writes)", "patchkit/state.py", "commit"),
        ]
        for label, fname, func in phases:
            cum = sum(v[3] for (f, _l, fn), v in stats.stats.items() if fn == func and f.replace("\\", "/").endswith(fname))
            out.write(f"  {cum:7.3f} s  {cum / total:5.1%}  {label}\n")
        out.write("\nown time by area:\n")
        for name, tt in sorted(buckets.items(), key=lambda kv: -kv[1]):
            out.write(f"  {tt:7.3f} s  {tt / total:5.1%}  {name}\n")
        out.write("\ntop functions by cumulative time:\n")
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(25)
        out.write(_trim_pstats(buf.getvalue()))
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(12)
        out.write("\ntop functions by own time:\n")
        out.write(_trim_pstats(buf.getvalue()))
        return out.getvalue()

    # -- report ----------------------------------------------------------------

    def report(self, profile: Optional[str]) -> str:
        floor_w, floor_c = self.med("floor (libcst)"), self.med("floor (libcst)", cpu=True)
        lines = [
            f"patchkit bench: sglang {self.args.version}, {len(registry.all_patches())} patches, "
            f"{len(self.touched)} files touched, {self.runs} interleaved rounds (medians)",
            f"python {sys.version.split()[0]}, libcst {_version('libcst')}, {os.cpu_count()} CPUs, patchkit bytecode "
            f"precompiled (as installed), "
            f"load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
            "",
            "| measurement | wall | vs floor | CPU | vs floor | target |",
            "|---|---:|---:|---:|---:|---|",
        ]
        targets = {"apply cold (in-process)": 1.0, "apply warm (in-process)": 0.1, "apply warm (CLI)": 0.1,
                   "verify (CLI)": 0.2, "status (CLI)": 0.2}
        for key in [k for k in self.wall if not k.startswith(("matrix", "python", "import", "+"))]:
            w, c = self.med(key), self.med(key, cpu=True)
            verdict = ""
            if key in targets:
                verdict = f"<= {targets[key]}x: {'met' if w / floor_w <= targets[key] else 'MISSED'} (wall)"
            lines.append(f"| {key} | {w * 1000:.0f} ms | {w / floor_w:.2f}x | {c * 1000:.0f} ms | {c / floor_c:.2f}x | {verdict} |")
        if "python -c pass" in self.wall:
            base, rt = self.med("python -c pass"), self.med("import runtime+backends")
            sb, sr = self.med("python + stdlib"), self.med("python + stdlib + runtime")
            it = {name.strip(): statistics.median(s for s, _ in v) for name, v in self.importtime.items()}
            cum = {name.strip(): statistics.median(c for _, c in v) for name, v in self.importtime.items()}
            own = sum(v for k, v in it.items() if k.startswith("patchkit"))
            top = statistics.median(self.import_total_us)
            lines += [
                "",
                f"| start-up ({len(self.mods)} modules: {', '.join(self.mods)}) | wall | added |",
                "|---|---:|---:|",
                f"| python -c pass | {base * 1000:.1f} ms | |",
                f"| + import runtime/backends | {rt * 1000:.1f} ms | {(rt - base) * 1000:+.1f} ms |",
                f"| python + stdlib sglang imports anyway (logging, typing, numbers, ...) | {sb * 1000:.1f} ms | |",
                f"| + import runtime/backends | {sr * 1000:.1f} ms | {(sr - sb) * 1000:+.1f} ms |",
                f"| import patchkit.cli (reference) | {self.med('import patchkit.cli') * 1000:.1f} ms "
                f"| {(self.med('import patchkit.cli') - base) * 1000:+.1f} ms |",
                "",
                f"-X importtime (medians of 5, in-process, no start-up noise): patchkit's own modules self "
                f"{own / 1000:.2f} ms; everything `import patchkit...` pulls in, cumulative {top / 1000:.2f} ms "
                f"(target < 10 ms: {'met' if top / 1000 < 10 else 'MISSED'}). Per module (self us): "
                + ", ".join(f"{k} {v:.0f}" for k, v in it.items() if k.startswith("patchkit"))
                + ". Largest stdlib imports it triggers (cumulative us): "
                + ", ".join(f"{k} {cum[k]:.0f}" for k in sorted((k for k in cum if not k.startswith("patchkit")),
                                                                 key=lambda k: -cum[k])[:5]),
            ]
        mkeys = [k for k in self.wall if k.startswith("matrix")]
        if mkeys:
            lines += ["", f"| patchkit matrix ({self.args.matrix_runs} run(s), median) | wall | CPU (all processes) |",
                      "|---|---:|---:|"]
            lines += [f"| {k} | {self.med(k):.1f} s | {self.med(k, True):.1f} s |" for k in mkeys]
        if profile:
            lines += ["", profile]
        return "\n".join(lines) + "\n"


def _bucket(filename: str, func: str) -> str:
    f = filename.replace("\\", "/")
    if "libcst/_parser" in f or func in ("parse_module", "parse_module_as_expression") or "libcst/native" in f \
            or "libcst_native" in f:
        return "libcst: parse (native parser + CST building)"
    if "libcst/_nodes" in f and func in ("_codegen", "_codegen_impl", "code", "bytes", "code_for_node"):
        return "libcst: codegen (module.bytes)"
    if "libcst/_nodes" in f or "libcst/_visitors" in f or "libcst/_batched" in f:
        return "libcst: tree walks / node rebuilds (visit, with_changes, deep_equals)"
    if "libcst/codemod" in f or "libcst/helpers" in f or "libcst/metadata" in f:
        return "libcst: codemod helpers (AddImportsVisitor, metadata)"
    if "libcst/matchers" in f:
        return "libcst: matchers"
    if "libcst" in f:
        return "libcst: other"
    if "patchkit/codemods" in f:
        return "patchkit: codemods (detect/transform)"
    if "patchkit/state" in f or func in ("fsync", "replace", "write", "read", "open", "mkstemp"):
        return "state store: blobs, journal, fsync"
    if "patchkit/" in f:
        return "patchkit: engine/registry"
    if func == "<built-in method builtins.compile>" or "compile" in func:
        return "compile() of patched files"
    if "<frozen importlib" in f or "importlib" in f:
        return "imports"
    return "other (stdlib, builtins)"


def _trim_pstats(text: str) -> str:
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.strip().startswith("ncalls")), 0)
    out = []
    for ln in lines[start:]:
        if not ln.strip():
            continue
        out.append("  " + ln.replace(str(ROOT) + "/", "").replace(sys.prefix, "<venv>")[:160])
    return "\n".join(out) + "\n"


def _version(dist: str) -> str:
    from importlib.metadata import version

    try:
        return version(dist)
    except Exception:  # noqa: BLE001
        return "?"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default="0.5.12.post1", help="sglang release (default 0.5.12.post1)")
    parser.add_argument("--runs", type=int, default=5, help="runs per measurement (median; default 5)")
    parser.add_argument("--matrix-releases", nargs="+", default=MATRIX_RELEASES)
    parser.add_argument("--matrix-runs", type=int, default=1)
    parser.add_argument("--baseline", help="a checkout of another patchkit to measure side by side (e.g. "
                                          "`git worktree add /tmp/base <commit>`)")
    parser.add_argument("--no-matrix", action="store_true")
    parser.add_argument("--no-profile", action="store_true")
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
        bench.measure()
        bench.measure_imports()
        if not args.no_matrix:
            bench.measure_matrix()
        profile = None if args.no_profile else bench.profile_apply()
        sys.stdout.write(bench.report(profile))
        if args.json:
            Path(args.json).write_text(json.dumps({"version": args.version, "runs": args.runs,
                                                   "loadavg": os.getloadavg(), "wall_s": bench.wall, "cpu_s": bench.cpu,
                                                   "what": bench.what, "touched": bench.touched,
                                                   "importtime": bench.importtime}, indent=2))
    finally:
        shutil.rmtree(bench.work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
