"""Patched 0.5.12.post1 against upstream 0.5.17, read across the calls of one plan (issue 57).

The orchestrator runs one bundle per call, so the two sides of a round sit in two calls'
``results.json`` under one results folder (a run of ``gpu_e2e/yardstick_plan.sh``):
``<backend>-r<N>-b12`` (patched, and pristine in round 1, 0.5.12.post1) and
``<backend>-r<N>-b17`` (upstream 0.5.17). This module pairs them per backend, round and
batch size:

* tok/s, patched / upstream (each the median of the call's timed generates);
* host waits per decode step by torch's count (:mod:`.wait_report`: ``sync + h2d-nb``),
  by site; sites are named by function, and files moved between the releases, so the two
  sides are listed, not matched line by line;
* the accept length of both, and how many requests' outputs are identical token for token
  (greedy; the releases could differ by kernels and defaults, so a difference here is
  reported, not failed: only patched against pristine must be identical, and that is the
  orchestrator's check).

Timings compare only on one machine. ``machines.json`` beside the calls maps a call's
folder to the machine it ran on; a round whose two calls ran on different machines is
shown, marked, and kept out of the median. Pure functions over the JSON; the tables in
docs/gpu.md are recomputed from the committed results by tests/gpu/test_gpu_yardstick.py.

    python -m gpu_e2e.yardstick docs/results/gpu-yardstick-2026-11-27
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Optional

from . import profile_table, wait_report

CALL = profile_table.CALL
PATCHED, UPSTREAM, PRISTINE = "patched", "upstream", "pristine"


def load(folder: Path) -> dict[tuple[str, str], dict[str, dict]]:
    """``{(backend, round): {"b12": results, "b17": results}}``, each side where it ran."""
    out: dict[tuple[str, str], dict[str, dict]] = {}
    for path in sorted(folder.glob("*/results.json")):
        m = CALL.match(path.parent.name)
        if m:
            out.setdefault((m["backend"], m["round"]), {})[m["bundle"]] = json.loads(path.read_text())
    return out


def machines(folder: Path) -> dict[str, Any]:
    path = folder / "machines.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _variant_runs(results: Mapping, variant: str) -> list[Mapping]:
    return [
        run
        for key, run in sorted(results.get("runs", {}).items())
        if key.endswith("/" + variant) and run.get("batches")
    ]


def _batches(results: Optional[Mapping], variant: str) -> dict[int, Mapping]:
    """Batch size -> the uniform batch of ``variant`` in one call (one engine each)."""
    if not results:
        return {}
    runs = _variant_runs(results, variant)
    if not runs:
        return {}
    return {b["batch_size"]: b for b in runs[0]["batches"] if b.get("workload", "uniform") == "uniform"}


def _graph_max_bs(results: Optional[Mapping], variant: str) -> Optional[int]:
    """The captured batch-size limit the engine was asked (0.5.17 names it ``..._decode``)."""
    if not results:
        return None
    for run in _variant_runs(results, variant):
        kw = run.get("engine_kwargs") or {}
        value = kw.get("cuda_graph_max_bs", kw.get("cuda_graph_max_bs_decode"))
        if value is not None:
            return int(value)
    return None


def _identical_requests(a: Mapping, b: Mapping) -> tuple[int, int]:
    """(requests whose output ids are the same in both, requests)."""
    ids_a, ids_b = a.get("output_ids") or [], b.get("output_ids") or []
    return sum(1 for x, y in zip(ids_a, ids_b) if x == y), max(len(ids_a), len(ids_b))


def rows(folder: Path) -> list[dict]:
    """One row per backend, round and batch size where both sides ran."""
    where = machines(folder)
    out = []
    for (backend, rnd), sides in sorted(load(folder).items()):
        b12, b17 = sides.get("b12"), sides.get("b17")
        patched, upstream, pristine = _batches(b12, PATCHED), _batches(b17, UPSTREAM), _batches(b12, PRISTINE)
        graph_max = _graph_max_bs(b12, PATCHED)
        m12, m17 = where.get(f"{backend}-{rnd}-b12"), where.get(f"{backend}-{rnd}-b17")
        for bs in sorted(set(patched) & set(upstream)):
            p, u = patched[bs], upstream[bs]
            waits = wait_report.compare_batch(u, p)
            same, n = _identical_requests(p, u)
            out.append(
                {
                    "backend": backend,
                    "round": rnd,
                    "batch_size": bs,
                    "eager": graph_max is not None and bs > graph_max,
                    "same_machine": m12 is not None and m12 == m17,
                    "machines": (m12, m17),
                    "tok_per_s": (p["tok_per_s"], u["tok_per_s"]),
                    "pristine_tok_per_s": pristine[bs]["tok_per_s"] if bs in pristine else None,
                    "ratio": p["tok_per_s"] / u["tok_per_s"],
                    "first_token_s": (p.get("first_token_median_s"), u.get("first_token_median_s")),
                    "decode_tok_per_s": (p.get("decode_tok_per_s"), u.get("decode_tok_per_s")),
                    "waits_per_step": (waits["per_step"][1], waits["per_step"][0]),
                    "event_waits_per_step": (event_waits_per_step(p), event_waits_per_step(u)),
                    "sites": {PATCHED: _site_steps(waits, 1), UPSTREAM: _site_steps(waits, 0)},
                    "accept_length": (p["accept_length"], u["accept_length"]),
                    "identical_requests": (same, n),
                }
            )
    return out


def event_waits_per_step(batch: Mapping) -> Optional[float]:
    """The wrapper's event waits (``wait|...``: ``Event.synchronize`` and the like, which
    torch's sync debug mode does not flag) per decode step; None where nothing counted."""
    steps = batch.get("decode_steps") or 0
    if not steps:
        return None
    return sum(n for key, n in (batch.get("syncs") or {}).items() if key.startswith("wait|")) / steps


