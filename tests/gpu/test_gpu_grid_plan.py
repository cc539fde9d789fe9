"""gpu_e2e/plan.sh (the GPU plan, from issue 67's speed grid), run on CPU over stub bundles:
four lanes in parallel, one GPU each, every step's orchestrator calls as the plan says; and
each results folder's record of the plan and arguments it ran with (plan-args.json)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "gpu_e2e" / "plan.sh"
STUB = """import json, os, sys, time
from pathlib import Path
args = sys.argv[1:]
t0 = time.time()
time.sleep(float(os.environ.get("PK_STUB_SLEEP", "0.3")))
with open(os.environ["PK_PLAN_LOG"], "a") as fh:
    fh.write(json.dumps({"bundle": Path.cwd().name, "args": args, "gpu": os.environ.get("CUDA_VISIBLE_DEVICES"),
                         "t0": t0, "t1": time.time(),
                         "counters_off": os.environ.get("PK_E2E_COUNTERS_OFF", ""),
                         "cpus": sorted(os.sched_getaffinity(0)),
                         "fi": os.environ.get("FLASHINFER_WORKSPACE_BASE"),
                         "extra_site": os.environ.get("PK_E2E_EXTRA_SITE"),
                         "target_weights": os.environ.get("PK_E2E_TARGET_WEIGHTS")}) + "\\n")
