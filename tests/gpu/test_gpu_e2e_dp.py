"""gpu_e2e at DeepSeek's scale on CPU (issue 58): ``--dp N --dp-attention`` (and
two-batch overlap, the MoE a2a backend) reaching the engine, every step of each rank's
spec-v2 worker counted busy or idle (gpu_e2e/worker_steps.py), the per-rank table and
verdict of a run whose DP ranks sit idle (gpu_e2e/rank_report.py), and an engine that
refuses a setting or fails on a missing package recorded as one line, not a crash.

The 4-GPU run itself: docs/results/gpu-dp-2026-11-27/plan.sh."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fake_engine_bundle import fake_bundle
from test_gpu_e2e_tp import PFD, _write

from gpu_e2e import dp, engine_facts, rank_report, ranks, runner, wheels, worker_steps
from gpu_e2e.bundle import repo_root

WORKER = worker_steps.KEY


# ---------------------------------------------------------------- the step probe

TREE_SCHEDULER = """
    class Scheduler:
        def __init__(self, server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank,
                     attn_cp_rank, moe_dp_rank, dp_rank):
            self.tp_rank, self.pp_rank, self.dp_rank, self.gpu_id = tp_rank, pp_rank, dp_rank, gpu_id
            self.attn_tp_rank = 0  # DP attention 4 over TP 4: one rank per attention group
    """

TREE_WORKER = """
    class Mode:
        def __init__(self, name):
            self.name = name

        def is_idle(self):
            return self.name == "idle"

        def is_extend(self):
            return self.name == "extend"

    class Batch:
        def __init__(self, name):
            self.forward_mode = Mode(name)

    class EAGLEWorkerV2:
        def forward_batch_generation(self, model_worker_batch):
            return model_worker_batch.forward_mode.name
    """

_CHILD = r"""
import json, sys
from gpu_e2e import ranks, syncs
assert syncs.install()
ranks.install()
from sglang.srt.managers.scheduler import Scheduler
Scheduler(None, None, 3, 3, 0, 0, 0, 0, 3)
from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2, Batch
worker = EAGLEWorkerV2()
ran = [worker.forward_batch_generation(Batch(m)) for m in ["extend", "idle", "idle", "decode", "idle", "decode"]]
print(json.dumps(ran))
syncs.flush(True)
"""


def test_every_worker_step_of_a_rank_is_counted_busy_or_idle(tmp_path):
    """A scheduler process of DP rank 3 whose worker runs a prefill, two decode steps
    and three idle ones: the probe counts each by its batch's forward mode and leaves
    the worker's answer alone; the rank note carries attn_tp_rank."""
    pytest.importorskip("torch")
    tree = tmp_path / "tree"
    for pkg in ("sglang", "sglang/srt", "sglang/srt/managers", "sglang/srt/speculative"):
        _write(tree / pkg / "__init__.py", "")
    _write(tree / "sglang/srt/managers/scheduler.py", TREE_SCHEDULER)
    _write(tree / "sglang/srt/speculative/eagle_worker_v2.py", TREE_WORKER)
    sync_dir = tmp_path / "syncs"
    env = dict(os.environ, PK_E2E_SYNC_DIR=str(sync_dir), PYTHONPATH=os.pathsep.join([str(tree), str(repo_root())]))
    proc = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "hook on" not in proc.stderr, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == ["extend", "idle", "idle", "decode", "idle", "decode"]
    dumps = ranks.read(str(sync_dir))
    (row,) = ranks.batch_per_rank(dumps, [])
    assert row["tp_rank"] == 3 and row["worker_steps"] == {"decode": 2, "extend": 1, "idle": 3}
    assert worker_steps.total(row["worker_steps"]) == 6 and worker_steps.busy(row["worker_steps"]) == 3
    note = next(d for d in dumps if ranks.rank_of(d) == 3)["notes"]["rank"]
    assert note["attn_tp_rank"] == 0 and note["dp_rank"] == 3


