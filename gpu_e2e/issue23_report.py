"""Issue 23's three tables, read from whole results.json documents: accepted runs
(STANDALONE), mixed traffic (syncs per decode step by site) and the sync's cost in
one process (mirror kept / dropped, alternated).

Kept apart from :mod:`.report`, which compares one pristine and one patched run:
these tables are built after the call, from every run it made.
"""

from __future__ import annotations

from collections.abc import Mapping

from . import mirror_control
from .report import _f, compare, verdict
from .sites import by_function


def _runs(results: list[Mapping]):
    """(release, key, run) of every finished run of every results.json given."""
    for res in results:
        for key, run in sorted(res.get("runs", {}).items()):
            if run.get("batches"):
                yield key.split("/")[0], key, run


def accepted_rows(results: list[Mapping]) -> list[dict]:
    """Pristine vs patched rows of the STANDALONE runs (the draft is the target, so
    steps accept), recomputed from the runs: a run cut short after its last batch
    (e.g. in shutdown) still counts for the batches it recorded."""
    rows = []
    for release, key, run in _runs(results):
        if not key.endswith("/pristine") or run.get("scenario") != "standalone":
            continue
        other = next(
            (
                res["runs"][key[: -len("pristine")] + "patched"]
                for res in results
                if key[: -len("pristine")] + "patched" in res.get("runs", {})
            ),
            None,
        )
        if other and other.get("batches"):
            rows.extend(compare(release, run, other))
    return rows


ACCEPTED_HEADER = (
    "| release | model | setting | bs | accept length before / after "
    "| `prepare_for_decode` syncs/step before → after | tok/s before → after | identical outputs |"
)
ACCEPTED_RULE = "|---|---|---|---:|---|---|---|---|"


def accepted_markdown(rows: list[dict]) -> str:
    lines = [ACCEPTED_HEADER, ACCEPTED_RULE]
    for r in rows:
        (pa, pb), (aa, ab) = r["prepare_per_step"], r["accept_length"]
        lines.append(
            f"| {r['release']} | {r['size']} | {r['scenario']} {r['workload']} | {r['batch_size']} "
            f"| {_f(aa)} / {_f(ab)} | {_f(pa)} → {_f(pb)} "
            f"| {_f(r['tok_per_s'][0], '{:.1f}')} → {_f(r['tok_per_s'][1], '{:.1f}')} "
            f"| {'yes' if r['identical'] else 'NO (' + str(r['mismatch']) + ')'} |"
        )
    return "\n".join(lines) + "\n"


def traffic_rows(results: list[Mapping], workload: str = "mixed") -> list[dict]:
    """Per (model, bs): every sync site's count per decode step in each variant
    (pristine, patched, upstream) of the ``workload`` runs, lines merged by function."""
    groups: dict[tuple, dict] = {}
    for release, key, run in _runs(results):
        variant = key.rsplit("/", 1)[1]
        if variant not in ("pristine", "patched", "upstream"):
            continue
        for b in run["batches"]:
            if b.get("workload") != workload or "summary" in b:
                continue
            g = groups.setdefault(
                (run["size"], b["batch_size"]), {"size": run["size"], "batch_size": b["batch_size"], "variants": {}}
            )
            g["variants"][variant] = {
                "release": release,
                "decode_steps": b["decode_steps"],
                "per_step": {
                    name: n / b["decode_steps"] if b["decode_steps"] else None
                    for name, n in by_function(b["syncs"]).items()
                },
            }
    return [groups[k] for k in sorted(groups)]


def traffic_gaps(row: Mapping) -> list[str]:
    """Sites the patched tree syncs at and upstream does not (empty: the tables agree).

    A site matches by its kind and function, not its file: 0.5.13 moved
    ``process_batch_result_decode`` from ``scheduler_output_processor_mixin.py`` to
    ``scheduler_components/batch_result_processor.py``, the same wait."""
    v = row["variants"]
    if "patched" not in v or "upstream" not in v:
        return []
    upstream = {_kind_and_function(s) for s, n in v["upstream"]["per_step"].items() if n}
    return sorted(s for s, n in v["patched"]["per_step"].items() if n and _kind_and_function(s) not in upstream)


def _kind_and_function(site: str) -> tuple[str, str]:
    """``"wait path/x.py:func"`` -> ``("wait", "func")``."""
    kind, _, where = site.partition(" ")
    return kind, where.rsplit(":", 1)[-1]