print("verdict: stub")
"""


def _run_plan(tmp_path, missing: tuple[str, ...] = (), gpu_mib: int = 0, **extra: str) -> tuple[list[dict], str]:
    log = tmp_path / "calls.jsonl"
    for name in ("b12", "b17"):
        (tmp_path / name / "e2e" / "pk_gpu_e2e").mkdir(parents=True)
        (tmp_path / name / "e2e" / "pk_gpu_e2e" / "__init__.py").write_text("")
        for module in ("orchestrate.py", "duel.py"):
            (tmp_path / name / "e2e" / "pk_gpu_e2e" / module).write_text(STUB)
        for module in (
            "cpu_lanes.py",
            "host_usage.py",
            "compile_caches.py",
            "bundle_parts.py",
        ):  # PIN=1, CACHES, HARVEST
            shutil.copy2(ROOT / "gpu_e2e" / module, tmp_path / name / "e2e" / "pk_gpu_e2e")
        (tmp_path / name / "manifest.json").write_text("{}")
    for name in ("fa3", "fa3_17"):
        (tmp_path / name).mkdir()
        if name not in missing:
            (tmp_path / name / "fa3.json").write_text("{}")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    if gpu_mib:  # the card's memory, as the plan asks nvidia-smi for it
        (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\necho {gpu_mib}\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    env = dict(
        os.environ,
        R=str(tmp_path / "run"),
        B12=str(tmp_path / "b12"),
        B17=str(tmp_path / "b17"),
        FA3_12=str(tmp_path / "fa3" / "lib.so"),
        FA3_17=str(tmp_path / "fa3_17" / "lib.so"),
        PK_PLAN_LOG=str(log),
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        **extra,
    )
    done = subprocess.run(["bash", str(PLAN)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    progress = (tmp_path / "run" / "progress.log").read_text()
    assert "all done" in progress
    return [json.loads(line) for line in log.read_text().splitlines()], progress


def _arg(call: dict, name: str) -> str:
    return call["args"][call["args"].index(name) + 1]


def test_every_step_runs_once_on_one_gpu_with_abba_order_and_the_eager_sizes(tmp_path):
    calls, progress = _run_plan(tmp_path)
    by_out: dict[str, list[dict]] = {}
    for c in calls:
        by_out.setdefault(Path(_arg(c, "--out")).name, []).append(c)
    assert all(len(v) == 1 for v in by_out.values())  # each call once
    names = set(by_out)
    for cell in ("triton", "fa3"):
        for r in ("r1", "r2", "r3"):
            assert {f"{cell}-{r}-b12", f"{cell}-{r}-b17"} <= names
    for cell in ("triton_8b", "fa3_8b"):
        assert {f"{cell}-r1-b12", f"{cell}-r1-b17", f"{cell}-r2-b12", f"{cell}-r2-b17", f"{cell}-r3-b12"} <= names
        assert f"{cell}-r3-b17" not in names  # the cut: 0.5.17 two rounds at 8B
    assert {"triton_check-r1-b12", "fa3_check-r1-b12", "fa3_static-r1-b12"} <= names
    assert len(names) == 6 * 2 + 2 * 5 + 3
    for c in calls:
        assert c["counters_off"] == "1"
        assert c["gpu"] in {"0", "1", "2", "3"} and c["fi"] == f"/tmp/fi{c['gpu']}"
        assert _arg(c, "--work") == f"/tmp/pkw{c['gpu']}"
        extra = json.loads(_arg(c, "--engine-extra"))
        assert extra == {"cuda_graph_max_bs": 32, "max_running_requests": 128, "port": 31000 + 2000 * int(c["gpu"])}
        assert _arg(c, "--batch-sizes") == "1,8,32,64,128"  # 64 and 128 above cuda_graph_max_bs: eager
        name = Path(_arg(c, "--out")).name
        assert _arg(c, "--sizes") == ("8b" if "_8b" in name else "small")
        assert _arg(c, "--releases") == {"b12": "0.5.12.post1", "b17": "0.5.17"}[c["bundle"]]
        if name.startswith("fa3"):
            assert _arg(c, "--attention-backend") == "default"
            assert Path(_arg(c, "--fa3-lib")).parent.name == {"b12": "fa3", "b17": "fa3_17"}[c["bundle"]]
        else:
            assert _arg(c, "--attention-backend") == "triton"
    # a round's calls run on one GPU, in ABBA order (r2: 0.5.17 first, patched before pristine)
    for cell in ("triton", "fa3", "triton_8b", "fa3_8b"):
        for r in ("r1", "r2"):
            a, b = by_out[f"{cell}-{r}-b12"][0], by_out[f"{cell}-{r}-b17"][0]
            assert a["gpu"] == b["gpu"]
            assert (calls.index(b) < calls.index(a)) == (r == "r2")
            assert _arg(a, "--variants") == ("patched,pristine" if r == "r2" else "pristine,patched")
    env_args = {
        n: [c["args"][i + 1] for i, x in enumerate(c["args"]) if x == "--engine-env"] for n, (c,) in by_out.items()
    }
    assert env_args["triton_check-r1-b12"] == env_args["fa3_check-r1-b12"] == ["PATCHKIT_CHECK_SEQ_LEN_BOUND=1"]
    assert env_args["fa3_static-r1-b12"] == ["PATCHKIT_SEQ_LEN_BOUND=static"]
    assert all(not v for n, v in env_args.items() if "_check" not in n and "_static" not in n)
    assert all(_arg(by_out[n][0], "--variants") == "patched" for n in env_args if "_check" in n or "_static" in n)
    assert len({c["gpu"] for c in calls}) == 4  # the lanes ran in parallel
    assert progress.count("no step left") == 4


def test_steps_wait_for_their_inputs_and_the_fa3_steps_for_both_libraries(tmp_path):
    # 0.5.17's FA3 never comes: the steps that need it give up, the rest run
    calls, progress = _run_plan(tmp_path, missing=("fa3_17",), GIVE_UP_S="3", LANES="0 1")
    names = {Path(_arg(c, "--out")).name for c in calls}
    assert "triton-r1-b17" in names and "fa3_8b-r3-b12" in names and "fa3_check-r1-b12" in names
    assert not any(n.startswith("fa3-") or n.startswith("fa3_8b-r1") for n in names)
    assert "gave up waiting for inputs" in progress


def test_the_second_run_arguments_count_profile_and_deadline(tmp_path):
    # the 2026-11-28b run: longer generates, the counters on in *_count steps, one profiled
    # eager pair, and no step started past the deadline
    steps = "triton-r1 fa3_count-r1 fa3_8b_count-r1 fa3_prof-r1"
    calls, progress = _run_plan(tmp_path, LANES="0 1", STEPS=steps, WITH17="triton-r1", NEW_TOKENS="256", RUNS="3")
    by_out = {Path(_arg(c, "--out")).name: c for c in calls}
    assert set(by_out) == {
        "triton-r1-b12",
        "triton-r1-b17",
        "fa3_count-r1-b12",
        "fa3_8b_count-r1-b12",
        "fa3_prof-r1-b12",
    }
    for c in calls:
        assert (_arg(c, "--max-new-tokens"), _arg(c, "--runs")) == ("256", "3")
        assert c["counters_off"] == ("" if "_count" in _arg(c, "--out") else "1")
    assert _arg(by_out["fa3_8b_count-r1-b12"], "--sizes") == "8b"
    assert _arg(by_out["fa3_count-r1-b12"], "--variants") == "patched"
    prof = by_out["fa3_prof-r1-b12"]
    assert (_arg(prof, "--batch-sizes"), _arg(prof, "--profile-batch")) == ("128", "128")
    assert _arg(prof, "--variants") == "pristine,patched"


def test_a_lane_starts_no_step_after_the_deadline(tmp_path):
    calls, progress = _run_plan(
        # seconds to spare on both sides: a loaded host once took over a second to start the plan
        tmp_path,
        LANES="0",
        STEPS="triton_check-r1 fa3_check-r1",
        DEADLINE_S="3",
        PK_STUB_SLEEP="4",
    )
    assert [Path(_arg(c, "--out")).name for c in calls] == ["triton_check-r1-b12"]
    assert "deadline, fa3_check-r1 not started" in progress


def test_each_plan_parses():
    for plan in (PLAN, ROOT / "gpu_e2e" / "yardstick_plan.sh"):
        assert subprocess.run(["bash", "-n", str(plan)]).returncode == 0, plan


def test_each_run_records_its_plan_and_arguments():
    """A run of gpu_e2e/plan.sh records the variables it set, each one the plan reads; a run
    from before it names its own script as of the commit that still holds it."""
    records = sorted((ROOT / "docs" / "results").glob("*/plan-args.json"))
    assert records
    for path in records:
        record = json.loads(path.read_text())
        # a run may hold several plans' records (2026-11-28c: the grid, then the minus duels;
        # 2026-11-28d: two lane groups at once, then FlashInfer again)
        for run in (record, *([record["grid_printed"]] if "grid_printed" in record else []), *record.get("also", [])):
            if run["plan"] is None:
                continue
            assert (ROOT / run["plan"]).is_file(), path
            read = set(re.findall(r"\$\{(\w+):-", (ROOT / run["plan"]).read_text()))
            assert set(run["env"]) <= read, (path, set(run["env"]) - read)
        if record["plan"] is not None:
            continue
        assert re.fullmatch(r"[0-9a-f]{7,40}", record["scripts_at"]) and record["scripts"], path
        assert all(s.startswith(f"docs/results/{path.parent.name}/") for s in record["scripts"]), path


def test_duel_steps_put_every_tree_on_one_gpu_and_deepseek_on_four(tmp_path):
    """A duel step is one duel.py call per lane: pristine, patched, the control and 0.5.17
    at the small shape; at 8B no control, and 0.5.17 only on a card over 100 GB (none here:
    no nvidia-smi); DS_DUEL adds DeepSeek at TP 4 + DP 4 on all four GPUs once the lanes end."""
    calls, progress = _run_plan(tmp_path, LANES="0 1", STEPS="fa3_duel-r1 triton_8b_duel-r1", DS_DUEL="1", ROUNDS="5")
    by_out = {Path(_arg(c, "--out")).name: c for c in calls}
    assert set(by_out) == {"fa3_duel-r1", "triton_8b_duel-r1", "ds_dp_duel-r1"}

    def engines(call):
        return [a for i, a in enumerate(call["args"]) if call["args"][i - 1] == "--engine"]

    b12, b17 = tmp_path / "b12", tmp_path / "b17"
    fa3 = by_out["fa3_duel-r1"]
    assert engines(fa3) == [
        f"pristine={b12}:0.5.12.post1:pristine",
        f"patched={b12}:0.5.12.post1:patched",
        f"patched-again={b12}:0.5.12.post1:patched",
        f"upstream={b17}:0.5.17:upstream",
    ]
    assert _arg(fa3, "--attention-backend") == "default" and _arg(fa3, "--rounds") == "5"
    assert json.loads(_arg(fa3, "--engine-extra"))["max_total_tokens"] == 200000
    big = by_out["triton_8b_duel-r1"]
    assert engines(big) == [f"pristine={b12}:0.5.12.post1:pristine", f"patched={b12}:0.5.12.post1:patched"]
    assert _arg(big, "--attention-backend") == "triton" and _arg(big, "--size") == "8b"
    ds = by_out["ds_dp_duel-r1"]
    assert ds["gpu"] == "0,1,2,3" and _arg(ds, "--tp") == "4" and "--dp-attention" in ds["args"]
    assert progress.index("end triton_8b_duel-r1") < progress.index("start ds_dp_duel-r1")


def test_ds_tp_2_puts_deepseek_on_two_gpus_at_dp_attention_2(tmp_path):
    """DS_TP=2 (issue 67 where no four-GPU kind is lent): DeepSeek MTP at TP 2 + DP attention 2
    on GPUs 0-1, under its own name."""
    calls, _ = _run_plan(
        tmp_path, LANES="0 1", STEPS="triton_duel-r1", WITH17="none", DS_DUEL="1", DS_TP="2", REPEATS="3"
    )
    (ds,) = [c for c in calls if Path(_arg(c, "--out")).name == "ds_dp2_duel-r1"]
    assert ds["gpu"] == "0,1" and (_arg(ds, "--tp"), _arg(ds, "--dp")) == ("2", "2") and "--dp-attention" in ds["args"]
    assert all(_arg(c, "--repeats") == "3" for c in calls)  # REPEATS: every duel's bursts


def test_ds_first_runs_deepseek_before_the_lanes_with_its_own_limits(tmp_path):
    """DS_FIRST=1 (2026-11-28h): the DeepSeek duel before the lanes' steps (the later calls'
    transfers overlap it), at DS_BATCH_SIZES, its rounds cut at DS_ROUNDS_DEADLINE_S."""
    ds = dict(DS_DUEL="1", DS_FIRST="1", DS_BATCH_SIZES="8,48", DS_ROUNDS_DEADLINE_S="460", DS_MIN_ROUNDS="3")
    calls, progress = _run_plan(tmp_path, LANES="0", STEPS="triton_duel-r1", WITH17="none", MIN_ROUNDS="1", **ds)
    assert [Path(_arg(c, "--out")).name for c in calls] == ["ds_dp_duel-r1", "triton_duel-r1"]
    first = calls[0]
    assert (_arg(first, "--batch-sizes"), _arg(first, "--deadline-s")) == ("8,48", "460")
    assert (_arg(first, "--min-rounds"), _arg(calls[1], "--min-rounds")) == ("3", "1")
    assert progress.index("end ds_dp_duel-r1") < progress.index("start triton_duel-r1")
    calls, _ = _run_plan(tmp_path / "alone", DS_DUEL="1", DS_FIRST="1", DS_ONLY="1", DS_WITH17="1")
    assert [Path(_arg(c, "--out")).name for c in calls] == ["ds_dp_duel-r1"]  # DS_ONLY: no lane
    # DS_WITH17: 0.5.17 a third engine with its own FA3, each engine on less memory
    engines = [a for i, a in enumerate(calls[0]["args"]) if calls[0]["args"][i - 1] == "--engine"]
    assert engines[-1] == f"upstream={tmp_path / 'alone' / 'b17'}:0.5.17:upstream"
    assert _arg(calls[0], "--mem-fraction-static") == "0.27"


def test_duel_steps_add_the_minus_tree_the_flashinfer_switch_and_counted_engines(tmp_path):
    """2026-11-28d: B12M's tree without fa3-spec-v2 beside FA3; FlashInfer's patched tree with
    its host plans switched on; COUNT's steps add counted engines timed once; DeepSeek MTP on
    one GPU with FlashInfer MLA; every pair compared, and DUEL_DEADLINE_S passed on."""
    b12m = tmp_path / "b12m"
    (b12m).mkdir()
    (b12m / "manifest.json").write_text("{}")
    steps = "fa3_duel-r1 flashinfer_duel-r1 flashinfer_ds_duel-r1"
    calls, _ = _run_plan(
        tmp_path, LANES="0 1", STEPS=steps, B12M=str(b12m), COUNT="flashinfer_duel-r1", DUEL_DEADLINE_S="600"
    )
    by_out = {Path(_arg(c, "--out")).name: c for c in calls}
    b12 = tmp_path / "b12"

    def engines(call):
        return [a.split("=", 1)[0] for i, a in enumerate(call["args"]) if call["args"][i - 1] == "--engine"]

    fa3 = by_out["fa3_duel-r1"]
    assert f"minus-fa3-spec-v2={b12m}:0.5.12.post1:minus-fa3-spec-v2" in fa3["args"]
    assert "patched:minus-fa3-spec-v2" in _arg(fa3, "--compare").split(",")
    assert f"{b12m}:{tmp_path / 'fa3' / 'lib.so'}" in fa3["args"] and "--once" not in fa3["args"]
    fi = by_out["flashinfer_duel-r1"]
    assert engines(fi) == [
        "pristine",
        "patched",
        "upstream",
        "patched-hostplan",
        "pristine-count",
        "patched-count",
        "patched-hostplan-count",
    ]
    assert f"patched-hostplan={b12}:0.5.12.post1:patched:PATCHKIT_FLASHINFER_HOST_INDPTR=1" in fi["args"]
    once = [fi["args"][i + 1] for i, a in enumerate(fi["args"]) if a == "--once"]
    assert once == ["pristine-count", "patched-count", "patched-hostplan-count"]
    assert "pristine:patched-hostplan" in _arg(fi, "--compare") and _arg(fi, "--deadline-s") == "600"
    graph, _ = _run_plan(tmp_path / "graph", LANES="0", STEPS="flashinfer_duel-r1", FI_GRAPH="1")
    both = "PATCHKIT_FLASHINFER_HOST_INDPTR=1,PATCHKIT_FLASHINFER_DRAFT_EXTEND_GRAPH=1"
    assert f"patched-graph={tmp_path / 'graph' / 'b12'}:0.5.12.post1:patched:{both}" in graph[0]["args"]
    assert "patched-hostplan:patched-graph" in _arg(graph[0], "--compare")
    ds = by_out["flashinfer_ds_duel-r1"]
    assert (
        _arg(ds, "--size") == "ds"
        and _arg(ds, "--scenario") == "mtp"
        and _arg(ds, "--attention-backend") == "flashinfer"
    )
    assert json.loads(_arg(ds, "--engine-extra"))["cuda_graph_max_bs"] == 8 and _arg(ds, "--batch-sizes") == "1,8,32,64"


def test_fi_graph_only_times_both_switches_on_against_pristine_and_0517_alone(tmp_path):
    """2026-11-28e: FI_GRAPH=only keeps the FlashInfer duels to pristine, the tree with both
    switches on and 0.5.17, and counts that tree alone (the switches off were timed in 28d)."""
    calls, _ = _run_plan(tmp_path, LANES="0", STEPS="flashinfer_duel-r1", FI_GRAPH="only", COUNT="flashinfer_duel-r1")
    (fi,) = calls
    names = [a.split("=", 1)[0] for i, a in enumerate(fi["args"]) if fi["args"][i - 1] == "--engine"]
    assert names == ["pristine", "patched-graph", "upstream", "patched-graph-count"]
    both = "PATCHKIT_FLASHINFER_HOST_INDPTR=1,PATCHKIT_FLASHINFER_DRAFT_EXTEND_GRAPH=1"
    b12 = tmp_path / "b12"
    assert f"patched-graph-count={b12}:0.5.12.post1:patched:{both},PK_E2E_COUNTERS_OFF=" in fi["args"]
    assert _arg(fi, "--compare") == "pristine:patched-graph,upstream:patched-graph"
    assert [fi["args"][i + 1] for i, a in enumerate(fi["args"]) if a == "--once"] == ["patched-graph-count"]
    (dsa,) = _run_plan(tmp_path / "dsa", LANES="0", STEPS="dsa_duel-r1", BLOCKING="dsa_duel-r1")[0]
    assert f"pristine-blocking={tmp_path / 'dsa' / 'b12'}:0.5.12.post1:pristine:CUDA_LAUNCH_BLOCKING=1" in dsa["args"]
    assert [dsa["args"][i + 1] for i, a in enumerate(dsa["args"]) if a == "--once"] == ["pristine-blocking"]


def test_the_dsa_duel_serves_deepseek_v32_from_its_own_bundle(tmp_path):
    """Issue 72: dsa_duel runs DeepSeek-V3.2 MTP (pristine, patched, counted engines where asked)
    from BDSA, FA3 beside, no 0.5.17; DS_SIZE=dsv32 makes the four-GPU step V3.2 from BDSA too."""
    bdsa = tmp_path / "bdsa"
    bdsa.mkdir()
    (bdsa / "manifest.json").write_text("{}")
    calls, _ = _run_plan(
        tmp_path,
        LANES="0",
        STEPS="dsa_duel-r1",
        BDSA=str(bdsa),
        COUNT="dsa_duel-r1",
        DS_DUEL="1",
        DS_SIZE="dsv32",
        GC_LOG="dsa_duel-r1",
    )
    by_out = {Path(_arg(c, "--out")).name: c for c in calls}
    dsa, dp = by_out["dsa_duel-r1"], by_out["dsv32_dp_duel-r1"]
    engines = [a for i, a in enumerate(dsa["args"]) if dsa["args"][i - 1] == "--engine"]
    assert engines == [
        f"pristine={bdsa}:0.5.12.post1:pristine",
        f"patched={bdsa}:0.5.12.post1:patched",
        f"pristine-count={bdsa}:0.5.12.post1:pristine:PK_E2E_COUNTERS_OFF=",
        f"patched-count={bdsa}:0.5.12.post1:patched:PK_E2E_COUNTERS_OFF=",
        f"pristine-gc={bdsa}:0.5.12.post1:pristine:SGLANG_LOG_GC=1",
        f"patched-gc={bdsa}:0.5.12.post1:patched:SGLANG_LOG_GC=1",
    ]
    assert (_arg(dsa, "--size"), _arg(dsa, "--scenario"), _arg(dsa, "--batch-sizes")) == ("dsv32", "mtp", "1,8,32,64")
    assert _arg(dsa, "--fa3-lib") == f"{bdsa}:{tmp_path / 'fa3' / 'lib.so'}"
    assert _arg(dp, "--size") == "dsv32" and f"patched={bdsa}:0.5.12.post1:patched" in dp["args"]


def test_pin_keeps_a_duel_on_its_lanes_cores_and_prof_bs_picks_the_profiled_batch(tmp_path):
    """PIN=1: a one-GPU duel (driver and engines) runs on its lane's share of the cores, out of
    PIN_LANES where given; PROF_BS: the eager batch a *_prof step times and profiles (8B here)."""
    if not shutil.which("taskset") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs taskset and two cores")
    calls, progress = _run_plan(
        tmp_path,
        LANES="1",
        PIN_LANES="0 1",
        PIN="1",
        STEPS="triton_duel-r1 fa3_8b_prof-r1 fa3_8b_prof-r2",
        PROF_BS="64",
    )
    by_out = {Path(_arg(c, "--out")).name: c for c in calls}
    # lane 1 of 2: the second half of the host's physical cores, every hyperthread of each
    from gpu_e2e import cpu_lanes

    lane = cpu_lanes.lane_cpus(1, 2, cpu_lanes.physical_cores())
    assert by_out["triton_duel-r1"]["cpus"] == lane
    assert f"lanes pinned: 1:{cpu_lanes.taskset_list(lane)}" in progress
    prof = by_out["fa3_8b_prof-r1-b12"]
    assert (_arg(prof, "--batch-sizes"), _arg(prof, "--profile-batch"), _arg(prof, "--sizes")) == ("64", "64", "8b")
    # r2: the same pair in the other order (2026-11-28e's lead)
    assert _arg(prof, "--variants") == "pristine,patched"
    assert _arg(by_out["fa3_8b_prof-r2-b12"], "--variants") == "patched,pristine"


def test_a_flashinfer_profile_turns_both_switches_on_in_r3_and_prof17_adds_0517(tmp_path):
    """After 2026-11-28i (FlashInfer eager bs 128 at 0.77 of pristine): FlashInfer *_prof steps
    name their backend; r3 turns both FlashInfer switches on; PROF17=1 profiles 0.5.17 after each
    pair, in a work folder of its own, for profile_compare's upstream -> patched."""
    calls, _ = _run_plan(tmp_path, LANES="0", STEPS="flashinfer_prof-r1 flashinfer_prof-r3", PROF17="1")
    by_out = {Path(_arg(c, "--out")).name: c for c in calls}
    assert set(by_out) == {f"flashinfer_prof-{r}-{b}" for r in ("r1", "r3") for b in ("b12", "b17")}
    r1, r3 = by_out["flashinfer_prof-r1-b12"], by_out["flashinfer_prof-r3-b12"]
    assert _arg(r1, "--attention-backend") == "flashinfer" and "--engine-env" not in r1["args"]
    assert [r3["args"][i + 1] for i, a in enumerate(r3["args"]) if a == "--engine-env"] == [
        "PATCHKIT_FLASHINFER_HOST_INDPTR=1",
        "PATCHKIT_FLASHINFER_DRAFT_EXTEND_GRAPH=1",
    ]
    for r in ("r1", "r3"):
        up = by_out[f"flashinfer_prof-{r}-b17"]
        assert up["bundle"] == "b17" and _arg(up, "--releases") == "0.5.17" and "--engine-env" not in up["args"]
        assert (_arg(up, "--profile-batch"), _arg(up, "--batch-sizes"), _arg(up, "--label")) == ("128", "128", r)
        assert _arg(up, "--attention-backend") == "flashinfer" and _arg(up, "--work") == "/tmp/pkw0u"
        assert up["t0"] > by_out[f"flashinfer_prof-{r}-b12"]["t1"]


