"""Tables of 2026-11-25's H100 runs from the orchestrator's results.json files.

    python docs/results/gpu-2026-11-25/summarize.py   # from the repository root

FA3 beside Triton (both patched): rounds 1-2 (fa3-vs-triton, one orchestrator,
--rounds 2), round 3 (fa3-vs-triton-r3, Triton started first) and round 4
(fa3-vs-triton-r4, FA3 started first). FA3's own effect: own-effect (pristine,
minus, patched) and own-effect-2 (patched, minus).
"""

import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))
from gpu_e2e import report  # noqa: E402

REL = "0.5.12.post1"


def load(name):
    return json.loads((HERE / name / "results.json").read_text())


def run(results, backend, tree, rnd=None):
    tag = f"r{rnd}/" if rnd is not None else ""
    return results["runs"][f"{REL}/small/{backend}/standalone/{tag}{tree}"]


def batches(res):
    return {b["batch_size"]: b for b in res["batches"]}


# FA3 / Triton, per round
vs12, vs3, vs4 = load("fa3-vs-triton"), load("fa3-vs-triton-r3"), load("fa3-vs-triton-r4")
rounds = [
    ("1 (Triton first)", run(vs12, "triton", "patched", 0), run(vs12, "fa3", "patched", 0)),
    ("2 (FA3 first)", run(vs12, "triton", "patched", 1), run(vs12, "fa3", "patched", 1)),
    ("3 (Triton first)", run(vs3, "triton", "patched"), run(vs3, "fa3", "patched")),
    ("4 (FA3 first)", run(vs4, "triton", "patched"), run(vs4, "fa3", "patched")),
]
print("### Patched FA3 / patched Triton, per round\n")
print("| round (start order) | bs | Triton tok/s | FA3 tok/s | FA3/Triton | identical outputs |")
print("|---|---:|---:|---:|---:|---|")
ratios = {}
for name, tri, fa3 in rounds:
    for bs in (8, 32):
        a, b = batches(tri)[bs], batches(fa3)[bs]
        r = b["tok_per_s"] / a["tok_per_s"]
        ratios.setdefault(bs, []).append((r, a["tok_per_s"], b["tok_per_s"]))
        same = report.first_mismatch(a["output_ids"], b["output_ids"]) is None
        print(f"| {name} | {bs} | {a['tok_per_s']:.1f} | {b['tok_per_s']:.1f} | {r:.3f} | {'yes' if same else 'no'} |")
print(
    "\n| bs | rounds | Triton tok/s median (range) | FA3 tok/s median (range) | FA3/Triton per round | median | interval (min – max) |"
)
print("|---:|---:|---|---|---|---:|---|")
for bs, xs in ratios.items():
    rs = [x[0] for x in xs]
    t = [x[1] for x in xs]
    f = [x[2] for x in xs]
    print(
        f"| {bs} | {len(xs)} | {statistics.median(t):.1f} ({min(t):.1f} – {max(t):.1f}) "
        f"| {statistics.median(f):.1f} ({min(f):.1f} – {max(f):.1f}) "
        f"| {', '.join(f'{r:.3f}' for r in rs)} | {statistics.median(rs):.3f} | {min(rs):.3f} – {max(rs):.3f} |"
    )

# FA3's own effect
own, own2 = load("fa3-own-effect"), load("fa3-own-effect-2")
procs = [
    ("pristine", run(own, "fa3", "pristine")),
    ("minus-fa3-draft-extend-graph (1)", run(own, "fa3", "minus-fa3-draft-extend-graph")),
    ("patched (1)", run(own, "fa3", "patched")),
    ("patched (2)", run(own2, "fa3", "patched")),
    ("minus-fa3-draft-extend-graph (2)", run(own2, "fa3", "minus-fa3-draft-extend-graph")),
]
print("\n### FA3: pristine, every patch but fa3-draft-extend-graph, every patch\n")
print("Process order: pristine, minus (1), patched (1) in one orchestrator; patched (2), minus (2) in a second.\n")
print(
    "| process | bs | tok/s | ms/token | accept length | decode steps | host syncs per decode step, by site (timed runs) | engine start s |"
)
print("|---|---:|---:|---:|---:|---:|---|---:|")
for name, res in procs:
    for bs in (8, 32):
        b = batches(res)[bs]
        sites = report.by_function(b["syncs"])
        cell = "; ".join(f"{k} {v / b['decode_steps']:.2f}" for k, v in sorted(sites.items())) or "none"
        print(
            f"| {name} | {bs} | {b['tok_per_s']:.1f} | {b['ms_per_token']:.2f} | {b['accept_length']:.2f} "
            f"| {b['decode_steps']} | {cell} | {res.get('engine_start_s', 0):.0f} |"
        )

print("\n| bs | patched / minus, run 1 | run 2 | patched / pristine | minus / pristine |")
print("|---:|---:|---:|---:|---:|")
for bs in (8, 32):
    tp = {n: batches(r)[bs]["tok_per_s"] for n, r in procs}
    print(
        f"| {bs} | {tp['patched (1)'] / tp['minus-fa3-draft-extend-graph (1)']:.3f} "
        f"| {tp['patched (2)'] / tp['minus-fa3-draft-extend-graph (2)']:.3f} "
        f"| {tp['patched (1)'] / tp['pristine']:.3f} "
        f"| {tp['minus-fa3-draft-extend-graph (1)'] / tp['pristine']:.3f} |"
    )

print("\n| pair | bs | identical outputs | new sync sites (timed runs) | new sync sites (whole process life) |")
print("|---|---:|---|---|---|")
pairs = [(procs[0], procs[1]), (procs[0], procs[2]), (procs[1], procs[2]), (procs[4], procs[3]), (procs[0], procs[3])]
for (na, ra), (nb, rb) in pairs:
    whole_a = report.by_function(ra.get("syncs_whole_run") or {})
    whole_b = report.by_function(rb.get("syncs_whole_run") or {})
    for bs in (8, 32):
        a, b = batches(ra)[bs], batches(rb)[bs]
        mm = report.first_mismatch(a["output_ids"], b["output_ids"])
        new = sorted(set(report.by_function(b["syncs"])) - set(report.by_function(a["syncs"])))
        new_whole = sorted(set(whole_b) - set(whole_a))
        print(
            f"| {na} → {nb} | {bs} | {'yes' if mm is None else 'no: ' + mm} | {', '.join(new) or 'none'} "
            f"| {', '.join(new_whole) or 'none'} |"
        )