def label(backend: str) -> str:
    """``fa3_8boff`` -> ``FA3, 8B, counters off``: the plan's step names, for readers."""
    base, _, kind = backend.partition("_")
    words = [{"fa3": "FA3", "triton": "Triton"}.get(base, base), "8B" if "8b" in kind else "small"]
    return ", ".join(words + (["counters off"] if "off" in kind else []))


def _site_steps(waits: Mapping, side: int) -> dict[str, float]:
    return {name: e["per_step"][side] for name, e in waits["sites"].items() if e["count"][side]}


def by_cell(table: Iterable[Mapping]) -> list[tuple[tuple[str, int], list[Mapping]]]:
    """The rows per backend and batch size, in that order: a table's cells."""
    cells: dict[tuple[str, int], list[Mapping]] = {}
    for r in table:
        cells.setdefault((r["backend"], r["batch_size"]), []).append(r)
    return sorted(cells.items())


def summary(table: list[dict]) -> list[dict]:
    """Per backend and batch size: the same-machine rounds' ratios, their median and range."""
    out = []
    for (backend, bs), rs in by_cell(table):
        same = [r["ratio"] for r in rs if r["same_machine"]]
        out.append(
            {
                "backend": backend,
                "batch_size": bs,
                "eager": any(r["eager"] for r in rs),
                "rounds": [r["round"] for r in rs if r["same_machine"]],
                "ratios": same,
                "median_ratio": statistics.median(same) if same else None,
                "range": (min(same), max(same)) if same else None,
                "other_machine": [(r["round"], r["ratio"]) for r in rs if not r["same_machine"]],
                "waits_per_step": (
                    _median_of(r["waits_per_step"][0] for r in rs),
                    _median_of(r["waits_per_step"][1] for r in rs),
                ),
                "event_waits_per_step": (
                    _median_of(r["event_waits_per_step"][0] for r in rs),
                    _median_of(r["event_waits_per_step"][1] for r in rs),
                ),
            }
        )
    return out


def _median_of(values: Iterable[Optional[float]]) -> Optional[float]:
    """The median of the rounds that counted (a counters-off round has no count: None)."""
    counted = [v for v in values if v is not None]
    return statistics.median(counted) if counted else None


def _f(x: Optional[float], fmt: str = "{:.2f}") -> str:
    return "n/a" if x is None else fmt.format(x)


SUMMARY_HEADER = (
    "| backend | bs | same-machine rounds | patched / 0.5.17 tok/s per round | median "
    "| range | rounds across machines (not in the median) "
    "| host waits per decode step, patched / 0.5.17 | event waits per decode step, patched / 0.5.17 |"
)
ROUND_HEADER = (
    "| backend | round | bs | tok/s patched / 0.5.17 (pristine) | ratio | host waits per step "
    "patched / 0.5.17 | sites patched | sites 0.5.17 | accept length patched / 0.5.17 "
    "| outputs identical to 0.5.17 |"
)


def _sites_cell(sites: Mapping[str, float]) -> str:
    return "<br>".join(f"`{wait_report._short(s)}` {v:.2f}" for s, v in sorted(sites.items())) or "none"