def test_batch_sizes_replace_a_duels_own(tmp_path):
    calls, _ = _run_plan(tmp_path, LANES="0", STEPS="fa3_8b_duel-r1 triton_duel-r1", BATCH_SIZES="128", ROUNDS="100")
    assert {Path(_arg(c, "--out")).name: (_arg(c, "--batch-sizes"), _arg(c, "--rounds")) for c in calls} == {
        "fa3_8b_duel-r1": ("128", "100"),
        "triton_duel-r1": ("128", "100"),
    }


def test_py_spy_samples_a_duels_first_rounds(tmp_path):
    """PY_SPY (after 2026-11-29): every duel call of the plan gets py-spy's program and the rounds
    it samples (py_stacks.py); without it, no duel is sampled."""
    calls, _ = _run_plan(tmp_path, LANES="0", STEPS="fa3_8b_duel-r1", PY_SPY="/tmp/pyspy/bin/py-spy", PY_SPY_ROUNDS="4")
    (call,) = calls
    assert (_arg(call, "--py-spy"), _arg(call, "--py-spy-rounds")) == ("/tmp/pyspy/bin/py-spy", "4")
    calls, _ = _run_plan(tmp_path / "again", LANES="0", STEPS="fa3_8b_duel-r1")
    assert "--py-spy" not in calls[0]["args"]


