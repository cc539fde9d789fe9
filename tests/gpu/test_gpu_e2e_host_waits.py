"""gpu_e2e's host-wait counter on CPU (issue 53): torch's sync warning -> a count by
sglang call site, the pageable-copy check's decision and wrappers, the penalized
workload, and the per-site report pristine against patched. The same counter on a
GPU: tests/gpu/test_gpu_host_waits.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gpu_e2e import host_waits, report, wait_report, workloads
from gpu_e2e.bundle import repo_root

PFD = "sglang/srt/speculative/eagle_info_v2.py:prepare_for_decode"
SCHED = "sglang/srt/managers/scheduler.py:process_batch_result_decode"


# ------------------------------------------------------------- the decisions


@pytest.mark.parametrize(
    "pinned,dense,same_dtype,reason",
    [
        (True, True, True, None),  # pinned, dense, no conversion: the DMA engine reads it directly
        (False, True, True, "unpinned"),
        (True, False, True, "non-dense"),  # torch makes a contiguous (pageable) copy first
        (True, True, False, "converted"),  # torch converts on the host into a pageable tensor
        (False, False, False, "non-dense"),
    ],
)
def test_staging_reason(pinned, dense, same_dtype, reason):
    assert host_waits.staging_reason(pinned=pinned, dense=dense, same_dtype=same_dtype) == reason


def test_copy_kind_counts_pageable_copies_whether_or_not_non_blocking():
    assert host_waits.copy_kind("unpinned", non_blocking=True) == "h2d-nb"
    assert host_waits.copy_kind("unpinned", non_blocking=False) == "h2d"
    assert host_waits.copy_kind(None, non_blocking=True) is None
    assert host_waits.copy_kind(None, non_blocking=False) is None


def test_blocking_count_takes_torch_warnings_and_the_silent_pageable_copies():
    # a blocking pageable copy is in torch's count already: not counted twice
    assert host_waits.blocking_count({"sync": 2, "h2d": 2, "h2d-nb": 1}) == 3
    assert host_waits.blocking_count({"h2d": 4}) == 0
    assert host_waits.blocking_count({}) == 0


def test_is_sync_warning():
    assert host_waits.is_sync_warning(
        UserWarning(
            "called a synchronizing CUDA operation (Triggered internally at /pytorch/c10/cuda/CUDAFunctions.cpp:184.)"
        )
    )
    assert not host_waits.is_sync_warning("Synchronization debug mode is a prototype feature")


def test_to_target_reads_every_form_of_tensor_to():
    torch = pytest.importorskip("torch")
    t = torch.zeros(2)
    assert host_waits.to_target(("cuda",), {}, torch) == ("cuda", None, False)
    assert host_waits.to_target((), {"device": "cuda:1", "non_blocking": True}, torch) == ("cuda", None, True)
    assert host_waits.to_target((torch.device("cuda"), torch.int64, True, False), {}, torch) == (
        "cuda",
        torch.int64,
        True,
    )
    assert host_waits.to_target((torch.float16, False, True), {}, torch) == (None, torch.float16, False)
    assert host_waits.to_target((t, True), {}, torch) == ("cpu", torch.float32, True)
    assert host_waits.to_target((0,), {}, torch) == ("cuda", None, False)


# --------------------------------------------- in a fresh interpreter, on CPU

PROBE = """
import warnings
import torch

def blocking_item():
    warnings.warn("called a synchronizing CUDA operation (Triggered internally at x.cpp:1.)")

def under_library_filters():
    warnings.simplefilter("ignore")
    warnings.warn("called a synchronizing CUDA operation")
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("ignore")
        warnings.warn("called a synchronizing CUDA operation")

def copies():
    host = torch.arange(8)
    for call in (lambda: host.to("cuda", non_blocking=True),
                 lambda: host.cuda(),
                 lambda: torch.tensor([1, 2, 3], device="cuda"),
                 lambda: host.to(torch.float16)):
        try:
            call()
        except (RuntimeError, AssertionError):
            pass  # no CUDA here: the check ran before torch refused