@pytest.mark.trees
@pytest.mark.parametrize("release", wheels.RELEASES)
def test_the_probed_worker_is_what_each_release_runs_every_step(release):
    """What worker_steps.py wraps: ``EAGLEWorkerV2.forward_batch_generation(self,
    model_worker_batch)`` (``batch`` in 0.5.13), which the overlap scheduler's ``run_batch`` calls for every
    batch, the idle ones of DP attention too; ForwardMode has ``is_idle`` / ``is_extend``."""
    from patchkit.fetch import fetch_tree

    tree = fetch_tree(release)
    worker = ast.parse((tree / "srt/speculative/eagle_worker_v2.py").read_text())
    cls = next(n for n in worker.body if isinstance(n, ast.ClassDef) and n.name == worker_steps.WORKER_CLASS)
    method = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == worker_steps.WORKER_METHOD)
    assert [a.arg for a in method.args.args][:2] == ["self", "batch" if release == "0.5.13" else "model_worker_batch"]
    assert worker_steps.WORKER_MODULE.replace(".", "/").endswith("speculative/eagle_worker_v2")
    assert "self.model_worker.forward_batch_generation(" in (tree / "srt/managers/scheduler.py").read_text()
    modes = (tree / "srt/model_executor/forward_batch_info.py").read_text()
    assert "def is_idle(self)" in modes and "def is_extend(self" in modes


# ---------------------------------------------------------------- settings


@pytest.mark.trees
@pytest.mark.parametrize("release", wheels.RELEASES)
def test_scale_settings_are_server_args_of_each_release(release, tmp_path):
    from test_gpu_e2e_tp import _server_args_fields

    ap = __import__("argparse").ArgumentParser()
    dp.add_arguments(ap)
    args = ap.parse_args(["--dp", "4", "--dp-attention", "--tbo", "--moe-a2a-backend", "deepep"])
    kwargs = runner.engine_kwargs(
        tmp_path / "t",
        tmp_path / "d",
        attention_backend="default",
        cuda_graph_max_bs=8,
        mem_fraction_static=0.6,
        scenario="mtp",
        tp_size=4,
        scale=dp.engine_kwargs(args),
    )
    assert {
        k: kwargs[k]
        for k in ("tp_size", "dp_size", "enable_dp_attention", "enable_two_batch_overlap", "moe_a2a_backend")
    } == {
        "tp_size": 4,
        "dp_size": 4,
        "enable_dp_attention": True,
        "enable_two_batch_overlap": True,
        "moe_a2a_backend": "deepep",
    }
    assert not kwargs["enable_nccl_nvls"] and not kwargs["enable_torch_symm_mem"]  # multicast stays off
    assert {"dp_size", "enable_dp_attention", "enable_two_batch_overlap", "moe_a2a_backend"} <= _server_args_fields(
        release
    )
    # nothing asked, nothing passed: the release's own defaults
    assert set(ranks.engine_kwargs(4)) == {
        "tp_size",
        "enable_nccl_nvls",
        "enable_symm_mem",
        "enable_torch_symm_mem",
        "enforce_disable_flashinfer_allreduce_fusion",
    }
    assert dp.forwarded(args) == ["--dp", "4", "--dp-attention", "--tbo", "--moe-a2a-backend", "deepep"]
    assert dp.setting_parts(args) == ["dp4", "dpa", "a2a-deepep", "tbo"]


# ---------------------------------------------------------------- per-rank report


def _rank(rank: int, busy: int, idle: int, prepare_syncs: int, waits: int = 0, armed: bool = True) -> dict:
    syncs = {f"cpu|{PFD}:174": prepare_syncs} if prepare_syncs else {}
    if waits:
        syncs["sync|sglang/srt/managers/scheduler.py:run_batch:3040"] = waits
    return {
        "tp_rank": rank,
        "syncs": syncs,
        "decode_steps": busy,
        "worker_steps": {"decode": busy, "extend": 0, "idle": idle},
    }