def test_duel_cpus_and_the_8b_control_on_a_card_that_holds_four_engines(tmp_path):
    """After 2026-11-29: DUEL_CPUS holds every engine of a duel to the same CPUs (duel.py --cpus);
    AGAIN=1 adds the patched-again control at 8B where the card has over 120 GB; ROTATE=1 rotates
    the engines' places (duel.py --rotate)."""
    env = {"DUEL_CPUS": "2-5", "AGAIN": "1", "ROTATE": "1"}
    calls, _ = _run_plan(tmp_path, LANES="0", STEPS="fa3_8b_duel-r1", gpu_mib=143771, **env)
    (call,) = calls
    assert "--rotate" in call["args"]
    engines = [a.split("=")[0] for i, a in enumerate(call["args"]) if call["args"][i - 1] == "--engine"]
    assert _arg(call, "--cpus") == "2-5" and engines == ["pristine", "patched", "patched-again", "upstream"]
    calls, _ = _run_plan(tmp_path / "h100", LANES="0", STEPS="fa3_8b_duel-r1", AGAIN="1", gpu_mib=81559)
    engines = [a.split("=")[0] for i, a in enumerate(calls[0]["args"]) if calls[0]["args"][i - 1] == "--engine"]
    assert "--cpus" not in calls[0]["args"] and engines == ["pristine", "patched"]  # an 80 GB card: no 0.5.17 either
    assert "--rotate" not in calls[0]["args"]


