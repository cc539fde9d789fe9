"""Compare a pristine and a patched tensor-parallel run rank by rank; the verdict; the table.

:mod:`.report` compares the engines as wholes (outputs, the syncs of all processes
summed, tok/s). Under TP each rank syncs, or not, on its own and takes its own
``needs_cpu_seq_lens`` decision, so here every rank gets a row per batch size: its
``prepare_for_decode`` syncs per decode step before → after, the sync sites new in
its patched process, its patched decision. Reads the ``ranks`` fields the runner
records (:mod:`.ranks`).

Issue 58 (DP attention): a rank with no request of its own runs the group's steps on
idle batches and never calls ``prepare_for_decode``. Each row therefore also carries
the rank's worker steps (:mod:`.worker_steps`: busy and idle) and its host waits per
worker step, by torch's count (:mod:`.wait_report`, the primary count) and by the
wrapper counter (the cross-check). ``prepare_for_decode`` syncs stay per busy step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Optional

from . import ranks, wait_report, worker_steps
from .report import _f, by_function, per_step, prepare_syncs
from .sites import new_sites, split_by_rate
from .syncs import wrapper_only


def _by_rank(items) -> dict[int, Mapping]:
    return {r["tp_rank"]: r for r in items or []}


def _steps(batch_rank: Mapping) -> dict:
    return batch_rank.get("worker_steps") or {k: 0 for k in worker_steps.KINDS}


def waits_per_step(batch_rank: Mapping, armed: bool) -> tuple[Optional[float], Optional[float]]:
    """(torch's host waits, the wrapper counter's syncs) per worker step of one rank
    (None: torch's count not armed, or no worker step counted)."""
    steps = worker_steps.total(_steps(batch_rank))
    table = batch_rank.get("syncs", {})
    torch_count = sum(wait_report.blocking_sites(table).values())
    return (per_step(torch_count, steps) if armed else None, per_step(sum(wrapper_only(table).values()), steps))


def all_idle(steps: Mapping) -> bool:
    """A rank that ran every step of the group on an idle batch (DP attention)."""
    return worker_steps.total(steps) > 0 and worker_steps.busy(steps) == 0


def compare(release: str, pristine: Mapping, patched: Mapping) -> list[dict]:
    """One row per (batch size, rank seen in either variant)."""
    rows = []
    whole_a, whole_b = _by_rank(pristine.get("ranks")), _by_rank(patched.get("ranks"))
    # per rank, the sync table once the engine was up (absent in results recorded before it)
    startup_b = _by_rank(patched.get("ranks_startup")) if "ranks_startup" in patched else None
    decided = ranks.decisions(patched)
    pb = {x["batch_size"]: x for x in patched["batches"]}
    for batch_a in pristine["batches"]:
        batch_b = pb.get(batch_a["batch_size"])
        if batch_b is None:
            continue
        ra, rb = _by_rank(batch_a.get("ranks")), _by_rank(batch_b.get("ranks"))
        for rank in sorted(set(ra) | set(rb) | set(whole_a) | set(whole_b)):
            a, b = ra.get(rank, {}), rb.get(rank, {})
            fa, fb = by_function(a.get("syncs", {})), by_function(b.get("syncs", {}))
            after, startup_only = new_sites(
                whole_a.get(rank, {}).get("syncs_whole_run", {}),
                whole_b.get(rank, {}).get("syncs_whole_run", {}),
                None if startup_b is None else startup_b.get(rank, {}).get("syncs_whole_run", {}),
            )
            armed = wait_report.armed(batch_a, batch_b)
            (wa, xa), (wb, xb) = waits_per_step(a, armed), waits_per_step(b, armed)
            rows.append(
                {
                    "release": release,
                    "size": pristine["size"],
                    "tp": patched.get("tp_size"),
                    "dp": patched.get("dp_size", 1),
                    "batch_size": batch_a["batch_size"],
                    "tp_rank": rank,
                    "counted": (rank in ra, rank in rb),
                    "prepare_per_step": (
                        per_step(prepare_syncs(a.get("syncs", {})), a.get("decode_steps", 0)),
                        per_step(prepare_syncs(b.get("syncs", {})), b.get("decode_steps", 0)),
                    ),
                    "decode_steps": (a.get("decode_steps", 0), b.get("decode_steps", 0)),
                    "worker_steps": (_steps(a), _steps(b)),
                    "waits_per_step": (wa, wb),
                    "wrapper_per_step": (xa, xb),
                    **dict(
                        zip(
                            ("new_sites", "new_sites_negligible"),
                            split_by_rate(set(fb) - set(fa), fb, b.get("decode_steps", 0)),
                        )
                    ),
                    "new_sites_whole_run": after,
                    "new_sites_startup": startup_only,
                    "decision": decided.get(rank),
                    "tok_per_s": (batch_a["tok_per_s"], batch_b["tok_per_s"]),
                    "identical": batch_a["output_ids"] == batch_b["output_ids"],
                }
            )
    return rows


def verdict(rows: list[dict], tp: int, mirror_kept: bool = False) -> list[str]:
    """Problems per rank (empty: all good): every rank 0 … tp-1 counted in both
    variants, pristine syncing once per busy step on each (a rank whose every step
    was idle in both variants has none to count), no more host waits per step
    patched than pristine, patched as the backend
    says on each (none where it is sync-free, once where it reads the mirror),
    no new sync site on any rank, and every rank taking the same decision, the
    one the backend calls for."""
    problems = []
    expected_after = 1.0 if mirror_kept else 0.0
    seen = sorted({r["tp_rank"] for r in rows})
    if seen != list(range(tp)):
        problems.append(f"ranks counted: {seen}, expected {list(range(tp))}")
    for r in rows:
        tag = f"{r['release']} {r['size']} bs={r['batch_size']} rank {r['tp_rank']}"
        for variant, counted in zip(("pristine", "patched"), r["counted"]):
            if not counted:
                problems.append(f"{tag}: no sync counts from the {variant} process of this rank")
        (pa, pb), (wa, wb) = r["prepare_per_step"], r.get("waits_per_step", (None, None))
        if wa is not None and wb is not None and wb > wa + 0.01:
            problems.append(f"{tag}: patched has more host waits per step than pristine ({_f(wa)} → {_f(wb)})")
        # DP attention: a rank with no request of its own in either variant has no
        # prepare_for_decode to count (its waits per step are checked above)
        if not all(all_idle(s) for s in r.get("worker_steps", ({}, {}))):
            if pa is None or pa < 0.99:
                problems.append(f"{tag}: pristine has {_f(pa)} prepare_for_decode syncs/step (expected 1)")
            if pb is None or abs(pb - expected_after) > (0.01 if mirror_kept else 0):
                problems.append(
                    f"{tag}: patched has {_f(pb)} prepare_for_decode syncs/step (expected {expected_after:.0f})"
                )
        if r["new_sites"]:
            problems.append(f"{tag}: new sync sites in patched: {', '.join(r['new_sites'])}")
        if r["new_sites_whole_run"]:
            problems.append(
                f"{tag}: new sync sites in the patched process's whole run (after start-up): "
                f"{', '.join(r['new_sites_whole_run'])}"
            )
    decided = {r["tp_rank"]: r["decision"] for r in rows}
    for rank, flag in sorted(decided.items()):
        if flag is None:
            problems.append(f"rank {rank}: the patched scheduler recorded no needs_cpu_seq_lens decision")
        elif flag is not mirror_kept:
            problems.append(
                f"rank {rank}: patched decided needs_cpu_seq_lens={flag} "
                f"(expected {mirror_kept} for this attention backend)"
            )
    if len(set(decided.values())) > 1:
        problems.append(
            "ranks disagree on needs_cpu_seq_lens: " + ", ".join(f"rank {k} {v}" for k, v in sorted(decided.items()))
        )
    return problems


HEADER = (
    "| release | model | tp | dp | bs | rank | needs_cpu_seq_lens (patched) "
    "| `prepare_for_decode` syncs/busy step before → after "
    "| host waits/step before → after (torch) | wrapper syncs/step before → after "
    "| steps busy / idle before → after | new sync sites "
    "| tok/s before → after (engine) | identical outputs |"
)
RULE = "|---|---|---:|---:|---:|---:|---|---|---|---|---|---|---|---|"


def _decision(flag: Optional[bool]) -> str:
    return "not recorded" if flag is None else str(flag)


def _busy_idle(steps: Mapping) -> str:
    return f"{worker_steps.busy(steps)} / {int(steps.get('idle', 0))}"


def markdown(rows: list[dict]) -> str:
    lines = [HEADER, RULE]
    for r in rows:
        pa, pb = r["prepare_per_step"]
        wa, wb = r.get("waits_per_step", (None, None))
        xa, xb = r.get("wrapper_per_step", (None, None))
        sa, sb = r.get("worker_steps", ({}, {}))
        new = sorted(set(r["new_sites"]) | set(r["new_sites_whole_run"])) + [
            f"{s} (start-up only)" for s in r.get("new_sites_startup", [])
        ]
        lines.append(
            f"| {r['release']} | {r['size']} | {r['tp']} | {r.get('dp', 1)} | {r['batch_size']} | {r['tp_rank']} "
            f"| {_decision(r['decision'])} | {_f(pa)} → {_f(pb)} | {_f(wa)} → {_f(wb)} | {_f(xa)} → {_f(xb)} "
            f"| {_busy_idle(sa)} → {_busy_idle(sb)} | {', '.join(new) or 'none'} "
            f"| {_f(r['tok_per_s'][0], '{:.1f}')} → {_f(r['tok_per_s'][1], '{:.1f}')} "
            f"| {'yes' if r['identical'] else 'NO'} |"
        )
    return "\n".join(lines) + "\n"
