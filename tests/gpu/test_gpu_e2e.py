"""gpu_e2e on CPU: sync counting and attribution, the comparison, model configs, tree unpacking.

The GPU run itself is scripts/gpu_e2e.py (see docs/gpu.md); these tests
check its parts on recorded samples and on CPU tensors.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

from gpu_e2e import engine_facts, models, report, syncs, tables
from gpu_e2e.bundle import repo_root
from gpu_e2e.report import tree_digest

RECORDED = repo_root() / "docs" / "results" / "gpu-e2e"
PFD = "sglang/srt/speculative/eagle_info_v2.py:prepare_for_decode"


# ---------------------------------------------------------------- attribution


def test_site_of_filename():
    assert (
        syncs.site_of_filename("/tmp/x/patched/sglang/srt/managers/scheduler.py") == "sglang/srt/managers/scheduler.py"
    )
    # innermost sglang/ folder wins (a tree unpacked under a folder also named sglang)
    assert syncs.site_of_filename("/home/sglang/trees/sglang/srt/a.py") == "sglang/srt/a.py"
    assert syncs.site_of_filename("/site/patchkit/runtime/seq_lens.py") == "patchkit/runtime/seq_lens.py"
    assert syncs.site_of_filename("/site/patchkit/backends/trtllm_mla.py") == "patchkit/backends/trtllm_mla.py"
    assert syncs.site_of_filename("/opt/venv/lib/python3.12/site-packages/torch/tensor.py") is None
    assert syncs.site_of_filename("/site/sgl_kernel/elementwise.py") is None


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def test_attribute_walks_to_the_nearest_sglang_frame(tmp_path):
    # sglang code -> a helper outside sglang -> attribute(): the sglang frame is named
    helper = _write(
        tmp_path / "lib" / "helper.py",
        """
        import sys
        from gpu_e2e import syncs
        def where():
            return syncs.attribute(sys._getframe(0))
        """,
    )
    caller = _write(
        tmp_path / "tree" / "sglang" / "srt" / "mod.py",
        """
        import helper
        def prepare_for_decode():
            return helper.where()
        """,
    )
    sys.path[:0] = [str(helper.parent), str(caller.parent)]
    try:
        import importlib

        mod = importlib.import_module("mod")
        site = mod.prepare_for_decode()
    finally:
        del sys.path[:2]
        sys.modules.pop("mod", None)
        sys.modules.pop("helper", None)
    assert site == "sglang/srt/mod.py:prepare_for_decode:4"


def test_attribute_without_sglang_frame_names_the_caller():
    site = syncs.attribute(sys._getframe(0))
    assert site.startswith("<other>:") and site.endswith(
        f":test_attribute_without_sglang_frame_names_the_caller:{sys._getframe(0).f_lineno - 2}"
    )


# ---------------------------------------------------------------- aggregation


def test_aggregate_delta_and_calls():
    p1 = {
        "pid": 1,
        "counts": {
            f"cpu|{PFD}:174": 10,
            "call|sglang.srt.speculative.eagle_info_v2:EagleDraftInputV2Mixin.prepare_for_decode": 10,
        },
    }
    p2 = {"pid": 2, "counts": {"item|sglang/srt/x.py:f:3": 2}}
    total = syncs.aggregate([p1, p2])
    assert total[f"cpu|{PFD}:174"] == 10 and total["item|sglang/srt/x.py:f:3"] == 2
    later = dict(
        total,
        **{
            f"cpu|{PFD}:174": 25,
            "call|sglang.srt.speculative.eagle_info_v2:EagleDraftInputV2Mixin.prepare_for_decode": 25,
        },
    )
    d = syncs.delta(later, total)
    assert d == {
        f"cpu|{PFD}:174": 15,
        "call|sglang.srt.speculative.eagle_info_v2:EagleDraftInputV2Mixin.prepare_for_decode": 15,
    }
    assert syncs.calls_of(d, "prepare_for_decode") == 15
    assert syncs.syncs_only(d) == {f"cpu|{PFD}:174": 15}
    assert syncs.site_function(f"{PFD}:174") == PFD


_CHILD = r"""
import json, os, sys, torch
from gpu_e2e import syncs
assert syncs.install()
from sglang.srt.speculative import eagle_info_v2 as m   # probed at import

class FakeCuda(torch.Tensor):
    # a CPU tensor that says it is on CUDA: the counter only looks at is_cuda
    @property
    def is_cuda(self):
        return True