def _dp_run(per_rank: list[dict], decisions: dict, tok_s: float = 50.0) -> dict:
    return {
        "size": "ds",
        "tp_size": 4,
        "dp_size": 4,
        "batches": [
            {
                "batch_size": 1,
                "syncs": {},
                "decode_steps": sum(r["decode_steps"] for r in per_rank),
                "tok_per_s": tok_s,
                "ms_per_token": 20.0,
                "accept_length": 1.0,
                "deterministic": True,
                "output_ids": [[1, 2, 3]],
                "ranks": per_rank,
                "sync_debug_armed": True,
            }
        ],
        "ranks": [
            {
                "tp_rank": r["tp_rank"],
                "needs_cpu_seq_lens": decisions.get(r["tp_rank"]),
                "decisions": [decisions[r["tp_rank"]]] if r["tp_rank"] in decisions else [],
                "syncs_whole_run": {},
            }
            for r in per_rank
        ],
    }


# bs 1 under DP attention 4 (#33973's shape): rank 0 serves the request, ranks 1-3 idle every step
PRISTINE_BS1 = _dp_run([_rank(0, 128, 0, 128, waits=256)] + [_rank(r, 0, 128, 0, waits=128) for r in (1, 2, 3)], {})
FALSE4 = {r: False for r in range(4)}


def test_idle_dp_ranks_are_judged_by_their_waits_per_step():
    patched = _dp_run([_rank(0, 128, 0, 0, waits=128)] + [_rank(r, 0, 128, 0, waits=128) for r in (1, 2, 3)], FALSE4)
    rows = rank_report.compare("0.5.12.post1", PRISTINE_BS1, patched)
    assert [(r["tp_rank"], r["prepare_per_step"], r["waits_per_step"]) for r in rows] == [
        (0, (1.0, 0.0), (2.0, 1.0)),
        (1, (None, None), (1.0, 1.0)),
        (2, (None, None), (1.0, 1.0)),
        (3, (None, None), (1.0, 1.0)),
    ]
    assert rank_report.verdict(rows, tp=4) == []
    md = rank_report.markdown(rows)
    assert (
        "| 0.5.12.post1 | ds | 4 | 4 | 1 | 0 | False | 1.00 → 0.00 | 2.00 → 1.00 | 1.00 → 0.00 "
        "| 128 / 0 → 128 / 0 | none | 50.0 → 50.0 | yes |"
    ) in md
    assert (
        "| 0.5.12.post1 | ds | 4 | 4 | 1 | 3 | False | n/a → n/a | 1.00 → 1.00 | 0.00 → 0.00 | 0 / 128 → 0 / 128 |"
        in md
    )


def test_an_idle_rank_waiting_more_or_idle_in_one_variant_only_fails():
    # rank 2 idle in both, but the patched one waits twice a step: a new hazard on idle ranks
    patched = _dp_run(
        [
            _rank(0, 128, 0, 0, waits=128),
            _rank(1, 0, 128, 0, waits=128),
            _rank(2, 0, 128, 0, waits=256),
            _rank(3, 0, 128, 0, waits=128),
        ],
        FALSE4,
    )
    problems = rank_report.verdict(rank_report.compare("0.5.12.post1", PRISTINE_BS1, patched), tp=4)
    assert problems == ["0.5.12.post1 ds bs=1 rank 2: patched has more host waits per step than pristine (1.00 → 2.00)"]
    # the request landed on rank 1 in the patched engine: rank 0 and 1 are no longer comparable
    patched = _dp_run(
        [
            _rank(0, 0, 128, 0, waits=128),
            _rank(1, 128, 0, 0, waits=128),
            _rank(2, 0, 128, 0, waits=128),
            _rank(3, 0, 128, 0, waits=128),
        ],
        FALSE4,
    )
    problems = rank_report.verdict(rank_report.compare("0.5.12.post1", PRISTINE_BS1, patched), tp=4)
    assert "0.5.12.post1 ds bs=1 rank 0: patched has n/a prepare_for_decode syncs/step (expected 0)" in problems
    assert "0.5.12.post1 ds bs=1 rank 1: pristine has n/a prepare_for_decode syncs/step (expected 1)" in problems