def test_a_flashinfer_step_without_compiled_caches_waits_for_its_jit_builds(tmp_path):
    """2026-11-29: a fresh machine's first FlashInfer engine ran past the small shape's 330 s on
    its JIT builds; without CACHES a FlashInfer step's runs get 600 s, the others keep theirs."""
    calls, _ = _run_plan(tmp_path, LANES="0", STEPS="flashinfer_prof-r1 triton_check-r1")
    timeouts = {Path(_arg(c, "--out")).name: _arg(c, "--run-timeout") for c in calls}
    assert timeouts == {"flashinfer_prof-r1-b12": "600", "triton_check-r1-b12": "330"}


def test_a_quiet_step_runs_with_every_other_lane_idle(tmp_path):
    """QUIET (2026-11-28f: a busy neighbour lane slowed a launch-bound engine 1.55x a step): the
    steps named run with no other step running on any lane; the others still run side by side."""
    if not shutil.which("flock"):
        pytest.skip("needs flock")
    steps = "triton_duel-r1 triton_8b_duel-r1 fa3_duel-r1 fa3_8b_duel-r1 triton_duel-r2"
    calls, progress = _run_plan(tmp_path, LANES="0 1", STEPS=steps, QUIET="fa3_duel-r1", PK_STUB_SLEEP="1.5")
    by_out = {Path(_arg(c, "--out")).name: c for c in calls}
    quiet = by_out["fa3_duel-r1"]
    others = [c for name, c in by_out.items() if name != "fa3_duel-r1"]
    assert len(others) == 4 and all(c["t1"] <= quiet["t0"] or c["t0"] >= quiet["t1"] for c in others)
    assert any(
        a["t0"] < b["t1"] and b["t0"] < a["t1"] for a in others for b in others if a is not b
    )  # lanes still overlap
    assert "fa3_duel-r1 waits for the other lanes (QUIET)" in progress and "fa3_duel-r1 runs alone" in progress