t = torch.arange(4)
m.EagleDraftInput().prepare_for_decode(t.as_subclass(FakeCuda))
m.EagleDraftInput().prepare_for_decode(t)            # a CPU tensor: not counted
torch.ones(2).cpu(); torch.ones(2).tolist(); torch.ones(1).item()
syncs.flush(True)
print(json.dumps(syncs.aggregate(syncs.read_dir(os.environ["PK_E2E_SYNC_DIR"]))))
"""


def _run_child(tmp_path, **extra_env) -> dict:
    _write(tmp_path / "tree" / "sglang" / "__init__.py", "")
    _write(tmp_path / "tree" / "sglang" / "srt" / "__init__.py", "")
    _write(tmp_path / "tree" / "sglang" / "srt" / "speculative" / "__init__.py", "")
    _write(
        tmp_path / "tree" / "sglang" / "srt" / "speculative" / "eagle_info_v2.py",
        """
        class EagleDraftInputV2Mixin:
            def prepare_for_decode(self, seq_lens):
                cpu = seq_lens.cpu()
                return cpu.tolist(), seq_lens.sum().item()

        class EagleDraftInput(EagleDraftInputV2Mixin):
            pass
        """,
    )
    env = dict(
        os.environ,
        PK_E2E_SYNC_DIR=str(tmp_path / "syncs"),
        PYTHONPATH=os.pathsep.join([str(tmp_path / "tree"), str(repo_root())]),
        **extra_env,
    )
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_install_counts_cuda_syncs_by_site_and_probes_calls(tmp_path):
    pytest.importorskip("torch")
    table = _run_child(tmp_path)
    site = "sglang/srt/speculative/eagle_info_v2.py:prepare_for_decode"
    # The fake's results claim CUDA too (subclasses propagate), so its .cpu(), .tolist()
    # and .item() count once each at their lines; the plain CPU tensor's and the
    # top-level CPU calls not at all; the probe saw both calls.
    assert table == {
        f"cpu|{site}:4": 1,
        f"tolist|{site}:5": 1,
        f"item|{site}:5": 1,
        "call|sglang.srt.speculative.eagle_info_v2:EagleDraftInputV2Mixin.prepare_for_decode": 2,
    }


def test_counters_off_installs_no_wrapper_and_counts_nothing(tmp_path):
    """Issue 57's timing without the instrument: the dump is there, the counts are not."""
    pytest.importorskip("torch")
    assert _run_child(tmp_path, **{syncs.ENV_COUNTERS_OFF: "1"}) == {}
    dumps = syncs.read_dir(str(tmp_path / "syncs"))
    assert dumps and dumps[0]["notes"] == {"counters": False}


# ---------------------------------------------------------------- comparison


def _batch(bs, syncs_table, steps, tok_s, ids, accept=1.0):
    return {
        "batch_size": bs,
        "syncs": syncs_table,
        "decode_steps": steps,
        "tok_per_s": tok_s,
        "ms_per_token": 1000.0 / tok_s * bs,
        "accept_length": accept,
        "deterministic": True,
        "output_ids": ids,
    }


def _variant(size, batches, whole=None):
    return {"size": size, "batches": batches, "syncs_whole_run": whole or {}}


PRISTINE = _variant(
    "small",
    [_batch(1, {f"cpu|{PFD}:174": 1280, "item|sglang/srt/a.py:f:9": 5}, 1280, 220.8, [[5, 6, 7]])],
    {f"cpu|{PFD}:174": 3072, "item|sglang/srt/a.py:f:9": 7},
)
PATCHED = _variant(
    "small", [_batch(1, {"item|sglang/srt/a.py:f:11": 5}, 1280, 371.0, [[5, 6, 7]])], {"item|sglang/srt/a.py:f:11": 7}
)


def test_compare_pristine_and_patched_shaped_tables():
    (row,) = report.compare("0.5.12.post1", PRISTINE, PATCHED)
    assert row["prepare_per_step"] == (1.0, 0.0)
    assert row["identical"] and row["new_sites"] == [] and row["new_sites_whole_run"] == []
    # lines move when a file is patched: sites compare by path:function
    assert row["other_sites"] == ({"item sglang/srt/a.py:f": 5}, {"item sglang/srt/a.py:f": 5})
    assert row["ratio"] == pytest.approx(371.0 / 220.8)
    assert report.verdict([row]) == []
    md = report.markdown([row])
    assert "| 0.5.12.post1 | small | 1 | 1.00 → 0.00 |" in md and "220.8 → 371.0" in md
    assert md.rstrip().endswith("| yes |")