# ---------------------------------------------------------------- refusals

TRACEBACK = """\
[2026-11-27 02:10:01 DP1 TP1] Scheduler hit an exception: Traceback (most recent call last):
  File "/tmp/t/sglang/srt/layers/moe/token_dispatcher/deepep.py", line 310, in _get_buffer
    return DeepEPBuffer.get_deepep_buffer(
NameError: name 'Buffer' is not defined

[2026-11-27 02:10:01] Received sigquit from a child process. It usually means the child failed.
"""


def test_the_failure_line_is_read_back_from_the_engine_log():
    assert engine_facts.failure_line(TRACEBACK) == "NameError: name 'Buffer' is not defined"
    caught = (
        "[2026-11-27 02:10:00] Load weight begin.\n"
        + engine_facts.FAILURE_PREFIX
        + "ValueError: When enabling two batch overlap, ...\n"
    )
    assert engine_facts.failure_line(caught) == "ValueError: When enabling two batch overlap, ..."
    assert engine_facts.failure_line("[runner] engine up in 80.1 s\n") is None


# shaped like docs/results/gpu-dp-2026-11-27/dp-tbo/engine.log (written here, shortened): the
# runner catches only the wrapper, after the scheduler's own traceback
SCHEDULER_DIED = """\
[2026-11-27 02:16:47 DP0 TP0 EP0] SBO/TBO enabled: incompatible with fusing shared expert into MoE kernel.
[2026-11-27 02:16:47 DP0 TP0 EP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/tmp/t/sglang/srt/managers/scheduler.py", line 4025, in run_scheduler_process
    scheduler = Scheduler(
  File "/tmp/t/sglang/srt/layers/moe/token_dispatcher/deepep.py", line 317, in __init__
    raise ImportError(
ImportError: DeepEP is not installed. Please install DeepEP package.

[2026-11-27 02:16:48 DP2 TP2 EP2] Scheduler hit an exception: Traceback (most recent call last):
  File "/tmp/t/sglang/srt/distributed/parallel_state.py", line 90, in barrier
RuntimeError: NCCL communicator was aborted.

[runner] engine failed: RuntimeError: Rank 0 scheduler died during initialization (exit code: -3). If exit code \
is -9 (SIGKILL), a common cause is the OS OOM killer.
"""


def test_the_scheduler_s_own_exception_comes_before_the_runner_s_wrapper():
    """dp-tbo on 4 H200s said only "scheduler died during initialization"; the cause is
    the first scheduler traceback's exception line."""
    assert (
        engine_facts.failure_line(SCHEDULER_DIED)
        == "ImportError: DeepEP is not installed. Please install DeepEP package."
    )
    # a traceback cut short (no exception line before the next log line) leaves the runner's line
    cut = (
        SCHEDULER_DIED.split("ImportError")[0]
        + "[2026-11-27 02:16:49] Received sigquit.\n"
        + SCHEDULER_DIED.split("\n\n")[-1]
    )
    assert engine_facts.failure_line(cut).startswith("RuntimeError: Rank 0 scheduler died during initialization")


# ---------------------------------------------------------------- end to end, stand-in engine


def _orchestrate(tmp_path, monkeypatch, *extra: str) -> tuple[int, dict, Path]:
    from gpu_e2e import orchestrate

    monkeypatch.setattr(ranks, "gpus_visible", lambda: 4)
    monkeypatch.delenv("PK_FAKE_RANK1", raising=False)
    out = tmp_path / "out"
    rc = orchestrate.main(
        [
            "--bundle",
            str(fake_bundle(tmp_path)),
            "--out",
            str(out),
            "--work",
            str(tmp_path / "work"),
            "--sizes",
            "small",
            "--runs",
            "2",
            "--max-new-tokens",
            "8",
            "--tp",
            "4",
            "--run-timeout",
            "240",
            *extra,
        ]
    )
    return rc, json.loads((out / "results.json").read_text()), out