def markdown(table: list[dict]) -> str:
    lines = [SUMMARY_HEADER, "|---|---:|---|---|---:|---|---|---|---|"]
    for s in summary(table):
        bs = f"{s['batch_size']}{' (eager)' if s['eager'] else ''}"
        lo_hi = f"{_f(s['range'][0], '{:.3f}')} – {_f(s['range'][1], '{:.3f}')}" if s["range"] else "n/a"
        other = ", ".join(f"{rnd} {x:.3f}" for rnd, x in s["other_machine"]) or "–"
        lines.append(
            f"| {label(s['backend'])} | {bs} | {', '.join(s['rounds']) or 'none'} "
            f"| {', '.join(_f(x, '{:.3f}') for x in s['ratios']) or '–'} "
            f"| {_f(s['median_ratio'], '{:.3f}')} | {lo_hi} | {other} "
            f"| {_f(s['waits_per_step'][0])} / {_f(s['waits_per_step'][1])} "
            f"| {_f(s['event_waits_per_step'][0])} / {_f(s['event_waits_per_step'][1])} |"
        )
    lines += ["", ROUND_HEADER, "|---|---|---:|---|---:|---|---|---|---|---|"]
    for r in table:
        (tp, tu), (wp, wu), (ap, au), (same, n) = (
            r["tok_per_s"],
            r["waits_per_step"],
            r["accept_length"],
            r["identical_requests"],
        )
        pristine = f" ({r['pristine_tok_per_s']:.0f})" if r["pristine_tok_per_s"] else ""
        machine = "" if r["same_machine"] else " (two machines)"
        lines.append(
            f"| {label(r['backend'])} | {r['round']}{machine} | {r['batch_size']}{' (eager)' if r['eager'] else ''} "
            f"| {tp:.0f} / {tu:.0f}{pristine} | {r['ratio']:.3f} | {_f(wp)} / {_f(wu)} "
            f"| {_sites_cell(r['sites'][PATCHED])} | {_sites_cell(r['sites'][UPSTREAM])} "
            f"| {ap:.3f} / {au:.3f} | {same} of {n} requests |"
        )
    return "\n".join(lines) + "\n"


# -- one patch's own effect: the ``minus-PATCH`` tree beside ``patched`` in each B12 call ---------
#
# A bundle built with ``--minus PATCH`` carries every patch but PATCH as the tree
# ``minus-PATCH``; ``plan.sh`` with ``VARIANTS12`` runs it beside ``patched`` in one call, one
# engine each, the start order flipping with the round. Per backend, round and batch size:
# tok/s without the patch and with it, their ratio, the wrapper's event waits per decode step
# (where a patch moves a host wait onto the stream, this is the count that changes), and
# whether the outputs are identical token for token (they must be: one patch apart).

MINUS = "minus-"


def _minus_tree(results: dict) -> Optional[str]:
    """The ``minus-PATCH`` variant a call ran, if any."""
    return next(
        (key.rsplit("/", 1)[1] for key in results.get("runs", {}) if key.rsplit("/", 1)[1].startswith(MINUS)), None
    )


def minus_rows(folder: Path) -> list[dict]:
    """One row per backend, round and batch size of each B12 call that ran a minus tree."""
    out = []
    for (backend, rnd), sides in sorted(load(folder).items()):
        b12 = sides.get("b12")
        minus = _minus_tree(b12) if b12 else None
        if minus is None:
            continue
        without, with_ = _batches(b12, minus), _batches(b12, PATCHED)
        for bs in sorted(set(without) & set(with_)):
            a, b = without[bs], with_[bs]
            same, n = _identical_requests(a, b)
            out.append(
                {
                    "backend": backend,
                    "round": rnd,
                    "batch_size": bs,
                    "patch": minus[len(MINUS) :],
                    "tok_per_s": (a["tok_per_s"], b["tok_per_s"]),
                    "ratio": b["tok_per_s"] / a["tok_per_s"],
                    "decode_tok_per_s": (a.get("decode_tok_per_s"), b.get("decode_tok_per_s")),
                    "event_waits_per_step": (event_waits_per_step(a), event_waits_per_step(b)),
                    "identical_requests": (same, n),
                }
            )
    return out


