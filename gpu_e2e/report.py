"""Compare a pristine and a patched run: outputs, sync sites, speed; print the table."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from . import wait_report
from .sites import by_function, new_sites, split_by_rate
from .syncs import wrapper_only

PREPARE_FOR_DECODE = "sglang/srt/speculative/eagle_info_v2.py:prepare_for_decode"


def tree_digest(files: Mapping[str, str]) -> str:
    """How docs/gpu.md names a patched tree: the first 16 hex digits of the sha256 of its
    files' ``sha256sum`` listing (``files``: path -> sha256, as a run's results.json keeps them)."""
    lines = "".join(f"{sha}  {rel}\n" for rel, sha in sorted(files.items()))
    return hashlib.sha256(lines.encode()).hexdigest()[:16]


def prepare_syncs(table: Mapping[str, int]) -> int:
    return sum(n for name, n in by_function(table).items() if name.split(" ", 1)[1] == PREPARE_FOR_DECODE)


def per_step(n: int, steps: int) -> float | None:
    return (n / steps) if steps else None


def first_mismatch(a: list, b: list) -> str | None:
    """Where two lists of per-request output ids first differ (None when identical)."""
    if len(a) != len(b):
        return f"{len(a)} vs {len(b)} requests"
    for i, (x, y) in enumerate(zip(a, b)):
        if x == y:
            continue
        for j, (p, q) in enumerate(zip(x, y)):
            if p != q:
                return f"request {i}, token {j}: {p} vs {q}"
        return f"request {i}: {len(x)} vs {len(y)} tokens"
    return None


def best_tok_per_s(batch: Mapping) -> float | None:
    """tok/s of the fastest timed run: noise on a shared host only ever adds time."""
    import statistics

    elapsed = batch.get("elapsed_s")
    if not elapsed:
        return None
    return batch["tok_per_s"] * statistics.median(elapsed) / min(elapsed)


def compare_batch(release: str, pristine: Mapping, patched: Mapping, size: str) -> dict:
    """One table row from the same batch size of both variants."""
    a, b = pristine, patched
    # The wrapper counter's columns (the cross-check since issue 53); torch's count: "waits".
    wa, wb = wrapper_only(a["syncs"]), wrapper_only(b["syncs"])
    fa, fb = by_function(wa), by_function(wb)
    other_a = {k: v for k, v in fa.items() if k.split(" ", 1)[1] != PREPARE_FOR_DECODE}
    other_b = {k: v for k, v in fb.items() if k.split(" ", 1)[1] != PREPARE_FOR_DECODE}
    new_sites, negligible = split_by_rate(set(fb) - set(fa), fb, b["decode_steps"])
    mismatch = first_mismatch(a["output_ids"], b["output_ids"])
    return {
        "release": release,
        "size": size,
        "batch_size": a["batch_size"],
        "workload": a.get("workload", "uniform"),
        "prepare_per_step": (
            per_step(prepare_syncs(wa), a["decode_steps"]),
            per_step(prepare_syncs(wb), b["decode_steps"]),
        ),
        "decode_steps": (a["decode_steps"], b["decode_steps"]),
        **({"waits": wait_report.compare_batch(a, b)} if wait_report.armed(a, b) else {}),
        "other_sites": (other_a, other_b),
        "new_sites": new_sites,
        "new_sites_negligible": negligible,
        "tok_per_s": (a["tok_per_s"], b["tok_per_s"]),
        "ratio": b["tok_per_s"] / a["tok_per_s"],
        "best_tok_per_s": (best_tok_per_s(a), best_tok_per_s(b)),
        "ms_per_token": (a["ms_per_token"], b["ms_per_token"]),
        "accept_length": (a["accept_length"], b["accept_length"]),
        "identical": mismatch is None,
        "mismatch": mismatch,
        "deterministic": (a["deterministic"], b["deterministic"]),
    }


def compare(release: str, pristine: Mapping, patched: Mapping) -> list[dict]:
    """Rows per batch size; each also carries the sync sites new in the patched
    processes' whole life: those that synced after start-up (warm-up and timed runs:
    ``new_sites_whole_run``, a problem) and those seen only while the engine started,
    e.g. capturing a graph a patch adds (``new_sites_startup``, reported; see sites.py)."""
    rows = []
    pb = {_batch_key(x): x for x in patched["batches"]}
    whole_a, whole_b = pristine.get("syncs_whole_run") or {}, patched.get("syncs_whole_run") or {}
    startup_b = patched.get("syncs_startup")
    new_whole, new_startup = new_sites(
        wrapper_only(whole_a), wrapper_only(whole_b), None if startup_b is None else wrapper_only(startup_b)
    )
    new_waits = wait_report.new_sites(whole_a, whole_b, startup_b)
    for batch in pristine["batches"]:
        other = pb.get(_batch_key(batch))
        if other is not None and "summary" not in batch:
            row = compare_batch(release, batch, other, pristine["size"])
            row["new_sites_whole_run"], row["new_sites_startup"] = new_whole, new_startup
            if "waits" in row:
                row["new_wait_sites_whole_run"], row["new_wait_sites_startup"] = new_waits
            if pristine.get("scenario", "eagle3") != "eagle3" or pristine.get("deterministic"):
                row["scenario"] = pristine["scenario"] + (" det" if pristine.get("deterministic") else "")
            rows.append(row)
    return rows


def _batch_key(batch: Mapping) -> tuple:
    return batch["batch_size"], batch.get("workload", "uniform")


def _model(r: Mapping) -> str:
    """The model column: the size, then what differs from the first proof's settings."""
    extra = [x for x in (r.get("scenario"), r.get("workload")) if x and x not in ("eagle3", "uniform")]
    return " ".join([r["size"], *extra])


