"""gpu_e2e/profile_compare.py and --profile-batch's list: pristine against patched per decode step (issue 67)."""

import gzip
import json

from gpu_e2e import call_options, profile_compare, profile_run


def _x(cat, name, ts, dur):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7, "args": {"device": 0}}


def _trace(extra_gather_us=0.0, combine=False):
    """Two decode steps: a gemm and FA3's kernel each; patched adds a gather (and a combine)."""
    ev = [_x("cpu_op", "aten::mm", 0.0, 400.0), _x("user_annotation", "step[TARGET_VERIFY bs=16]", 0.0, 300.0)]
    for step in range(2):
        t = step * 200.0
        ev += [
            _x("kernel", "nvjet_tst_128x64", t + 10, 50.0),
            _x("kernel", "void flash::FlashAttnFwdSm90<...>", t + 70, 40.0),
        ]
        ev.append(_x("cuda_runtime", "cudaLaunchKernel", t + 5, 4.0))
        if extra_gather_us:
            ev.append(_x("kernel", "void at::native::index_elementwise_kernel<128, 4>", t + 120, extra_gather_us))
            ev.append(_x("cpu_op", "aten::index", t + 100, 15.0))
            ev.append(_x("cuda_runtime", "cudaStreamWaitEvent", t + 101, 2.0))
        if combine:
            ev.append(_x("kernel", "void flash::FlashAttnFwdCombine<...>", t + 160, 6.0))
    return ev


def test_categories_name_fa3_splits_gathers_copies_and_matmuls():
    assert profile_compare.category("void flash::FlashAttnFwdCombine<cute::tuple>") == "fa3 combine (splits)"
    assert profile_compare.category("void flash::prepare_varlen_num_blocks_kernel<1>") == "fa3 scheduler metadata"
    assert profile_compare.category("void flash::FlashAttnFwdSm90<...>") == "fa3 attention"
    assert profile_compare.category("void at::native::index_elementwise_kernel<128, 4>") == "gathers (index/gather)"
    assert (
        profile_compare.category("void at::native::vectorized_elementwise_kernel<4, copy_>") == "copies (copy/cat/fill)"
    )
    assert profile_compare.category("_fwd_grouped_kernel_stage1") == "triton attention"
    assert profile_compare.category("nvjet_tst_128x64") == "matmul"
    assert profile_compare.category("rms_norm_kernel") == profile_compare.OTHER


def test_step_profile_divides_by_steps_and_compare_puts_the_extra_time_on_its_kernel():
    a = profile_compare.step_profile(_trace(), steps=2)
    b = profile_compare.step_profile(_trace(extra_gather_us=30.0, combine=True), steps=2)
    assert a["categories_us"] == {"fa3 attention": 40.0, "matmul": 50.0}
    c = profile_compare.compare(a, b)
    assert c["categories_us"]["gathers (index/gather)"] == [0.0, 30.0, 30.0]
    assert c["categories_us"]["fa3 combine (splits)"] == [0.0, 6.0, 6.0]
    assert (
        c["kernels"][0]["name"].startswith("void at::native::index_elementwise") and c["kernels"][0]["diff_us"] == 30.0
    )
    assert c["cpu_ops"][0] == {"name": "aten::index", "calls": [0, 1.0], "us": [0.0, 15.0], "diff_us": 15.0}
    assert c["runtime"]["cudaStreamWaitEvent"][1] == {"calls": 1.0, "us": 2.0}
    assert c["phases"][0] == {
        "name": "host step[TARGET_VERIFY bs=16]",
        "calls": [0.5, 0.5],
        "us": [150.0, 150.0],
        "diff_us": 0.0,
    }
    assert c["runtime"]["cudaLaunchKernel"] == [{"calls": 1.0, "us": 4.0}, {"calls": 1.0, "us": 4.0}]


def test_report_pairs_the_runner_folders_and_reads_steps_from_the_results_file(tmp_path):
    for tree, extra in (("pristine", 0.0), ("patched", 30.0)):
        folder = tmp_path / f"0.5.12.post1_small_fa3_pfa3_{tree}.json.profile-uniform-bs16"
        folder.mkdir()
        with gzip.open(folder / "123-TP-0-DECODE.trace.json.gz", "wt") as fh:
            json.dump({"traceEvents": _trace(extra_gather_us=extra)}, fh)
        res = {"batches": [{"batch_size": 16, "workload": "uniform", "profile": {"ranks": [{"steps": 2}]}}]}
        (tmp_path / f"0.5.12.post1_small_fa3_pfa3_{tree}.json").write_text(json.dumps(res))
    rep = profile_compare.report(tmp_path, steps=99)
    cell = rep["cells"]["0.5.12.post1_small_fa3_pfa3/uniform/bs16"]
    assert cell["trees"]["pristine"]["steps"] == 2
    assert cell["compare"]["categories_us"]["gathers (index/gather)"][2] == 30.0
    md = profile_compare.markdown(rep)
    assert "gathers (index/gather) | 0.0 | 30.0 | +30.0" in md


def test_profile_batch_takes_a_list_and_the_orchestrator_passes_it_on_as_given():
    assert profile_run.batch_sizes("8,16") == frozenset({8, 16})
    assert profile_run.batch_sizes("0") == frozenset() and profile_run.batch_sizes(16) == frozenset({16})
    args = call_options.parser().parse_args(["--profile-batch", "8,16"])
    assert args.profile_batch == "8,16"
    assert call_options.parser().parse_args([]).profile_batch == "0"