def minus_markdown(table: list[dict]) -> str:
    """The rounds, then per backend and batch size the median of their ratios; where the calls
    timed the first token, the decode alone's ratio beside the whole generate's."""
    if not table:
        return ""
    patch = table[0]["patch"]
    decode = all(_minus_decode_ratio(r) is not None for r in table)
    head, rule = (" | decode-only ratio", "---:|") if decode else ("", "")
    lines = [
        f"| backend | round | bs | tok/s without `{patch}` → with | ratio{head} "
        "| event waits per decode step, without → with | outputs identical |",
        f"|---|---|---:|---|---:|{rule}---|---|",
    ]
    for r in table:
        (a, b), (wa, wb), (same, n) = r["tok_per_s"], r["event_waits_per_step"], r["identical_requests"]
        cell = f" | {_minus_decode_ratio(r):.3f}" if decode else ""
        lines.append(
            f"| {label(r['backend'])} | {r['round']} | {r['batch_size']} | {a:.0f} → {b:.0f} "
            f"| {r['ratio']:.3f}{cell} | {_f(wa)} → {_f(wb)} | {same} of {n} requests |"
        )
    head = ", whole generate | decode only" if decode else ""
    lines += ["", f"| backend | bs | rounds | with / without `{patch}`, median{head} |", f"|---|---:|---:|---:|{rule}"]
    for (backend, bs), rs in by_cell(table):
        cell = f" | {_median_or_na(_minus_decode_ratio(r) for r in rs)}" if decode else ""
        lines.append(f"| {label(backend)} | {bs} | {len(rs)} | {statistics.median(r['ratio'] for r in rs):.3f}{cell} |")
    return "\n".join(lines) + "\n"


def _median_or_na(ratios: Iterable[Optional[float]]) -> str:
    """The median of the ratios a row has (a call that timed no first token has none), "n/a" if none."""
    have = [r for r in ratios if r is not None]
    return f"{statistics.median(have):.3f}" if have else "n/a"


def _minus_decode_ratio(row: Mapping) -> Optional[float]:
    """With / without the patch, tok/s of the decode steps alone (both timed their first
    token): a minus row keeps (without, with), so it is ``decode_ratio`` turned over."""
    ratio = decode_ratio(row)
    return 1 / ratio if ratio else None


def decode_ratio(row: Mapping) -> Optional[float]:
    """Patched / upstream tok/s of the decode steps alone, where both calls timed the first
    token (timed_calls.first_token_runs): a whole generate's time also holds the prefill,
    which 0.5.17 runs under CUDA graphs 0.5.12.post1 does not have for the draft."""
    p, u = row.get("decode_tok_per_s") or (None, None)
    return p / u if p and u else None


def decode_markdown(table: list[dict]) -> str:
    """Per round, the first-token time and the decode-only tok/s of both sides; then per
    backend and batch size the same-machine rounds' median. Empty for calls before it."""
    timed = [r for r in table if decode_ratio(r) is not None]
    if not timed:
        return ""
    lines = [
        "| backend | round | bs | first token ms, patched / 0.5.17 | decode-only tok/s, patched / 0.5.17 "
        "| decode-only ratio | whole-generate ratio |",
        "|---|---|---:|---|---|---:|---:|",
    ]
    for r in timed:
        (fp, fu), (dp, du) = r["first_token_s"], r["decode_tok_per_s"]
        machine = "" if r["same_machine"] else " (two machines)"
        lines.append(
            f"| {label(r['backend'])} | {r['round']}{machine} | {r['batch_size']} | {1000 * fp:.1f} / {1000 * fu:.1f} "
            f"| {dp:.0f} / {du:.0f} | {decode_ratio(r):.3f} | {r['ratio']:.3f} |"
        )
    lines += [
        "",
        "| backend | bs | same-machine rounds | decode-only ratio, median | whole-generate ratio, median |",
        "|---|---:|---:|---:|---:|",
    ]
    for (backend, bs), rs in by_cell([r for r in timed if r["same_machine"]]):
        decode = _median_or_na(decode_ratio(r) for r in rs)
        whole = statistics.median(r["ratio"] for r in rs)
        lines.append(f"| {label(backend)} | {bs} | {len(rs)} | {decode} | {whole:.3f} |")
    return "\n".join(lines) + "\n"


def report(folder: Path) -> str:
    """The ratios, the rounds, the decode alone where the calls timed the first token, the
    profiles, then a ``--minus`` tree's A/B where the calls ran one: what ``yardstick.md``
    holds."""
    table = rows(folder)
    ab = minus_markdown(minus_rows(folder))
    decode = decode_markdown(table)
    return (
        markdown(table)
        + ("\n" + decode if decode else "")
        + "\n"
        + profile_table.markdown(profile_table.rows(folder, label))
        + ("\n" + ab if ab else "")
    )


def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not Path(args[0]).is_dir():
        print("usage: python -m gpu_e2e.yardstick RESULTS_FOLDER", file=sys.stderr)
        return 2
    sys.stdout.write(report(Path(args[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
