"""Where the test suite's time goes: per file, per kind of work, per release, per worker.

    PATCHKIT_TEST_PROFILE=/tmp/prof .venv/bin/python -m pytest -q -n auto ...
    python scripts/test_profile.py /tmp/prof [--top 30]

reads what ``tests/profiling.py`` wrote (one JSON per xdist worker) and prints
Markdown tables (docs/performance.md keeps them). ``--write-durations`` also
writes each file's seconds to ``tests/durations.json``, which orders the run
(tests/conftest.py: the longest files start first). Seconds are each test's wall
time, set-up and tear-down included (a module's fixtures count to its first
test); kinds of work are the fixtures' and CLI's shares of it, "other" is the
rest (the test's own code: parsing, detection, assertions).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

RELEASE = re.compile(r"\b0\.5\.\d+(?:\.post\d+)?\b")


def load(folder: Path) -> tuple[dict, dict]:
    """(spent, spans) of every worker: test -> kind -> s, and test -> (worker, start, end)."""
    spent: dict[str, dict[str, float]] = {}
    spans: dict[str, tuple[str, float, float]] = {}
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        spent.update(data["spent"])
        spans.update({test: (path.stem, *span) for test, span in data["span"].items()})
    return spent, spans


def table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def report(folder: Path, top: int = 30) -> str:
    spent, spans = load(folder)
    duration = {test: end - start for test, (_, start, end) in spans.items()}
    total = sum(duration.values()) or 1.0
    begin = min(s for _, s, _ in spans.values())
    finish = max(e for _, _, e in spans.values())
    out = [
        f"{len(spans)} tests, {total:.0f} s of test time over {finish - begin:.0f} s of wall time "
        f"({total / (finish - begin):.2f} workers busy on average).",
        "",
    ]

    workers: dict[str, list[float]] = defaultdict(lambda: [0.0, float("inf"), 0.0])
    for worker, start, end in spans.values():
        w = workers[worker]
        w[0] += end - start
        w[1], w[2] = min(w[1], start), max(w[2], end)
    out += [
        "### Per worker",
        "",
        table(
            ["worker", "busy s", "started at s", "last test ended at s", "idle at the end s"],
            [
                [name, f"{b:.0f}", f"{s - begin:.0f}", f"{e - begin:.0f}", f"{finish - e:.0f}"]
                for name, (b, s, e) in sorted(workers.items())
            ],
        ),
        "",
    ]

    per_file: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for test, seconds in duration.items():
        f = per_file[test.split("::")[0]]
        f[0] += 1
        f[1] += seconds
    rows = sorted(per_file.items(), key=lambda kv: -kv[1][1])
    out += [
        f"### Per file (top {top} of {len(rows)})",
        "",
        table(
            ["file", "tests", "s", "share"],
            [[f"`{name}`", n, f"{s:.0f}", f"{100 * s / total:.1f}%"] for name, (n, s) in rows[:top]],
        ),
        "",
    ]

    kinds: dict[str, float] = defaultdict(float)
    for test, seconds in duration.items():
        counted = spent.get(test, {})
        for kind, s in counted.items():
            kinds[kind] += s
        kinds["other (the tests' own work)"] += max(0.0, seconds - sum(counted.values()))
    out += [
        "### Per kind of work",
        "",
        table(
            ["kind", "s", "share"],
            [[kind, f"{s:.0f}", f"{100 * s / total:.1f}%"] for kind, s in sorted(kinds.items(), key=lambda kv: -kv[1])],
        ),
        "",
    ]

    per_release: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for test, seconds in duration.items():
        params = test.partition("[")[2]
        found = RELEASE.findall(params)
        r = per_release[found[0] if found else "(no release parameter)"]
        r[0] += 1
        r[1] += seconds
    out += [
        "### Per release parameter",
        "",
        table(
            ["release", "tests", "s"],
            [[name, n, f"{s:.0f}"] for name, (n, s) in sorted(per_release.items(), key=lambda kv: -kv[1][1])],
        ),
        "",
    ]

    slowest = sorted(duration.items(), key=lambda kv: -kv[1])[:top]
    out += [
        f"### Slowest {top} tests",
        "",
        table(
            ["test", "s", "largest share"],
            [[f"`{test}`", f"{s:.1f}", _largest(spent.get(test, {}), s)] for test, s in slowest],
        ),
    ]
    return "\n".join(out)


def _largest(kinds: dict[str, float], seconds: float) -> str:
    if not kinds:
        return "its own work"
    kind, s = max(kinds.items(), key=lambda kv: kv[1])
    return f"{kind} {s:.1f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="the PATCHKIT_TEST_PROFILE folder of a run")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument(
        "--write-durations", type=Path, metavar="JSON", help="write each file's seconds there (tests/durations.json)"
    )
    args = parser.parse_args()
    print(report(args.folder, args.top))
    if args.write_durations:
        args.write_durations.write_text(json.dumps(file_seconds(args.folder), indent=1, sort_keys=True) + "\n")


def file_seconds(folder: Path) -> dict[str, float]:
    """Each test file's seconds (the sum of its tests' wall times)."""
    _, spans = load(folder)
    seconds: dict[str, float] = defaultdict(float)
    for test, (_, start, end) in spans.items():
        seconds[test.split("::")[0]] += end - start
    return {name: round(s, 1) for name, s in seconds.items()}


if __name__ == "__main__":
    main()