def _f(x, fmt="{:.2f}") -> str:
    return "n/a" if x is None else fmt.format(x)


def _sites(table: Mapping[str, int], steps: int) -> str:
    if not table:
        return "none"
    parts = [f"{name} {_f(per_step(n, steps))}/step" for name, n in sorted(table.items())]
    return "; ".join(parts)


HEADER = (
    "| release | model | bs | `prepare_for_decode` syncs/step before → after "
    "| other sync sites before → after (per step) | new sync sites | tok/s before → after "
    "| ratio | ms/token before → after | accept length before / after | identical outputs |"
)
RULE = "|---|---|---:|---|---|---|---|---:|---|---|---|"


def markdown(rows: list[dict]) -> str:
    lines = [HEADER, RULE]
    for r in rows:
        (pa, pb), (sa, sb) = r["prepare_per_step"], r["decode_steps"]
        oa, ob = r["other_sites"]
        other = ("same" if oa == ob else f"{_sites(oa, sa)} → {_sites(ob, sb)}") if (oa or ob) else "none"
        if oa == ob and oa:
            other = f"{_sites(oa, sa)} (both)"
        lines.append(
            f"| {r['release']} | {_model(r)} | {r['batch_size']} | {_f(pa)} → {_f(pb)} "
            f"| {other} | {', '.join(r['new_sites']) or 'none'} "
            f"| {_f(r['tok_per_s'][0], '{:.1f}')} → {_f(r['tok_per_s'][1], '{:.1f}')} "
            f"| {_f(r['ratio'], '{:.3f}')} "
            f"| {_f(r['ms_per_token'][0])} → {_f(r['ms_per_token'][1])} "
            f"| {_f(r['accept_length'][0])} / {_f(r['accept_length'][1])} "
            f"| {'yes' if r['identical'] else 'NO (' + str(r['mismatch']) + ')'} |"
        )
    return "\n".join(lines) + "\n"


