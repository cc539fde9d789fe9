"""The harness every benchmark module shares: copies of a real tree made
outside the timed region, wall and CPU time per run, interleaved rounds so
load on the machine hits every measurement alike, medians."""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from patchkit.fetch import fetch_tree  # noqa: E402


def quiet(_: str) -> None:
    pass


def patchkit_cmd() -> list[str]:
    script = Path(sys.executable).parent / "patchkit"
    if script.exists():
        return [str(script)]
    # What the console script runs (pyproject's [project.scripts]: patchkit.__main__:run).
    return [sys.executable, "-c", "from patchkit.__main__ import run; run()"]


def baseline_cmd(root: Path) -> tuple[list[str], dict]:
    """The CLI of another patchkit checkout (same interpreter and libcst), with its own patches."""
    code = (
        "import sys; sys.path.insert(0, sys.argv.pop(1)); import patchkit, importlib.resources; "
        "from patchkit.__main__ import run; run()"
    )
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
    """Timings by key; each measurement module adds its own."""

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
        self.section = ""  # the module measuring now (its __name__)
        self.owner: dict[str, str] = {}  # key -> the module that measured it

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
        self.owner.setdefault(key, self.section)
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

    def keys_of(self, section: str) -> list[str]:
        """The keys one module measured, in the order first measured."""
        return [k for k in self.wall if self.owner.get(k) == section]