def test_compare_flags_mismatching_outputs_and_new_sites():
    bad = _variant(
        "small",
        [_batch(1, {f"cpu|{PFD}:180": 1280, "tolist|sglang/srt/b.py:g:2": 1280}, 1280, 300.0, [[5, 6, 8]])],
        {"tolist|patchkit/runtime/seq_lens.py:host_list_or_none:3": 1},
    )
    (row,) = report.compare("0.5.10", PRISTINE, bad)
    assert not row["identical"] and row["mismatch"] == "request 0, token 2: 7 vs 8"
    assert row["new_sites"] == ["tolist sglang/srt/b.py:g"]
    problems = report.verdict([row])
    assert any("outputs differ" in p for p in problems)
    assert any("prepare_for_decode syncs/step (expected 0)" in p for p in problems)
    assert any("new sync sites in patched: tolist sglang/srt/b.py:g" in p for p in problems)
    assert any("whole run" in p and "host_list_or_none" in p for p in problems)
    assert "NO (request 0, token 2: 7 vs 8)" in report.markdown([row])


def test_speed_over_rounds_reads_each_process_pair():
    # Three rounds (a pristine and a patched engine process each): one ratio per
    # round, their median and range, and each variant's median over processes.
    rows = []
    for before, after in ((220.8, 371.0), (244.6, 262.1), (286.5, 327.2)):
        pristine = _variant("small", [_batch(1, PRISTINE["batches"][0]["syncs"], 1280, before, [[5, 6, 7]])])
        patched = _variant("small", [_batch(1, PATCHED["batches"][0]["syncs"], 1280, after, [[5, 6, 7]])])
        rows.extend(report.compare("0.5.12.post1", pristine, patched))
    (s,) = report.speed_summary(rows)
    assert s["rounds"] == 3 and s["tok_per_s"] == (244.6, 327.2)
    assert s["median_ratio"] == pytest.approx(327.2 / 286.5)
    md = report.speed_markdown(rows)
    assert (
        "| 0.5.12.post1 | small | 1 | 3 | 244.6 → 327.2 | 1.680, 1.072, 1.142 | 1.142 | 1.072 – 1.680 | n/a → n/a |"
        in md
    )


def test_fastest_run_over_processes():
    fast = dict(_batch(1, {}, 1280, 200.0, [[1]]), elapsed_s=[1.0, 1.0, 0.5])  # 200 tok/s median, 400 best
    slow = dict(_batch(1, {}, 1280, 300.0, [[1]]), elapsed_s=[1.0, 1.2, 1.0])
    rows = report.compare("r", _variant("small", [fast]), _variant("small", [slow]))
    assert rows[0]["best_tok_per_s"] == (pytest.approx(400.0), pytest.approx(300.0))
    assert report.speed_markdown(rows).rstrip().endswith("| 400.0 → 300.0 |")


def test_rounds_alternate_which_variant_starts_first():
    from gpu_e2e.orchestrate import _schedule

    got = list(_schedule(["small"], ["pristine", "patched"], 3))
    assert [order for _, _, order in got] == [["pristine", "patched"], ["patched", "pristine"], ["pristine", "patched"]]


def test_first_mismatch():
    assert report.first_mismatch([[1, 2]], [[1, 2]]) is None
    assert report.first_mismatch([[1, 2]], [[1, 2], [3]]) == "1 vs 2 requests"
    assert report.first_mismatch([[1, 2]], [[1, 2, 3]]) == "request 0: 2 vs 3 tokens"


@pytest.mark.parametrize(
    "run", sorted(p.name for p in RECORDED.glob("*/") if not p.name.startswith("proof2-")) if RECORDED.exists() else []
)
def test_recorded_gpu_runs_reproduce_their_table(run):
    """The committed GPU results: recomputing the comparison gives the committed table."""
    data = json.loads((RECORDED / run / "results.json").read_text())
    # The pair compared: pristine -> patched, or a run's own --compare (every patch but one -> every patch).
    before, after = (data["args"].get("compare") or "pristine,patched").split(",")
    rows, mirror_kept = [], False
    for key, res in sorted(data["runs"].items()):
        if key.endswith(f"/{before}") and key[: -len(before)] + after in data["runs"]:  # a cut-off call
            release, patched = key.split("/")[0], data["runs"][key[: -len(before)] + after]
            rows.extend(report.compare(release, res, patched))
            # "default": the backend sglang chose, as the patched engine read it back
            used = engine_facts.backend_in_force(patched, data["args"].get("attention_backend", "triton"))
            mirror_kept = used not in report.SYNC_FREE_BACKENDS
    assert rows
    if data["args"].get("compare"):  # two patched trees: the same outputs, no sync either side
        assert all(r["identical"] for r in rows)
    else:
        assert report.verdict(rows, mirror_kept=mirror_kept) == []
    assert report.markdown(rows) == tables.text(RECORDED / run, "table.md")
    speed = tables.text(RECORDED / run, "speed.md")
    if speed is not None:
        assert report.speed_markdown(rows) == speed


