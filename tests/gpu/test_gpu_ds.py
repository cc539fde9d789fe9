"""Issue 44's harness pieces on CPU (DeepSeek MTP model, FlashMLA's carried kernel,
the tree-mask probe, the Engine settings) and its recorded H100 runs
(docs/results/gpu-ds-2026-11-26/, docs/gpu.md's section): tables, verdicts, failures
and the patched tree's digest recomputed from the JSON. Nothing here needs a GPU."""

from __future__ import annotations

import hashlib
import json
import types
import zipfile
from pathlib import Path

import pytest

from gpu_e2e import bundle_kernels, deepseek, engine_facts, orchestrate, report, runner, syncs, tables, tree_mask_probe
from gpu_e2e.bundle import repo_root
from gpu_e2e.report import tree_digest

RUNS = repo_root() / "docs" / "results" / "gpu-ds-2026-11-26"
PFD = "sglang/srt/speculative/eagle_info_v2.py:prepare_for_decode"


def _results(step: str) -> dict:
    return json.loads((RUNS / step / "results.json").read_text())


# ---------------------------------------------------------------- model


def test_deepseek_target_is_shaped_like_v3(tmp_path):
    folder = deepseek.write_model(tmp_path, "ds")
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architectures"] == ["DeepseekV3ForCausalLM"] and cfg["model_type"] == "deepseek_v3"
    assert (cfg["kv_lora_rank"], cfg["qk_rope_head_dim"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]) == (
        512,
        64,
        128,
        128,
    )
    assert cfg["vocab_size"] == 129280 and cfg["max_position_embeddings"] == 163840
    assert cfg["rope_scaling"]["type"] == "yarn" and cfg["rope_scaling"]["factor"] * 4096 == 163840
    assert cfg["num_nextn_predict_layers"] == 1  # the MTP draft, read from the same folder
    assert cfg["n_routed_experts"] % cfg["n_group"] == 0 and cfg["n_routed_experts"] // cfg["n_group"] <= 32
    assert deepseek.moe_layers("ds") == 3 and deepseek.moe_layers("ds-dense") == 0
    with pytest.raises(ValueError, match="unknown DeepSeek size"):
        deepseek.target_config("small")


def test_mtp_engine_settings_name_no_draft_path_and_take_extras():
    kw = runner.engine_kwargs(
        Path("/m/ds-target"),
        Path("/m/ds-target"),
        attention_backend="flashmla",
        cuda_graph_max_bs=8,
        mem_fraction_static=0.6,
        scenario="mtp",
        engine_extra={"page_size": 64, "speculative_eagle_topk": 1},
    )
    assert kw["speculative_algorithm"] == "NEXTN" and kw["speculative_draft_model_path"] is None
    assert kw["page_size"] == 64 and kw["attention_backend"] == "flashmla"
    assert "speculative_draft_load_format" not in kw  # the draft is dummy like the target
    tree = runner.engine_kwargs(
        Path("/t"),
        Path("/d"),
        attention_backend="fa3",
        cuda_graph_max_bs=16,
        mem_fraction_static=0.6,
        engine_extra={"speculative_eagle_topk": 4, "speculative_num_draft_tokens": 8, "cuda_graph_max_bs": 4},
    )
    assert (tree["speculative_eagle_topk"], tree["speculative_num_draft_tokens"], tree["cuda_graph_max_bs"]) == (
        4,
        8,
        4,
    )


def test_runner_refuses_a_deepseek_size_without_mtp(tmp_path):
    with pytest.raises(SystemExit, match="DeepSeek sizes run mtp"):
        runner.main(
            [
                "--tree-parent",
                str(tmp_path),
                "--variant",
                "patched",
                "--size",
                "ds",
                "--models-dir",
                str(tmp_path),
                "--out",
                str(tmp_path / "r.json"),
            ]
        )


def test_orchestrate_label_goes_into_the_key():
    args = types.SimpleNamespace(
        label="eager",
        scenario="mtp",
        deterministic=False,
        workloads="uniform",
        alternate=0,
        tp=1,
        piecewise="default",
        draft="checkpoint",
        context_length=0,
    )
    assert orchestrate._setting(args) == "eager-mtp/"


def test_mtp_runs_need_no_token_map():
    run = {"draft": "checkpoint", "scenario": "mtp", "engine_facts": [{"hot_token_id_shape": None}]}
    assert engine_facts.problems("k", run) == []
    assert engine_facts.problems("k", {**run, "scenario": "eagle3"})


# ---------------------------------------------------------------- carried kernel


def _fake_wheel(tmp_path: Path, payload: bytes) -> Path:
    wheel = tmp_path / "sglang_kernel-0-cp310-abi3-x.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("sgl_kernel/flashmla_ops.abi3.so", payload)
        zf.writestr("sgl_kernel/__init__.py", "")
    return wheel


