"""gpu_e2e under tensor parallelism, on CPU: each scheduler process labelled with its
TP rank and its needs_cpu_seq_lens decision noted (gpu_e2e/ranks.py), the per-rank
comparison and verdict (gpu_e2e/rank_report.py), and ``--tp`` reaching the engine.

The TP run itself needs two GPUs (docs/gpu.md, "Tensor parallel")."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fake_engine_bundle import fake_bundle

from gpu_e2e import rank_report, ranks, report, runner, wheels
from gpu_e2e.bundle import repo_root

PFD = "sglang/srt/speculative/eagle_info_v2.py:prepare_for_decode"
PFD_CALL = "call|sglang.srt.speculative.eagle_info_v2:EagleDraftInputV2Mixin.prepare_for_decode"


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


# ---------------------------------------------------------------- process side

# What the patched scheduler does at init, in miniature: the real Scheduler
# signature (0.5.10 … 0.5.12.post1), and the decision through the tree's runtime.
SCHEDULER = """
    from types import SimpleNamespace as NS
    {import_line}

    class Scheduler:
        def __init__(self, server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank,
                     attn_cp_rank, moe_dp_rank, dp_rank):
            self.tp_rank, self.pp_rank, self.dp_rank, self.gpu_id = tp_rank, pp_rank, dp_rank, gpu_id
            {decide_line}

    def decide(server_args):
        draft_worker = NS(spec_v2_attn_backends=[NS(needs_cpu_seq_lens=False), None])
        return configure_needs_cpu_seq_lens(server_args, draft_worker, NS(model_runner=NS(model_is_mrope=False)))
    """

_CHILD = r"""
import json, os, sys
from types import SimpleNamespace as NS
from gpu_e2e import ranks, syncs
assert syncs.install()
ranks.install()
from sglang.srt.managers.scheduler import Scheduler
rank, how = int(sys.argv[1]), sys.argv[2]
args = NS(enable_two_batch_overlap=False, disable_piecewise_cuda_graph=True)
if how == "positional":   # as run_scheduler_process calls it
    Scheduler(args, None, rank, rank, 0, 0, 0, 0, None)
elif how == "keywords":
    Scheduler(server_args=args, port_args=None, gpu_id=rank, tp_rank=rank, moe_ep_rank=0, pp_rank=0,
              attn_cp_rank=0, moe_dp_rank=0, dp_rank=None)
if how != "none":
    import importlib
    try:   # the product is unchanged: the flag the runtime holds is what it decided
        rt = importlib.import_module("sglang.srt._patchkit.runtime")
        print(json.dumps({"flag": rt.needs_cpu_seq_lens()}))
        rt.set_needs_cpu_seq_lens(True)   # the harness's mirror switch: no decision of the tree
    except ImportError:
        print(json.dumps({"flag": None}))