def other_warning():
    warnings.warn("something else")
"""

RUN = """
import json, sys
sys.path[:0] = [{root!r}, {tree!r}]
from gpu_e2e import syncs
syncs.install({dump!r})
from sglang.srt import probe
probe.other_warning()
for _ in range(3):
    probe.blocking_item()
probe.under_library_filters()
probe.copies()
syncs.flush(True)
"""


def _line(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_warnings_and_copies_become_counts_at_the_sglang_site(tmp_path):
    pytest.importorskip("torch")
    tree = tmp_path / "tree"
    probe = tree / "sglang" / "srt" / "probe.py"
    probe.parent.mkdir(parents=True)
    for pkg in (tree / "sglang", tree / "sglang" / "srt"):
        (pkg / "__init__.py").write_text("")
    probe.write_text(PROBE)
    dump = tmp_path / "dump"
    script = RUN.format(root=str(repo_root()), tree=str(tree), dump=str(dump))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (name,) = [n for n in os.listdir(dump) if n.startswith("syncs-")]
    counts = json.loads((dump / name).read_text())["counts"]
    site = "sglang/srt/probe.py"
    warn = 'warnings.warn("called a synchronizing CUDA operation")'
    first, second = (i for i, line in enumerate(PROBE.splitlines(), 1) if line.strip() == warn)
    got = {k: v for k, v in counts.items() if k.split("|")[0] in host_waits.KINDS}
    assert got == {
        # every warning counted, the same line three times, under "ignore" filters too
        f"sync|{site}:blocking_item:{_line(PROBE, 'x.cpp:1')}": 3,
        f"sync|{site}:under_library_filters:{first}": 1,
        f"sync|{site}:under_library_filters:{second}": 1,
        # pageable copies: non_blocking (torch silent), blocking .cuda(), torch.tensor(list)
        f"h2d-nb|{site}:<lambda>:{_line(PROBE, 'non_blocking=True')}": 1,
        f"h2d|{site}:<lambda>:{_line(PROBE, 'host.cuda()')}": 1,
        f"h2d|{site}:<lambda>:{_line(PROBE, 'torch.tensor([1, 2, 3]')}": 1,
    }
    assert "something else" in proc.stderr  # other warnings still shown
    assert "called a synchronizing" not in proc.stderr  # counted, not printed


# ------------------------------------------------------------------- workload


def test_penalized_workload_asks_for_the_penalizers():
    reqs = workloads.build("penalized", 4, input_len=32, max_new_tokens=256, vocab=1000, seed=8)
    same = workloads.build("uniform", 4, input_len=32, max_new_tokens=256, vocab=1000, seed=8)
    assert [r.input_ids for r in reqs] == [r.input_ids for r in same]
    assert workloads.params(reqs[0]) == {
        "temperature": 0.0,
        "max_new_tokens": 256,
        "ignore_eos": True,
        "frequency_penalty": workloads.PENALTY,
        "presence_penalty": workloads.PENALTY,
    }
    assert workloads.params(same[0]) == {"temperature": 0.0, "max_new_tokens": 256, "ignore_eos": True}


# --------------------------------------------------------------------- report


def _batch(syncs, steps=100, armed=True, ids=((1, 2),)):
    return {
        "batch_size": 8,
        "workload": "penalized",
        "syncs": syncs,
        "decode_steps": steps,
        "output_ids": [list(x) for x in ids],
        "tok_per_s": 100.0,
        "ms_per_token": 1.0,
        "accept_length": 1.0,
        "deterministic": True,
        "sync_debug_armed": armed,
    }


PRISTINE = {
    f"sync|{PFD}:167": 100,
    f"sync|{PFD}:168": 100,
    f"sync|{PFD}:174": 100,
    f"h2d|{PFD}:167": 100,
    f"cpu|{PFD}:174": 100,
    f"wait|{SCHED}:10": 100,
    "call|x.prepare_for_decode": 100,
}
PATCHED = {f"sync|{PFD}:168": 100, f"sync|{PFD}:169": 100, f"wait|{SCHED}:10": 100, "call|x.prepare_for_decode": 100}


def _run(batch, whole=None, startup=None):
    return {
        "size": "small",
        "batches": [batch],
        "syncs_whole_run": whole or batch["syncs"],
        "syncs_startup": startup or {},
    }


def test_sites_group_lines_by_function_and_count_host_waits():
    s = wait_report.sites(PRISTINE)
    assert list(s) == [PFD]  # the wrapper's kinds and the probe calls are not torch's count
    assert s[PFD] == {"kinds": {"sync": 300, "h2d": 100}, "lines": [167, 168, 174], "blocking": 300}


def test_compare_lists_sites_in_both_with_their_counts_and_keeps_the_wrapper_beside():
    (row,) = report.compare("0.5.12.post1", _run(_batch(PRISTINE)), _run(_batch(PATCHED)))
    w = row["waits"]
    assert w["per_step"] == (3.0, 2.0) and w["wrapper_per_step"] == (2.0, 1.0)
    assert w["sites"][PFD]["per_step"] == (3.0, 2.0)
    assert w["sites"][PFD]["lines"] == ([167, 168, 174], [168, 169])
    assert w["new"] == [] and w["more"] == []
    assert row["prepare_per_step"] == (1.0, 0.0)  # the old column: the wrapper's count alone
    assert wait_report.problems([row]) == []
    md = wait_report.markdown([row])
    assert "`speculative/eagle_info_v2.py:prepare_for_decode` (167,168,174 → 168,169) 3.00 → 2.00" in md
    assert "| 3.00 → 2.00 |" in md and "| 2.00 → 1.00 | yes |" in md


def test_a_site_only_patched_waits_at_fails_and_so_does_waiting_more():
    extra = {
        **PATCHED,
        "sync|sglang/srt/layers/attention/triton_backend.py:init_forward_metadata:90": 100,
        f"sync|{PFD}:170": 200,
    }
    (row,) = report.compare("0.5.12.post1", _run(_batch(PRISTINE)), _run(_batch(extra)))
    problems = wait_report.problems([row])
    assert any(
        "pristine never waits at: sglang/srt/layers/attention/triton_backend.py:init_forward_metadata" in p
        for p in problems
    )
    assert any("more host waits per step than pristine at: " + PFD in p for p in problems)
    assert "**new**" in wait_report.markdown([row])


def test_a_new_site_seen_only_at_start_up_is_a_note_not_a_failure():
    capture = {"sync|sglang/srt/model_executor/graph.py:capture:5": 40}
    patched = _run(_batch(PATCHED), whole={**PATCHED, **capture}, startup=capture)
    (row,) = report.compare("0.5.12.post1", _run(_batch(PRISTINE)), patched)
    assert row["new_wait_sites_whole_run"] == []
    assert row["new_wait_sites_startup"] == ["sglang/srt/model_executor/graph.py:capture"]
    assert wait_report.problems([row]) == []
    after = _run(_batch(PATCHED), whole={**PATCHED, **capture}, startup={})
    (row,) = report.compare("0.5.12.post1", _run(_batch(PRISTINE)), after)
    assert wait_report.problems([row]) == [
        "0.5.12.post1 small: host waits after start-up at a site pristine never waits at: "
        "sglang/srt/model_executor/graph.py:capture"
    ]


def test_runs_before_issue_53_have_no_torch_count():
    (row,) = report.compare("0.5.12.post1", _run(_batch(PRISTINE, armed=False)), _run(_batch(PATCHED)))
    assert "waits" not in row and wait_report.markdown([row]).count("\n") == 4  # header only