@pytest.mark.slow
def test_orchestrate_dp_attention_reaches_the_engine_and_accepts_idle_ranks(tmp_path, monkeypatch):
    """``--tp 4 --dp 4 --dp-attention`` on CPU with the stand-in Engine: dp_size and
    enable_dp_attention reach it, the key says dp4, and at bs 1 (requests dealt round
    robin: two ranks busy one run each, two idle throughout) the verdict holds."""
    pytest.importorskip("torch")
    rc, results, out = _orchestrate(tmp_path, monkeypatch, "--batch-sizes", "1,8", "--dp", "4", "--dp-attention")
    keys = ["9.9/small/triton/tp4-dp4-dpa/patched", "9.9/small/triton/tp4-dp4-dpa/pristine"]
    assert sorted(results["runs"]) == keys
    for key in keys:
        run = results["runs"][key]
        assert run["rc"] == 0, (key, (out / "engine.log").read_text()[-3000:])
        assert run["engine_kwargs"]["dp_size"] == 4 and run["engine_kwargs"]["enable_dp_attention"] is True
        assert "enable_two_batch_overlap" not in run["engine_kwargs"] and run["dp_size"] == 4
    assert rc == 0 and results["problems"] == []
    table = (out / "ranks.md").read_text()
    assert "| 9.9 | small | 4 | 4 | 1 | 0 | False | n/a → n/a | n/a → n/a | 0.00 → 0.00 | 0 / 16 → 0 / 16 |" in table
    assert "| 9.9 | small | 4 | 4 | 1 | 1 | False | 1.00 → 0.00 | n/a → n/a | 0.50 → 0.00 | 8 / 8 → 8 / 8 |" in table
    assert "| 9.9 | small | 4 | 4 | 8 | 3 | False | 1.00 → 0.00 | n/a → n/a | 1.00 → 0.00 | 16 / 0 → 16 / 0 |" in table


@pytest.mark.slow
@pytest.mark.parametrize("a2a, wrapped", [("", False), ("deepep", False), ("deepep", True)])
def test_a_refused_or_failing_engine_is_one_line_not_a_crash(tmp_path, monkeypatch, a2a, wrapped):
    """TBO as 0.5.12.post1 answers it: with no a2a backend ServerArgs refuses it in the
    runner's own process; with deepep and no deep_ep package a scheduler fails and
    sglang kills the process tree, or (``wrapped``, as on the 4 H200s) the runner catches
    "scheduler died" after the scheduler logged its own exception, which is the line
    kept. Either way every variant's run says why, once."""
    pytest.importorskip("torch")
    if wrapped:
        monkeypatch.setenv("PK_FAKE_SCHEDULER_DIES", "1")
    extra = ["--moe-a2a-backend", a2a] if a2a else []
    rc, results, out = _orchestrate(
        tmp_path, monkeypatch, "--batch-sizes", "1", "--dp", "4", "--dp-attention", "--tbo", *extra
    )
    assert rc == 1
    why = (
        "ImportError: DeepEP is not installed."
        if wrapped
        else "ModuleNotFoundError: No module named 'deep_ep'"
        if a2a
        else "ValueError: When enabling two batch overlap, moe_a2a_backend cannot be 'none'."
    )
    setting = "tp4-dp4-dpa-a2a-deepep-tbo" if a2a else "tp4-dp4-dpa-tbo"
    for variant in ("pristine", "patched"):
        key = f"9.9/small/triton/{setting}/{variant}"
        run = results["runs"][key]
        assert run["rc"] == (-9 if a2a and not wrapped else 3) and run["engine_failure"] == why
        assert run["engine_kwargs"]["enable_two_batch_overlap"] is True  # written before the engine started
        assert f"{key}: the engine did not run (rc={run['rc']}): {why}" in results["problems"]
    if not a2a:  # the runner caught it and said so itself
        assert engine_facts.FAILURE_PREFIX + why in (out / "engine.log").read_text()