def test_a_poll_prints_the_tables_and_brings_the_json_back(tmp_path):
    """gpu_e2e/poll.sh: progress and each duel's rows on stdout, every step's JSON and tables
    (not the engine logs) in $OUT/results.tgz."""
    import tarfile

    run, out = tmp_path / "run", tmp_path / "out"
    (run / "fa3_duel-r1").mkdir(parents=True)
    out.mkdir()
    (run / "progress.log").write_text("[05:36:45] plan: fa3_duel-r1\n")
    (run / "fa3_duel-r1" / "duel.md").write_text("| bs | x |\n|---:|---|\n| 64 | eager |\n")
    (run / "fa3_duel-r1" / "duel.json").write_text("{}")
    (run / "fa3_duel-r1" / "engine-patched.log").write_text("x" * 1000)
    done = subprocess.run(
        ["bash", str(ROOT / "gpu_e2e" / "poll.sh")],
        env=dict(os.environ, R=str(run), OUT=str(out)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "plan: fa3_duel-r1" in done.stdout and "== fa3_duel-r1" in done.stdout and "| 64 | eager |" in done.stdout
    with tarfile.open(out / "results.tgz") as tar:
        names = {n.lstrip("./") for n in tar.getnames()}
    assert {"progress.log", "fa3_duel-r1/duel.json", "fa3_duel-r1/duel.md"} <= names
    assert "fa3_duel-r1/engine-patched.log" not in names


def test_a_poll_brings_the_harvested_caches_back_once_packed(tmp_path):
    """poll.sh: after plan.sh's "caches packed (rc 0)" the parts (caches-a ...) travel in $OUT
    too, in one poll only; before it, and with CACHES_BACK=0, they stay."""
    run, root = tmp_path / "run", tmp_path / "root"
    run.mkdir()
    (root / "caches-a").mkdir(parents=True)
    (root / "caches-a" / "caches.tar.gz.part").write_bytes(b"x" * 10)
    (root / "caches").mkdir()  # the unsplit archive stays

    def poll(log: str, **env: str) -> Path:
        out = tmp_path / f"out{len(list(tmp_path.glob('out*')))}"
        out.mkdir()
        (run / "progress.log").write_text(log)
        subprocess.run(
            ["bash", str(ROOT / "gpu_e2e" / "poll.sh")],
            env=dict(os.environ, R=str(run), OUT=str(out), CACHE_ROOT=str(root), **env),
            check=True,
            capture_output=True,
            timeout=60,
        )
        return out

    packed = "[07:40:46] caches packed (rc 0): 1 part(s) in /tmp/caches-*\n"
    assert not (poll("[07:40:45] gpu 0: no step left\n") / "caches-a").exists()
    assert not (poll(packed, CACHES_BACK="0") / "caches-a").exists()
    first = poll(packed)
    assert (first / "caches-a" / "caches.tar.gz.part").read_bytes() == b"x" * 10
    assert not list(first.glob("caches"))
    assert not (poll(packed) / "caches-a").exists()  # once: a call brings back eight files


def test_the_minus_plan_times_trees_without_one_patch_at_either_shape(tmp_path):
    """gpu_e2e/minus_plan.sh: one duel per lane, pristine, patched and a tree per left-out patch;
    SHAPE=8b (2026-11-28d's FA3 8B eager cells) with its KV share, BATCHES the sizes."""
    bm = tmp_path / "bm"
    (bm / "e2e" / "pk_gpu_e2e").mkdir(parents=True)
    (bm / "e2e" / "pk_gpu_e2e" / "__init__.py").write_text("")
    (bm / "e2e" / "pk_gpu_e2e" / "duel.py").write_text(STUB)
    log = tmp_path / "calls.jsonl"
    env = dict(
        os.environ,
        R=str(tmp_path / "run"),
        BM=str(bm),
        AFTER="/nonexistent",
        LANES_MINUS="seq-lens-host-bound,verify-wait-on-stream",
        SHAPE="8b",
        BATCHES="64",
        PK_PLAN_LOG=str(log),
    )
    (tmp_path / "run").mkdir()
    done = subprocess.run(["bash", str(ROOT / "gpu_e2e" / "minus_plan.sh")], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    (call,) = [json.loads(line) for line in log.read_text().splitlines()]
    engines = [a for i, a in enumerate(call["args"]) if call["args"][i - 1] == "--engine"]
    assert engines[2:] == [
        f"minus-seq-lens-host-bound={bm}:0.5.12.post1:minus-seq-lens-host-bound",
        f"minus-verify-wait-on-stream={bm}:0.5.12.post1:minus-verify-wait-on-stream",
    ]
    assert (_arg(call, "--size"), _arg(call, "--batch-sizes")) == ("8b", "64")
    assert json.loads(_arg(call, "--engine-extra"))["max_total_tokens"] == 60000


def test_caches_go_into_every_lane_before_the_steps_and_come_out_packed_after(tmp_path):
    """CACHES (after 2026-11-28h): an earlier machine's kernels in every lane's folders (the
    DeepSeek duel's too) and FlashInfer's on the runners' path; HARVEST=1 packs this machine's
    into parts a call brings back."""
    from gpu_e2e import compile_caches

    old = tmp_path / "old"
    (old / "triton0" / "HASH").mkdir(parents=True)
    (old / "triton0" / "HASH" / "k.cubin").write_text("k")
    tar = tmp_path / "caches.tar.gz"
    compile_caches.pack([], [old / "triton0"], [], tar, log=lambda *_: None)
    root = tmp_path / "root"
    calls, progress = _run_plan(
        tmp_path / "plan",
        LANES="0",
        STEPS="triton_duel-r1",
        WITH17="none",
        CACHES=str(tar),
        HARVEST="1",
        CACHE_ROOT=str(root),
        DS_TP="2",
    )
    assert f"caches: {tar} installed (rc 0)" in progress
    assert all((root / f"triton{g}" / "HASH" / "k.cubin").is_file() for g in ("0", "01"))
    assert calls[0]["extra_site"] == str(root / "pk_fi_aot")
    assert "caches packed (rc 0): 1 part(s)" in progress
    assert progress.index("end triton_duel-r1") < progress.index("caches packed")
    assert (root / "caches-a" / "parts.json").is_file()


def test_scenario_runs_a_duel_in_another_spec_scenario(tmp_path):
    """SCENARIO=standalone (the fourteenth run's triton_sa_duel): the shape's size, then the
    scenario; TARGET_WEIGHTS=random reaches the duel's runners (target_weights.py)."""
    calls, _ = _run_plan(tmp_path, LANES="0", STEPS="triton_sa_duel-r1", SCENARIO="standalone", WITH17="none")
    (call,) = calls
    assert _arg(call, "--size") == "small" and _arg(call, "--scenario") == "standalone"
    assert _arg(call, "--attention-backend") == "triton" and call["target_weights"] == ""
    calls, _ = _run_plan(tmp_path / "random", LANES="0", STEPS="triton_sa_duel-r1", TARGET_WEIGHTS="random")
    assert calls[0]["target_weights"] == "random"


def test_again_adds_flashinfers_control_and_pristine_again_a_second_pristine(tmp_path):
    """After 2026-11-29e: AGAIN=1 gives FlashInfer's duel the control too (its eager cells read
    0.97-0.98 pooled with none), PRISTINE_AGAIN=1 adds a second pristine engine and the pairs
    that read the trees from the second pair of engines."""

    def engines(call):
        return [a.split("=")[0] for i, a in enumerate(call["args"]) if call["args"][i - 1] == "--engine"]

    (plain,) = _run_plan(tmp_path / "plain", LANES="0", STEPS="flashinfer_duel-r1", WITH17="none")[0]
    assert engines(plain) == ["pristine", "patched", "patched-hostplan"]
    (fi,) = _run_plan(
        tmp_path / "fi", LANES="0", STEPS="flashinfer_duel-r1", WITH17="none", AGAIN="1", PRISTINE_AGAIN="1"
    )[0]
    assert engines(fi) == ["pristine", "patched", "patched-again", "pristine-again", "patched-hostplan"]
    assert {"pristine:pristine-again", "pristine-again:patched-again", "patched:patched-again"} <= set(
        _arg(fi, "--compare").split(",")
    )
    (h100,) = _run_plan(
        tmp_path / "h100",
        LANES="0",
        STEPS="triton_8b_duel-r1",
        WITH17="none",
        AGAIN="1",
        PRISTINE_AGAIN="1",
        gpu_mib=81559,
    )[0]
    assert engines(h100) == ["pristine", "patched"]  # an 80 GB card holds no third 8B engine
