"""The engines' Python, sampled with py-spy during a duel's timed calls (issue 67, after 2026-11-29).

The tenth run found FA3 8B's eager bs 128 at 0.856x pristine over 37 rounds, each engine one busy
host thread (1.02-1.05 cores during its call, no steal), the GPU idle most of the step. Which
Python the patched thread runs longer cannot be read from sglang's torch profiler: it slows every
host op 2-3x, and its profiled FA3 8B steps ran the other way round (docs/research/
eager-speed-profile.md). py-spy reads a running interpreter's stacks from outside
(``process_vm_readv``; ``--nonblocking`` never stops it), a hundred times a second, at a cost
the sampled thread does not pay.

    duel.py ... --py-spy /tmp/pyspy/bin/py-spy      # each timed call sampled: OUT/stacks/*.txt
    python3 -m pk_gpu_e2e.py_stacks OUT --base pristine --other patched --batch-size 128

The report (:func:`compare`) puts each function's time a decode step side by side, inclusive
(the function and what it calls) and by its own line, in the scheduler process: the thread
that bounds an eager step. A function's share of the scheduler's samples in a call, times the
call's wall time over its decode steps, is its time a step; py-spy's attach delay and a lost
sample then change no figure.

Standard library only (it runs on the device machine beside the engines).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import statistics
import subprocess
from collections import Counter
from pathlib import Path
from typing import Optional

RATE = 100  # samples a second: enough for a 2-5 s call, light on the host
_PROCESS = re.compile(r'^process (\d+):"(.*)"$')


def program(path: str) -> str:
    """``--py-spy``'s value: an executable py-spy, or a one-line refusal before any engine starts."""
    found = shutil.which(path)
    if found is None:
        raise argparse.ArgumentTypeError(f"{path}: no such program (py-spy's wheel installs bin/py-spy)")
    return found


class Sampler:
    """One ``py-spy record`` over an engine's process tree for one call: started once the engine
    is thawed, stopped (SIGINT: py-spy then writes its file) once the call is answered."""

    def __init__(self, py_spy: str, pid: int, out: Path, rate: int = RATE):
        out.parent.mkdir(parents=True, exist_ok=True)
        self.out = out
        self.log = open(out.with_suffix(".log"), "w")  # noqa: SIM115  closed in stop()
        cmd = [py_spy, "record", "--pid", str(pid), "--subprocesses", "--nonblocking"]
        cmd += ["--rate", str(rate), "--format", "raw", "-o", str(out)]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)

    def stop(self, timeout: float = 30) -> Optional[Path]:
        """The samples' file, or None where py-spy wrote none (its log says why)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.out if self.out.exists() and self.out.stat().st_size else None


def process_kind(cmdline: str) -> str:
    """sglang names its processes (``sglang::scheduler``, ``sglang::detokenizer``, with a rank
    suffix at TP > 1); the runner and anything else keep their command line's first word."""
    match = re.search(r"sglang::(\w+)", cmdline)
    if match:
        return match.group(1).split("_")[0]
    return Path(cmdline.split(" ")[0]).name or "?"


def parse(text: str) -> dict[str, Counter]:
    """py-spy's raw (folded) output as {process kind: Counter(stack: samples)}; a stack is
    the tuple of its Python frames, outermost first, without the process frames."""
    out: dict[str, Counter] = {}
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        kind, frames = "?", []
        for frame in stack.split(";"):
            match = _PROCESS.match(frame)
            if match:
                kind = process_kind(match.group(2))  # the innermost process frame names the sampler's target
            else:
                frames.append(frame)
        out.setdefault(kind, Counter())[tuple(frames)] += int(count)
    return out


def _function(frame: str) -> str:
    """``name (file.py:123)`` without its line: one row a function."""
    return re.sub(r":\d+\)$", ")", frame)