def test_flashmla_kernel_travels_and_is_checked(tmp_path):
    payload = b"\x7fELF" + bytes(range(256)) * 64
    index = bundle_kernels.add(tmp_path / "b", _fake_wheel(tmp_path, payload), ["flashmla"])
    assert index["sgl_kernel/flashmla_ops.abi3.so"]["sha256"] == hashlib.sha256(payload).hexdigest()
    site = tmp_path / "site"
    (site / "sgl_kernel").mkdir(parents=True)
    assert bundle_kernels.install(tmp_path / "b", site) == ["sgl_kernel/flashmla_ops.abi3.so"]
    assert (site / "sgl_kernel" / "flashmla_ops.abi3.so").read_bytes() == payload
    assert bundle_kernels.install(tmp_path / "nothing", site) == []
    (site / "sgl_kernel" / "flashmla_ops.abi3.so").unlink()
    packed = tmp_path / "b" / "kernels" / "flashmla_ops.abi3.so.gz"
    import gzip

    packed.write_bytes(gzip.compress(payload + b"x"))
    with pytest.raises(SystemExit, match="sha256"):
        bundle_kernels.install(tmp_path / "b", site)
    with pytest.raises(SystemExit, match="unknown kernel"):
        bundle_kernels.member_of("fa4")


def test_a_whole_wheel_travels_checked_and_unpacks_once(tmp_path):
    """bundle --wheel sgl-deep-gemm (issue 72): the wheel rides in kernels/, the engines'
    common site gets its files before any start, once, and a wheel changed on the way stops it."""
    import zipfile

    wheel = tmp_path / "sgl_deep_gemm-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("deep_gemm/__init__.py", "VERSION = '0.1.0'\n")
    index = bundle_kernels.add_wheels(tmp_path / "b", {"sgl-deep-gemm": wheel})
    assert index["sgl-deep-gemm"]["sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
    site = tmp_path / "site"
    site.mkdir()
    assert bundle_kernels.install(tmp_path / "b", site) == [wheel.name]
    assert (site / "deep_gemm" / "__init__.py").read_text() == "VERSION = '0.1.0'\n"
    (site / "deep_gemm" / "__init__.py").write_text("edited")
    bundle_kernels.install(tmp_path / "b", site)  # already there (its marker): left as it is
    assert (site / "deep_gemm" / "__init__.py").read_text() == "edited"
    (tmp_path / "b" / "kernels" / wheel.name).write_bytes(b"not the wheel")
    (site / ".pk-wheel-sgl-deep-gemm").unlink()
    with pytest.raises(SystemExit, match="sha256"):
        bundle_kernels.install(tmp_path / "b", site)
    with pytest.raises(SystemExit, match="unknown wheel"):
        bundle_kernels.add_wheels(tmp_path / "c", {"deep-ep": wheel})


def test_the_v32_target_is_v3_with_the_published_indexer(tmp_path):
    cfg = json.loads((deepseek.write_model(tmp_path, "dsv32") / "config.json").read_text())
    v3 = deepseek.target_config("ds")
    assert cfg["architectures"] == ["DeepseekV32ForCausalLM"] and cfg["model_type"] == "deepseek_v32"
    assert (cfg["index_n_heads"], cfg["index_head_dim"], cfg["index_topk"]) == (64, 128, 2048)
    assert {k: v for k, v in cfg.items() if not k.startswith("index_")} == {
        **v3,
        "architectures": ["DeepseekV32ForCausalLM"],
        "model_type": "deepseek_v32",
    }
    assert "index_topk" not in v3 and deepseek.is_deepseek("dsv32")


# ---------------------------------------------------------------- tree-mask probe


def test_tree_mask_probe_counts_which_mask_a_step_took():
    module = types.ModuleType("fake_verify_tree_mask")
    module.verify_tree_mask_for_batch = lambda buf, backend, seq_lens, n: buf if backend == "fits" else None
    tree_mask_probe.wrap(module)
    tree_mask_probe.wrap(module)  # once only
    before = syncs.snapshot()["counts"]
    assert module.verify_tree_mask_for_batch("buf", "fits", None, 4) == "buf"
    assert module.verify_tree_mask_for_batch("buf", "too big", None, 4) is None
    assert module.verify_tree_mask_for_batch(None, "fits", None, 4) is None  # nothing offered: not counted
    got = tree_mask_probe.counts(syncs.delta(syncs.snapshot()["counts"], before))
    assert got == {"preallocated": 1, "per_batch": 1}
    assert syncs.syncs_only({"call|pk_probe.tree_mask_per_batch": 1}) == {}  # never a sync


# ---------------------------------------------------------------- recorded runs (H100)


@pytest.mark.parametrize("step,release,piecewise", [("d12-fa3", "0.5.12.post1", "on"), ("d10-fa3", "0.5.10", "off")])
def test_deepseek_mtp_on_fa3_reproduces_its_table(step, release, piecewise):
    data = _results(step)
    pristine, patched = (data["runs"][f"{release}/ds/default/mtp/{v}"] for v in ("pristine", "patched"))
    rows = report.compare(release, pristine, patched)
    assert engine_facts.backend_in_force(patched, "default") == "fa3"  # the release's choice, read back
    assert report.verdict(rows, mirror_kept=False) == []
    assert [r["identical"] for r in rows] == [True, True]
    assert report.markdown(rows) == tables.text(RUNS / step, "table.md")
    facts = [engine_facts.in_force(r) for r in (pristine, patched)]
    assert [f["draft_extend_graph_runner"] for f in facts] == ["None", "EAGLEDraftExtendCudaGraphRunner"]
    assert {f["model"] for f in facts} == {"DeepseekV3ForCausalLM"}
    assert {f["draft_model"] for f in facts} == {"DeepseekV3ForCausalLMNextN"}
    assert {f["context_len"] for f in facts} == {"163840"} and {f["piecewise"] for f in facts} == {piecewise}
    assert [b["tree_mask"]["preallocated"] for b in patched["batches"]] == [768, 768]


@pytest.mark.parametrize("release,tag", [("0.5.12.post1", "d12"), ("0.5.10", "d10")])
def test_flashmla_pristine_fails_in_draft_extend_and_patched_serves(release, tag):
    data = _results(f"{tag}-fmla")
    assert data["runs"][f"{release}/ds/flashmla/mtp/pristine"] == {"rc": -9}
    log = (RUNS / f"{tag}-fmla" / "engine.log").read_text()
    pristine_log = log.split(f"===== {release}/ds/flashmla/mtp/patched =====")[0]
    assert "_draft_extend_for_decode" in pristine_log
    assert "AttributeError: 'PrefillMetadata' object has no attribute 'block_kv_indices'" in pristine_log
    patched = data["runs"][f"{release}/ds/flashmla/mtp/patched"]
    f = engine_facts.in_force(patched)
    assert (f["attn_backend"], f["page_size"]) == ("FlashMLABackend", "64")
    fa3 = _results(f"{tag}-fa3")["runs"][f"{release}/ds/default/mtp/pristine"]
    for batch, ref in zip(patched["batches"], fa3["batches"]):
        assert batch["decode_steps"] > 0 and batch["deterministic"]
        assert not any(PFD in site for site in batch["syncs"])  # 0.00 prepare_for_decode syncs/step
        assert batch["output_ids"] == ref["output_ids"]  # token for token what pristine FA3 served


def test_tree_drafts_stop_where_the_docs_say():
    tree = _results("t12-tree")
    assert {k: r["rc"] for k, r in tree["runs"].items()} == {
        "0.5.12.post1/small/fa3/ctx4096/pristine": -9,
        "0.5.12.post1/small/fa3/ctx4096/patched": -9,
    }
    log = (RUNS / "t12-tree" / "engine.log").read_text()
    assert (
        log.count(
            "Piecewise CUDA Graph failed with error: FusedAddRMSNorm failed with error code an "
            "illegal memory access was encountered"
        )
        == 2
    )
    check = _results("t12-memcheck")["runs"]["0.5.12.post1/small/fa3/pw-off-ctx4096/patched"]
    assert check["rc"] == 0 and check["engine_facts"][0]["draft_worker"] == "EAGLEWorker"  # spec v1: topk 4
    assert check["engine_facts"][0]["speculative_eagle_topk"] == 4 and check["batches"][0]["batch_size"] == 16
    assert "Spec v1 is used" in (RUNS / "t12-memcheck" / "engine.log").read_text()
    assert "ERROR SUMMARY: 0 errors" in (RUNS / "t12-memcheck" / "memcheck.3095.log").read_text()


def test_docs_gpu_section_names_device_commit_and_patched_tree():
    text = (repo_root() / "docs" / "gpu.md").read_text()
    section = text.split("## DeepSeek MTP on Hopper (issue 44")[1].split("\n## ")[0]
    for step in ("d12-fa3", "d12-fmla", "t12-tree", "t12-memcheck", "d10-fa3", "d10-fmla"):
        data = _results(step)
        assert data["device"].startswith("NVIDIA H100") and data["patchkit_commit"][:7] in section
        for tree in data["trees"].values():
            assert f"`{tree_digest(tree['patched_files_sha256'])}`" in section