syncs.flush(True)
"""


def _runtime_files(mode: str) -> dict[str, bytes]:
    from patchkit import registry
    from patchkit.state import vendoring

    return vendoring.runtime_files([registry.by_id("needs-cpu-seq-lens")], mode)


def _tree(root: Path, mode: str | None) -> Path:
    """A tree with a Scheduler; ``mode``: the runtime patchkit vendors (None: pristine)."""
    for pkg in ("sglang", "sglang/srt", "sglang/srt/managers"):
        _write(root / pkg / "__init__.py", "")
    if mode is None:
        lines = dict(import_line="", decide_line="pass")
    else:
        lines = dict(
            import_line="from sglang.srt._patchkit.runtime import configure_needs_cpu_seq_lens",
            decide_line="decide(server_args)",
        )
        for rel, data in _runtime_files(mode).items():
            (root / "sglang" / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / "sglang" / rel).write_bytes(data)
    _write(root / "sglang" / "srt" / "managers" / "scheduler.py", SCHEDULER.format(**lines))
    return root


def test_runtime_modules_are_where_patched_code_imports_them():
    from patchkit.layout import import_path

    assert ranks.RUNTIME_MODULES[0] == import_path("runtime.seq_lens")
    assert ranks.RUNTIME_MODULES[1] == "patchkit.runtime.seq_lens"
    assert "runtime/seq_lens.py" in {rel.split("_patchkit/", 1)[1] for rel in _runtime_files("vendored")}


def test_each_scheduler_process_notes_its_rank_and_decision(tmp_path):
    """Two ranks of a vendored tree, one of a package-mode tree, a pristine rank
    and a process that is no scheduler, each a fresh interpreter: every dump
    says which rank it is and what the patched ranks decided."""
    pytest.importorskip("torch")
    sync_dir = tmp_path / "syncs"
    trees = {mode: _tree(tmp_path / (mode or "pristine"), mode) for mode in ("vendored", "package", None)}
    jobs = [
        ("vendored", 0, "positional"),
        ("vendored", 1, "keywords"),
        ("package", 2, "positional"),
        (None, 3, "positional"),
        ("vendored", 9, "none"),
    ]
    procs = []
    for mode, rank, how in jobs:
        env = dict(
            os.environ, PK_E2E_SYNC_DIR=str(sync_dir), PYTHONPATH=os.pathsep.join([str(trees[mode]), str(repo_root())])
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", _CHILD, str(rank), how],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    flags = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert "hook on" not in err, err
        flags.append(json.loads(out.splitlines()[-1])["flag"] if out.strip() else "-")
    assert flags == [False, False, False, None, "-"]

    dumps = ranks.read(str(sync_dir))
    assert len(dumps) == 5
    assert sorted(ranks.by_rank(dumps)) == [0, 1, 2, 3]  # the non-scheduler process has no rank
    per_rank = {r["tp_rank"]: r for r in ranks.run_per_rank(dumps)}
    assert [per_rank[r]["decisions"] for r in range(4)] == [[False], [False], [False], []]
    assert ranks.decisions({"ranks": list(per_rank.values())}) == {0: False, 1: False, 2: False, 3: None}
    assert per_rank[1]["rank_source"] == ["Scheduler attributes"]
    note = next(d for d in dumps if ranks.rank_of(d) == 1)["notes"]["rank"]
    assert note == {"tp_rank": 1, "pp_rank": 0, "gpu_id": 1, "source": "Scheduler attributes"}  # dp_rank None


@pytest.mark.trees
@pytest.mark.parametrize("release", wheels.RELEASES)
def test_the_scheduler_of_each_release_names_its_rank_as_the_hook_reads_it(release):
    """What ranks.py wraps: ``Scheduler.__init__`` in ``sglang.srt.managers.scheduler``,
    taking the rank fields as parameters (the hook binds them first); up to 0.5.12.post1
    it also keeps ``tp_rank`` on ``self`` (0.5.13 hands it to a parallel-state object)."""
    from patchkit.fetch import fetch_tree

    path = fetch_tree(release) / Path(*ranks.SCHEDULER_MODULE.split(".")[1:]).with_suffix(".py")
    cls = next(n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef) and n.name == "Scheduler")
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    assert set(ranks.RANK_FIELDS) - set(ranks.ATTRIBUTE_ONLY_FIELDS) <= {a.arg for a in init.args.args}
    kept = any(isinstance(n, ast.Assign) and ast.unparse(n) == "self.tp_rank = tp_rank" for n in ast.walk(init))
    assert kept or release == "0.5.13"
    # DP attention's attn_tp_rank (issue 58): an attribute the scheduler sets itself
    source = ast.unparse(cls)
    assert all(f"self.{field}" in source for field in ranks.ATTRIBUTE_ONLY_FIELDS) or release == "0.5.13"


# ---------------------------------------------------------------- reading side


def _dump(pid: int, counts: dict, rank: int | None = None, decisions=()) -> dict:
    notes = {}
    if rank is not None:
        notes["rank"] = {"tp_rank": rank, "gpu_id": rank, "source": "Scheduler.__init__ arguments"}
    if decisions:
        notes["needs_cpu_seq_lens"] = list(decisions)
    return {"pid": pid, "counts": counts, "notes": notes}


def test_ranks_from_recorded_process_files(tmp_path):
    """Dumps as the processes write them (the engine, the detokenizer, one
    scheduler per rank): per rank, the timed syncs and decode steps between two
    reads, and over the whole run the decision and every sync site."""
    start = "item|sglang/srt/mem_cache/memory_pool.py:_init_kv_copy_and_warmup:80"
    before = [
        _dump(10, {"cpu|<other>:x.py:f:1": 3}),
        _dump(11, {}),
        _dump(12, {start: 1, f"cpu|{PFD}:174": 4, PFD_CALL: 4}, 0, [False]),
        _dump(13, {start: 1, f"cpu|{PFD}:174": 4, PFD_CALL: 4}, 1, [False]),
    ]
    after = [
        _dump(10, {"cpu|<other>:x.py:f:1": 9}),
        _dump(11, {}),
        _dump(12, {start: 1, f"cpu|{PFD}:174": 14, PFD_CALL: 14}, 0, [False]),
        _dump(13, {start: 1, f"cpu|{PFD}:174": 4, PFD_CALL: 14}, 1, [False]),
    ]
    sync_dir = tmp_path / "syncs"
    sync_dir.mkdir()
    for d in after:
        (sync_dir / f"syncs-{d['pid']}.json").write_text(json.dumps(d))
    (sync_dir / "syncs-99.json.tmp").write_text("{")  # being replaced: skipped
    read = ranks.read(str(sync_dir))
    assert ranks.read(None) == [] and len(read) == 4

    no_worker_steps = {"decode": 0, "extend": 0, "idle": 0}
    assert ranks.batch_per_rank(read, before) == [
        {"tp_rank": 0, "syncs": {f"cpu|{PFD}:174": 10}, "decode_steps": 10, "worker_steps": no_worker_steps},
        {"tp_rank": 1, "syncs": {}, "decode_steps": 10, "worker_steps": no_worker_steps},
    ]
    whole = ranks.run_per_rank(read)
    assert [r["tp_rank"] for r in whole] == [0, 1] and [r["pids"] for r in whole] == [[12], [13]]
    assert whole[0]["needs_cpu_seq_lens"] is False and whole[0]["decisions"] == [False]
    assert whole[1]["syncs_whole_run"] == {start: 1, f"cpu|{PFD}:174": 4}
    # a rank counted twice (pipeline parallel: one process per stage) sums its processes
    assert ranks.batch_per_rank(read + [_dump(14, {PFD_CALL: 2}, 1)], before)[1]["decode_steps"] == 12


# ---------------------------------------------------------------- report


def _run(
    per_rank_steps: dict, pfd_per_rank: dict, decisions: dict, ids=((5, 6, 7),), tok_s=100.0, whole: dict | None = None
) -> dict:
    """A runner result of a TP run with one batch size."""
    ranks_batch = [
        {"tp_rank": r, "decode_steps": s, "syncs": {f"cpu|{PFD}:174": pfd_per_rank[r]} if pfd_per_rank[r] else {}}
        for r, s in per_rank_steps.items()
    ]
    total = sum(per_rank_steps.values())
    return {
        "size": "small",
        "tp_size": len(per_rank_steps),
        "batches": [
            {
                "batch_size": 1,
                "syncs": {f"cpu|{PFD}:174": sum(pfd_per_rank.values())},
                "decode_steps": total,
                "tok_per_s": tok_s,
                "ms_per_token": 1000 / tok_s,
                "accept_length": 1.0,
                "deterministic": True,
                "output_ids": [list(x) for x in ids],
                "ranks": ranks_batch,
            }
        ],
        "ranks": [
            {
                "tp_rank": r,
                "needs_cpu_seq_lens": decisions.get(r),
                "decisions": [] if decisions.get(r) is None else [decisions[r]],
                "syncs_whole_run": (whole or {}).get(r, {}),
            }
            for r in per_rank_steps
        ],
    }


PRISTINE = _run({0: 1280, 1: 1280}, {0: 1280, 1: 1280}, {})


def test_ranks_agree_and_the_sync_is_gone_on_every_rank():
    patched = _run({0: 1280, 1: 1280}, {0: 0, 1: 0}, {0: False, 1: False}, tok_s=110.0)
    rows = rank_report.compare("0.5.12.post1", PRISTINE, patched)
    assert [(r["tp_rank"], r["prepare_per_step"], r["decision"]) for r in rows] == [
        (0, (1.0, 0.0), False),
        (1, (1.0, 0.0), False),
    ]
    assert rank_report.verdict(rows, tp=2) == []
    md = rank_report.markdown(rows)
    assert (
        "| 0.5.12.post1 | small | 2 | 1 | 1 | 1 | False | 1.00 → 0.00 | n/a → n/a | n/a → n/a "
        "| 0 / 0 → 0 / 0 | none | 100.0 → 110.0 | yes |"
    ) in md
    # the engine-wide table of the same run: all ranks summed, still 1 → 0 per step
    (row,) = report.compare("0.5.12.post1", PRISTINE, patched)
    assert row["prepare_per_step"] == (1.0, 0.0) and report.verdict([row]) == []


def test_ranks_that_disagree_fail_the_verdict():
    patched = _run({0: 1280, 1: 1280}, {0: 0, 1: 1280}, {0: False, 1: True})
    problems = rank_report.verdict(rank_report.compare("0.5.12.post1", PRISTINE, patched), tp=2)
    assert "ranks disagree on needs_cpu_seq_lens: rank 0 False, rank 1 True" in problems
    assert any("rank 1: patched decided needs_cpu_seq_lens=True (expected False" in p for p in problems)
    assert any("bs=1 rank 1: patched has 1.00 prepare_for_decode syncs/step (expected 0)" in p for p in problems)
    assert [p for p in problems if "rank 0" in p] == ["ranks disagree on needs_cpu_seq_lens: rank 0 False, rank 1 True"]


def test_one_rank_still_syncing_fails_even_when_both_decided_alike():
    # both ranks say False, but rank 1 still copies (as a worker path the decision
    # does not reach would): the engine-wide mean 0.50/step and the rank row say so
    patched = _run({0: 1280, 1: 1280}, {0: 0, 1: 1280}, {0: False, 1: False})
    rows = rank_report.compare("0.5.12.post1", PRISTINE, patched)
    problems = rank_report.verdict(rows, tp=2)
    assert problems == ["0.5.12.post1 small bs=1 rank 1: patched has 1.00 prepare_for_decode syncs/step (expected 0)"]
    assert (
        rank_report.markdown(rows)
        .splitlines()[-1]
        .startswith("| 0.5.12.post1 | small | 2 | 1 | 1 | 1 | False | 1.00 → 1.00 |")
    )


def test_missing_rank_missing_decision_and_new_site_per_rank():
    new = {1: {"tolist|sglang/srt/managers/scheduler.py:f:9": 1}}
    patched = _run({0: 1280}, {0: 0}, {}, whole=new)
    problems = rank_report.verdict(rank_report.compare("0.5.10", PRISTINE, patched), tp=2)
    assert "rank 0: the patched scheduler recorded no needs_cpu_seq_lens decision" in problems
    assert any("bs=1 rank 1: no sync counts from the patched process" in p for p in problems)
    patched = _run({0: 1280, 1: 1280}, {0: 0, 1: 0}, {0: False, 1: False}, whole=new)
    problems = rank_report.verdict(rank_report.compare("0.5.10", PRISTINE, patched), tp=2)
    assert problems == [
        "0.5.10 small bs=1 rank 1: new sync sites in the patched process's whole run "
        "(after start-up): tolist sglang/srt/managers/scheduler.py:f"
    ]
    assert (
        rank_report.verdict(rank_report.compare("0.5.10", PRISTINE, patched), tp=4)[0]
        == "ranks counted: [0, 1], expected [0, 1, 2, 3]"
    )


def test_mirror_kept_backend_wants_true_on_every_rank():
    kept = _run({0: 1280, 1: 1280}, {0: 1280, 1: 1280}, {0: True, 1: True})
    assert rank_report.verdict(rank_report.compare("0.5.12.post1", PRISTINE, kept), tp=2, mirror_kept=True) == []
    assert len(rank_report.verdict(rank_report.compare("0.5.12.post1", PRISTINE, kept), tp=2)) == 4


# ---------------------------------------------------------------- --tp to the engine

#: Releases the harness serves at TP 1 and piecewise as defaulted only: 0.5.9 (issue
#: 43) has no enforce_disable_flashinfer_allreduce_fusion, which TP 2 needs on this
#: image, nor 0.5.10's piecewise switches (--piecewise on / off).
TP1_ONLY = ("0.5.9",)


def _server_args_fields(release: str) -> set[str]:
    from patchkit.fetch import fetch_tree

    tree = ast.parse((fetch_tree(release) / "srt" / "server_args.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


@pytest.mark.trees
@pytest.mark.parametrize("release", wheels.RELEASES)
def test_tp_engine_kwargs_are_server_args_of_each_release(release, tmp_path):
    kwargs = runner.engine_kwargs(
        tmp_path / "t",
        tmp_path / "d",
        attention_backend="triton",
        cuda_graph_max_bs=8,
        mem_fraction_static=0.6,
        tp_size=2,
    )
    assert kwargs["tp_size"] == 2 and kwargs["enforce_disable_flashinfer_allreduce_fusion"] is True
    assert not kwargs["enable_nccl_nvls"] and not kwargs["enable_symm_mem"]
    fields = _server_args_fields(release)
    if release in TP1_ONLY:
        assert set(kwargs) - fields == {"enforce_disable_flashinfer_allreduce_fusion"}
    else:
        assert set(kwargs) - fields == set()
    for piecewise in ("on", "off"):  # issue 40's switches: ServerArgs fields of every release too
        switched = runner.engine_kwargs(
            tmp_path / "t",
            tmp_path / "d",
            attention_backend="fa3",
            cuda_graph_max_bs=8,
            mem_fraction_static=0.6,
            piecewise=piecewise,
            context_length=8192,
        )
        # 0.5.9 runs piecewise as it defaults it (off): its one switch is
        # enable_piecewise_cuda_graph, not 0.5.10's enforce_/disable_piecewise_cuda_graph
        switch = {"on": "enforce_piecewise_cuda_graph", "off": "disable_piecewise_cuda_graph"}[piecewise]
        missing = {switch} if release in TP1_ONLY else set()
        assert set(switched) - fields == missing
    single = runner.engine_kwargs(
        tmp_path / "t", tmp_path / "d", attention_backend="triton", cuda_graph_max_bs=8, mem_fraction_static=0.6
    )
    assert single["tp_size"] == 1 and "enable_nccl_nvls" not in single


@pytest.mark.slow
@pytest.mark.parametrize("rank1", ["", "still syncing"])
def test_orchestrate_tp_reaches_the_engine_and_judges_per_rank(tmp_path, monkeypatch, rank1):
    """``--tp 2`` end to end on CPU with a stand-in Engine: the runner starts it
    with tp_size=2 and multicast off, records per-rank counts and decisions, and
    the verdict reads them (rank 1 still syncing fails it)."""
    pytest.importorskip("torch")  # the bundle's sitecustomize counts syncs in the runner
    from gpu_e2e import orchestrate

    monkeypatch.setattr(ranks, "gpus_visible", lambda: 2)
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")  # the orchestrator sets it off again
    monkeypatch.setenv("PK_FAKE_RANK1", rank1)
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
            "--batch-sizes",
            "1",
            "--runs",
            "2",
            "--max-new-tokens",
            "8",
            "--tp",
            "2",
            "--run-timeout",
            "240",
        ]
    )
    results = json.loads((out / "results.json").read_text())
    assert sorted(results["runs"]) == ["9.9/small/triton/tp2/patched", "9.9/small/triton/tp2/pristine"]
    for key, run in results["runs"].items():
        assert run["rc"] == 0, (key, (out / "engine.log").read_text()[-3000:])
        assert run["engine_kwargs"]["tp_size"] == 2 and run["tp_size"] == 2
        assert [r["tp_rank"] for r in run["batches"][0]["ranks"]] == [0, 1]
    assert ranks.decisions(results["runs"]["9.9/small/triton/tp2/patched"]) == {0: False, 1: bool(rank1)}
    table = (out / "ranks.md").read_text()
    if not rank1:
        assert rc == 0 and results["problems"] == []
        assert (
            "| 9.9 | small | 2 | 1 | 1 | 1 | False | 1.00 → 0.00 | n/a → n/a | 1.00 → 0.00 | 16 / 0 → 16 / 0 | none |"
            in table
        )
    else:
        assert rc == 1
        assert "ranks disagree on needs_cpu_seq_lens: rank 0 False, rank 1 True" in results["problems"]
        assert "| 9.9 | small | 2 | 1 | 1 | 1 | True | 1.00 → 1.00 |" in table