def per_step(stacks: Counter, step_ms: float) -> dict[str, dict[str, float]]:
    """Each function's time a decode step, inclusive and self, from one call's samples of one
    process: its share of the samples times the call's wall time a step."""
    total = sum(stacks.values())
    inclusive: Counter = Counter()
    own: Counter = Counter()
    for frames, n in stacks.items():
        for name in {_function(f) for f in frames}:
            inclusive[name] += n
        if frames:
            own[_function(frames[-1])] += n
    scale = step_ms / total if total else 0.0
    return {
        "inclusive": {k: v * scale for k, v in inclusive.items()},
        "self": {k: v * scale for k, v in own.items()},
    }


def engine_profile(run: Path, engine: str, batch_size: int, kind: str = "scheduler") -> dict:
    """The median over an engine's sampled calls at one batch size of each function's ms a
    step, from the duel's duel.json (wall time, steps) and its ``stacks/`` files."""
    calls = json.loads((run / "duel.json").read_text())["calls"]
    per_call = []
    for c in calls:
        if c["engine"] != engine or c["batch_size"] != batch_size or "error" in c or not c.get("verify_ct"):
            continue
        path = run / "stacks" / sample_name(engine, batch_size, c["round"], c.get("repeat", 1))
        if not path.exists():
            continue
        steps = c["verify_ct"] / batch_size
        per_call.append(per_step(parse(path.read_text()).get(kind, Counter()), 1000 * c["elapsed_s"] / steps))
    return {"calls": len(per_call), **{key: _median_of(per_call, key) for key in ("inclusive", "self")}}


def _median_of(per_call: list[dict], key: str) -> dict[str, float]:
    """Each function's median over the calls (0 in a call that never sampled it)."""
    names = {n for p in per_call for n in p[key]}
    return {n: statistics.median([p[key].get(n, 0.0) for p in per_call]) for n in names}


def sample_name(engine: str, batch_size: int, round_no: int, repeat: int = 1) -> str:
    return f"{engine}-bs{batch_size}-r{round_no}" + (f"-{repeat}" if repeat > 1 else "") + ".txt"


def sample_of(args, out: Path, engine: str, batch_size: int, round_no: int, repeat: int) -> tuple | None:
    """The duel's ``sample`` for one call: (py-spy's program, the file it writes), or None where
    ``--py-spy`` is not given or the round is past ``--py-spy-rounds``."""
    if not args.py_spy or (args.py_spy_rounds and round_no > args.py_spy_rounds):
        return None
    return args.py_spy, out / "stacks" / sample_name(engine, batch_size, round_no, repeat)


def compare(base: dict, other: dict, key: str = "inclusive", top: int = 25) -> list[dict]:
    """Functions by the difference of their ms a step, largest first (other minus base)."""
    names = set(base[key]) | set(other[key])
    rows = [{"function": n, "base_ms": base[key].get(n, 0.0), "other_ms": other[key].get(n, 0.0)} for n in names]
    for r in rows:
        r["diff_ms"] = r["other_ms"] - r["base_ms"]
    return sorted(rows, key=lambda r: -abs(r["diff_ms"]))[:top]


def markdown(base_name: str, other_name: str, base: dict, other: dict, top: int = 25) -> str:
    lines = [f"{base_name} ({base['calls']} calls) -> {other_name} ({other['calls']} calls), ms a decode step:"]
    for key in ("inclusive", "self"):
        lines += ["", f"| function ({key}) | {base_name} | {other_name} | difference |", "|---|---:|---:|---:|"]
        for r in compare(base, other, key, top):
            lines.append(f"| `{r['function'][:90]}` | {r['base_ms']:.2f} | {r['other_ms']:.2f} | {r['diff_ms']:+.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="a duel's sampled calls, two engines side by side")
    ap.add_argument("run", type=Path, help="the duel's --out folder (duel.json, stacks/)")
    ap.add_argument("--base", default="pristine")
    ap.add_argument("--other", default="patched")
    ap.add_argument("--batch-size", type=int, required=True)
    ap.add_argument("--process", default="scheduler", help="the process kind to read (sglang's name)")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)
    base = engine_profile(args.run, args.base, args.batch_size, args.process)
    other = engine_profile(args.run, args.other, args.batch_size, args.process)
    print(markdown(args.base, args.other, base, other, args.top), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