def speed_summary(rows: list[dict]) -> list[dict]:
    """Per (release, model, batch size) over the rows of several rounds (one
    pristine and one patched engine process each): every round's ratio, their
    median and range, and each variant's median tok/s over its processes."""
    import statistics

    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["release"], r["size"], r["batch_size"]), []).append(r)
    out = []
    for (release, size, bs), rs in groups.items():
        ratios = [r["ratio"] for r in rs]
        out.append(
            {
                "release": release,
                "size": size,
                "batch_size": bs,
                "rounds": len(rs),
                "ratios": ratios,
                "median_ratio": statistics.median(ratios),
                "tok_per_s": (
                    statistics.median(r["tok_per_s"][0] for r in rs),
                    statistics.median(r["tok_per_s"][1] for r in rs),
                ),
                "best_tok_per_s": tuple(
                    max((r["best_tok_per_s"][i] for r in rs if r.get("best_tok_per_s", (None, None))[i]), default=None)
                    for i in (0, 1)
                ),
            }
        )
    return out


SPEED_HEADER = (
    "| release | model | bs | rounds | tok/s before → after (median over processes) "
    "| ratio per round | median ratio | range | fastest run before → after |"
)
SPEED_RULE = "|---|---|---:|---:|---|---|---:|---|---|"


def speed_markdown(rows: list[dict]) -> str:
    lines = [SPEED_HEADER, SPEED_RULE]
    for s in speed_summary(rows):
        lines.append(
            f"| {s['release']} | {s['size']} | {s['batch_size']} | {s['rounds']} "
            f"| {_f(s['tok_per_s'][0], '{:.1f}')} → {_f(s['tok_per_s'][1], '{:.1f}')} "
            f"| {', '.join(_f(x, '{:.3f}') for x in s['ratios'])} | {_f(s['median_ratio'], '{:.3f}')} "
            f"| {_f(min(s['ratios']), '{:.3f}')} – {_f(max(s['ratios']), '{:.3f}')} "
            f"| {_f(s['best_tok_per_s'][0], '{:.1f}')} → {_f(s['best_tok_per_s'][1], '{:.1f}')} |"
        )
    return "\n".join(lines) + "\n"


#: Attention backends whose patched tree drops the CPU mirror (every backend of
#: the run then declares needs_cpu_seq_lens = False): Triton (needs-cpu-seq-lens),
#: FA3 (fa3-spec-v2), TRT-LLM MHA / MLA (trtllm-mha-spec-v2, trtllm-mla-spec-v2),
#: FlashMLA (flashmla-spec-v2).
SYNC_FREE_BACKENDS = frozenset({"triton", "fa3", "trtllm_mha", "trtllm_mla", "flashmla"})


def verdict(rows: list[dict], mirror_kept: bool = False) -> list[str]:
    """Problems the issue's acceptance rules would flag (empty: all good).

    ``mirror_kept``: the attention backend reads the CPU seq_lens mirror (FlashInfer),
    so the patched tree must keep the sync: 1 per step, like pristine.
    """
    problems = []
    expected_after = 1.0 if mirror_kept else 0.0
    for r in rows:
        tag = f"{r['release']} {r['size']} bs={r['batch_size']}"
        pa, pb = r["prepare_per_step"]
        if not r["identical"]:
            problems.append(f"{tag}: outputs differ ({r['mismatch']})")
        if not all(r["deterministic"]):
            problems.append(f"{tag}: a variant is not deterministic across its own runs")
        if pa is None or pa < 0.99:
            problems.append(f"{tag}: pristine has {_f(pa)} prepare_for_decode syncs/step (expected 1)")
        if pb is None or abs(pb - expected_after) > (0.01 if mirror_kept else 0):
            problems.append(
                f"{tag}: patched has {_f(pb)} prepare_for_decode syncs/step (expected {expected_after:.0f})"
            )
        if r["new_sites"]:
            problems.append(f"{tag}: new sync sites in patched: {', '.join(r['new_sites'])}")
        if r.get("new_sites_whole_run"):
            problems.append(
                f"{tag}: new sync sites in the patched process's whole run (after start-up): "
                f"{', '.join(r['new_sites_whole_run'])}"
            )
    return problems