def traffic_markdown(rows: list[dict]) -> str:
    order = ("pristine", "patched", "upstream")
    out = []
    for r in rows:
        present = [x for x in order if x in r["variants"]]
        heads = [f"{x} {r['variants'][x]['release']} ({r['variants'][x]['decode_steps']} steps)" for x in present]
        out.append(f"**{r['size']}, bs {r['batch_size']}** — syncs per decode step\n")
        out.append("| site | " + " | ".join(heads) + " |")
        out.append("|---|" + "---:|" * len(present))
        sites = sorted({s for x in present for s in r["variants"][x]["per_step"]})
        for site in sites:
            cells = [
                _f(r["variants"][x]["per_step"].get(site), "{:.3f}") if site in r["variants"][x]["per_step"] else "–"
                for x in present
            ]
            out.append(f"| `{site}` | " + " | ".join(cells) + " |")
        if not sites:
            out.append("| none | " + " | ".join("–" for _ in present) + " |")
        gaps = traffic_gaps(r)
        if "patched" in r["variants"] and "upstream" in r["variants"]:
            out.append("\npatched vs upstream: " + ("same sites" if not gaps else "patched only: " + ", ".join(gaps)))
        out.append("")
    return "\n".join(out)


def cost_rows(results: list[Mapping]) -> list[dict]:
    rows = []
    for release, _key, run in _runs(results):
        for b in run["batches"]:
            if "summary" in b:
                # from the recorded calls when there are (the current method), else as recorded
                summary = mirror_control.summary_of_calls(b["calls"]) if b.get("calls") else b["summary"]
                rows.append(
                    {
                        "release": release,
                        "size": run["size"],
                        "scenario": run.get("scenario", "eagle3") + (" det" if run.get("deterministic") else ""),
                        "workload": b.get("workload", "uniform"),
                        "batch_size": b["batch_size"],
                        **summary,
                    }
                )
    return rows


#: Syncs per step an arm may be off by: what a late flush moves across a call boundary.
COUNT_SLACK = 0.02

COST_HEADER = (
    "| release | model | setting | bs | pairs | steps | `prepare_for_decode` syncs/step kept → dropped "
    "| ms/step kept | ms/step dropped | saved ms/step (95 % CI) | time dropped / kept (95 % CI) "
    "| median dropped / kept (95 % CI) | identical outputs | accept length |"
)
COST_RULE = "|---|---|---|---:|---:|---:|---|---:|---:|---|---|---|---|---:|"


def cost_markdown(rows: list[dict]) -> str:
    lines = [COST_HEADER, COST_RULE]
    for r in rows:
        sk, sd = r["prepare_syncs_per_step"]["kept"], r["prepare_syncs_per_step"]["dropped"]
        d, lo, hi = r["saved_ms_per_step"]
        q, qlo, qhi = r["ratio"]
        med = r.get("median_ratio")
        med = f"{med[0]:.4f} ({med[1]:.4f} – {med[2]:.4f})" if med else "–"
        lines.append(
            f"| {r['release']} | {r['size']} | {r['scenario']} {r['workload']} | {r['batch_size']} | {r['pairs']} "
            f"| {r['steps']:.0f} | {_f(sk)} → {_f(sd)} | {r['kept_ms_per_step']:.3f} | {r['dropped_ms_per_step']:.3f} "
            f"| {d:.3f} ({lo:.3f} – {hi:.3f}) | {q:.4f} ({qlo:.4f} – {qhi:.4f}) | {med} "
            f"| {'yes' if r['identical_outputs'] else 'NO'} | {_f(r['accept_length'])} |"
        )
    return "\n".join(lines) + "\n"


def issue23_tables(results: list[Mapping]) -> str:
    """Markdown of whichever of the three questions these results answer."""
    parts = []
    acc = accepted_rows(results)
    if acc:
        parts.append("### Accepted runs\n\n" + accepted_markdown(acc))
    traffic = traffic_rows(results)
    if traffic:
        parts.append("### Mixed traffic: syncs per decode step\n\n" + traffic_markdown(traffic))
    cost = cost_rows(results)
    if cost:
        parts.append("### The sync's cost in one process\n\n" + cost_markdown(cost))
    return "\n".join(parts)


def issue23_problems(results: list[Mapping]) -> list[str]:
    problems = [p for p in verdict(accepted_rows(results)) if "new sync sites in the patched process" not in p]
    for r in cost_rows(results):
        tag = f"{r['release']} {r['size']} {r['scenario']} {r['workload']} bs={r['batch_size']}"
        kept, dropped = r["prepare_syncs_per_step"]["kept"], r["prepare_syncs_per_step"]["dropped"]
        # COUNT_SLACK: a call's last counts can land in the next call (see summary_of_calls)
        if kept is None or kept < 1 - COUNT_SLACK:
            problems.append(f"{tag}: mirror kept made {_f(kept)} prepare_for_decode syncs/step (expected 1)")
        if dropped is None or dropped > COUNT_SLACK:
            problems.append(f"{tag}: mirror dropped made {_f(dropped)} prepare_for_decode syncs/step (expected 0)")
        if not r["identical_outputs"]:
            problems.append(f"{tag}: the two arms did not produce the same tokens")
    for r in traffic_rows(results):
        gaps = traffic_gaps(r)
        if gaps:
            problems.append(
                f"mixed {r['size']} bs={r['batch_size']}: patched syncs where upstream does not: " + ", ".join(gaps)
            )
    return problems