def test_docs_gpu_names_the_patched_trees_of_the_default_settings_runs():
    """docs/gpu.md's digest of each release's patched files is the one the
    runs' results.json record (issue 40's runs, 2026-11-26)."""

    text = (repo_root() / "docs" / "gpu.md").read_text()
    runs = sorted(RECORDED.glob("*-default-settings-2026-11-26/results.json"))
    assert runs
    for path in runs:
        data = json.loads(path.read_text())
        assert data["device"].startswith("NVIDIA H100") and data["patchkit_commit"][:7] in text
        for release, tree in data["trees"].items():
            assert f"| {release} | {tree_digest(tree['patched_files_sha256'])} |" in text, (
                path.parent.name,
                release,
            )


# ---------------------------------------------------------------- models / trees


def test_model_configs(tmp_path):
    for size, shape in models.SIZES.items():
        target, draft = models.write_models(tmp_path, size, "dummy")
        t = json.loads((target / "config.json").read_text())
        d = json.loads((draft / "config.json").read_text())
        assert t["architectures"] == ["LlamaForCausalLM"]
        assert d["architectures"] == ["LlamaForCausalLMEagle3"] and d["num_hidden_layers"] == 1
        assert d["draft_vocab_size"] == d["vocab_size"] == t["vocab_size"] == shape["vocab_size"]
        assert t["max_position_embeddings"] == d["max_position_embeddings"] == 131072
        # default EAGLE3 aux layers [2, L//2, L-3] must be three distinct layers
        n = t["num_hidden_layers"]
        assert len({2, n // 2, n - 3}) == 3
    assert models.target_config("8b")["hidden_size"] == 4096
    assert models.target_config("8b")["num_hidden_layers"] == 32


def test_prepare_trees_checks_the_overlay(tmp_path):
    from gpu_e2e import orchestrate

    bundle = tmp_path / "bundle"
    tdir = bundle / "trees" / "9.9"
    tdir.mkdir(parents=True)
    src = tmp_path / "src"
    _write(src / "sglang" / "a.py", "x = 1\n")
    _write(src / "sglang" / "b.py", "y = 1\n")
    with tarfile.open(tdir / "pristine.tar.gz", "w:gz") as tar:
        tar.add(src / "sglang", arcname="sglang")
    _write(src / "over" / "sglang" / "b.py", "y = 2\n")
    with tarfile.open(tdir / "overlay.tar.gz", "w:gz") as tar:
        tar.add(src / "over" / "sglang", arcname="sglang")
    sha = hashlib.sha256(b"y = 2\n").hexdigest()
    (tdir / "overlay.json").write_text(json.dumps({"b.py": sha}))
    trees = orchestrate.prepare_trees(bundle, "9.9", tmp_path / "work")
    assert (trees["pristine"] / "sglang" / "b.py").read_text() == "y = 1\n"
    assert (trees["patched"] / "sglang" / "b.py").read_text() == "y = 2\n"
    assert (trees["patched"] / "sglang" / "a.py").read_text() == "x = 1\n"
    (tdir / "overlay.json").write_text(json.dumps({"b.py": "0" * 64}))
    with pytest.raises(SystemExit, match="b.py has sha256"):
        orchestrate.prepare_trees(bundle, "9.9", tmp_path / "work")


def test_flashinfer_keeps_the_mirror_so_patched_keeps_the_sync():
    kept = _variant(
        "small", [_batch(1, {f"cpu|{PFD}:180": 1280, "item|sglang/srt/a.py:f:11": 5}, 1280, 230.0, [[5, 6, 7]])]
    )
    (row,) = report.compare("0.5.12.post1", PRISTINE, kept)
    assert row["prepare_per_step"] == (1.0, 1.0)
    assert report.verdict([row], mirror_kept=True) == []
    assert any("expected 0" in p for p in report.verdict([row]))
    (row,) = report.compare("0.5.12.post1", PRISTINE, PATCHED)
    assert any("expected 1" in p for p in report.verdict([row], mirror_kept=True))
