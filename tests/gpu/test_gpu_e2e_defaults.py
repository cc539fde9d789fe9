"""gpu_e2e runs what users run (issue 40), on CPU: piecewise CUDA graph and the
attention backend as the release defaults them (and read back from the engine), the
checkpoint-shaped EAGLE3 draft (draft vocab 32000 with a ``d2t`` map, written as
safetensors), the real context length, and the rule that sync sites seen only while
the patched engine starts (a graph a patch adds, captured) are reported, not failed."""

from __future__ import annotations

import json
import types

import pytest

from gpu_e2e import draft_checkpoint, engine_facts, models, orchestrate, rank_report, report, runner, sites

PFD = "sglang/srt/speculative/eagle_info_v2.py:prepare_for_decode"
CAPTURE = "item|sglang/srt/speculative/eagle_draft_extend_cuda_graph_runner.py:capture_one:9"


def _kwargs(tmp_path, **kw):
    return runner.engine_kwargs(tmp_path / "t", tmp_path / "d", cuda_graph_max_bs=8, mem_fraction_static=0.6, **kw)


# ------------------------------------------------------------------ server settings


def test_piecewise_and_attention_backend_default_to_the_release(tmp_path):
    kw = _kwargs(tmp_path, attention_backend="default")
    assert "disable_piecewise_cuda_graph" not in kw and "enforce_piecewise_cuda_graph" not in kw
    assert "attention_backend" not in kw  # sglang picks: FA3 on Hopper
    assert kw["load_format"] == "dummy" and kw["speculative_draft_load_format"] == "auto"
    assert _kwargs(tmp_path, attention_backend="triton", piecewise="off")["disable_piecewise_cuda_graph"] is True
    on = _kwargs(tmp_path, attention_backend="fa3", piecewise="on")
    assert on["enforce_piecewise_cuda_graph"] is True and on["attention_backend"] == "fa3"
    with pytest.raises(ValueError, match="piecewise 'maybe'"):
        _kwargs(tmp_path, attention_backend="fa3", piecewise="maybe")
    assert "speculative_draft_load_format" not in _kwargs(tmp_path, attention_backend="fa3", draft_kind="dummy")
    assert "speculative_draft_load_format" not in _kwargs(tmp_path, attention_backend="fa3", scenario="standalone")
    assert _kwargs(tmp_path, attention_backend="fa3", context_length=8192)["context_length"] == 8192


def test_orchestrator_key_names_the_non_default_settings():
    base = dict(
        scenario="eagle3",
        deterministic=False,
        workloads="uniform",
        alternate=0,
        tp=1,
        piecewise="default",
        draft="checkpoint",
        context_length=0,
    )
    ns = types.SimpleNamespace
    assert orchestrate._setting(ns(**base)) == ""
    assert orchestrate._setting(ns(**{**base, "piecewise": "off"})) == "pw-off/"
    assert orchestrate._setting(ns(**{**base, "draft": "dummy", "tp": 2})) == "tp2-draft-dummy/"


# ------------------------------------------------------------------ models and the draft


def test_targets_have_llama31_context_and_the_draft_is_checkpoint_shaped(tmp_path):
    for size in models.SIZES:
        target, draft = models.write_models(tmp_path, size)
        t = json.loads((target / "config.json").read_text())
        d = json.loads((draft / "config.json").read_text())
        assert t["max_position_embeddings"] == 131072 and t["rope_scaling"]["rope_type"] == "llama3"
        assert t["rope_scaling"]["original_max_position_embeddings"] == 8192
        assert d["architectures"] == ["LlamaForCausalLMEagle3"] and d["num_hidden_layers"] == 1
        assert d["draft_vocab_size"] == 32000 < d["vocab_size"] == t["vocab_size"] == 128256
        assert d["hidden_size"] == d["target_hidden_size"] == t["hidden_size"]
    t8 = models.target_config("8b")
    assert (t8["num_hidden_layers"], t8["hidden_size"], t8["num_key_value_heads"]) == (32, 4096, 8)
    with pytest.raises(ValueError, match="unknown draft"):
        models.draft_config("small", "medusa")


def test_hot_token_ids_are_valid_distinct_target_ids():
    hot = draft_checkpoint.hot_token_ids(128256, 32000)
    assert len(hot) == len(set(hot)) == 32000 and hot == sorted(hot) and 0 <= hot[0] and hot[-1] < 128256
    assert hot == draft_checkpoint.hot_token_ids(128256, 32000)  # seeded
    d2t = draft_checkpoint.d2t_of(hot)
    assert [d + i for i, d in enumerate(d2t)] == hot  # what sglang derives: d2t + arange
    assert draft_checkpoint.hot_token_ids(8, 8) == list(range(8))
    with pytest.raises(ValueError, match="exceeds"):
        draft_checkpoint.hot_token_ids(8, 9)


TINY = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=512,
    draft_vocab_size=128,
    target_hidden_size=64,
    architectures=["LlamaForCausalLMEagle3"],
)


def test_draft_checkpoint_loads_as_safetensors_with_a_valid_d2t(tmp_path):
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    stamp = draft_checkpoint.ensure(tmp_path)
    weights = st.load_file(str(tmp_path / draft_checkpoint.WEIGHTS))
    specs = draft_checkpoint.tensor_specs(TINY)
    assert sorted(weights) == sorted(name for name, _, _ in specs)
    for name, _, shape in specs:
        assert tuple(weights[name].shape) == shape, name
    assert weights["midlayer.self_attn.q_proj.weight"].shape == (64, 128)  # embeds + hidden: 2 x hidden
    assert weights["fc.weight"].shape == (64, 192) and weights["lm_head.weight"].dtype == torch.bfloat16
    hot = weights["d2t"] + torch.arange(128)  # LlamaForCausalLMEagle3.load_weights
    assert hot.tolist() == draft_checkpoint.hot_token_ids(512, 128)
    assert weights["t2d"].nonzero().flatten().tolist() == hot.tolist()
    # every variant loads the same bytes; a second ensure keeps the file
    mtime = (tmp_path / draft_checkpoint.WEIGHTS).stat().st_mtime_ns
    assert draft_checkpoint.ensure(tmp_path) == stamp
    assert (tmp_path / draft_checkpoint.WEIGHTS).stat().st_mtime_ns == mtime
    other = tmp_path / "again"
    other.mkdir()
    (other / "config.json").write_text(json.dumps(TINY))
    assert draft_checkpoint.write(other)["sha256"] == stamp["sha256"]


def _load_weights_of(release: str):
    """``LlamaForCausalLMEagle3.load_weights`` of a release, compiled on its own (the
    module's imports need a GPU build); it uses only torch and default_weight_loader."""
    import ast

    from patchkit.fetch import fetch_tree

    source = (fetch_tree(release) / "srt" / "models" / "llama_eagle3.py").read_text()
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "LlamaForCausalLMEagle3")
    func = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "load_weights")
    import textwrap
    from collections.abc import Iterable

    namespace: dict = {
        "torch": __import__("torch"),
        "default_weight_loader": None,
        "Iterable": Iterable,
        "Tuple": tuple,
    }
    exec(textwrap.dedent(ast.get_source_segment(source, func)), namespace)
    return namespace["load_weights"]


#: Where each release keeps the draft's one decoder layer.
DRAFT_LAYER = {"0.5.10": "model.midlayer.", "0.5.12.post1": "model.layers.0."}


@pytest.mark.trees
@pytest.mark.parametrize("release", sorted(DRAFT_LAYER))
def test_every_draft_parameter_is_loaded_from_the_checkpoint(release, tmp_path):
    """The release's own ``load_weights`` over the checkpoint's tensors: every parameter
    of the draft (its one layer, fc, norm, lm_head) gets each of its shards, and
    ``hot_token_id`` is the sampled target ids."""
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    draft_checkpoint.write(tmp_path)
    weights = st.load_file(str(tmp_path / draft_checkpoint.WEIGHTS))
    layer = DRAFT_LAYER[release]
    shards = {layer + "self_attn.qkv_proj.weight": {"q", "k", "v"}, layer + "mlp.gate_up_proj.weight": {0, 1}}
    names = [
        layer + n
        for n in (
            "self_attn.o_proj.weight",
            "mlp.down_proj.weight",
            "input_layernorm.weight",
            "hidden_norm.weight",
            "post_attention_layernorm.weight",
        )
    ]
    names += ["model.fc.weight", "model.norm.weight", "lm_head.weight", "model.embed_tokens.weight", *shards]
    got: dict = {}

    def loader(name):
        return lambda param, w, shard=None: got.setdefault(name, set()).add(shard)

    params = {n: types.SimpleNamespace(weight_loader=loader(n)) for n in names}
    model = types.SimpleNamespace(named_parameters=lambda: params.items(), hot_token_id=None)
    _load_weights_of(release)(model, weights.items())
    assert set(got) == set(names) - {"model.embed_tokens.weight"}
    for name, wanted in shards.items():
        assert got[name] == wanted, name
    assert model.hot_token_id.tolist() == draft_checkpoint.hot_token_ids(512, 128)
    assert torch.equal(model.hot_token_id, weights["d2t"] + torch.arange(128))


# ------------------------------------------------------------------ read back from the engine


def _scheduler(*, piecewise: bool, hot=True, v2=True):
    ns = types.SimpleNamespace
    runner_ = ns(
        piecewise_cuda_graph_runner=ns() if piecewise else None,
        graph_runner=ns(),
        attn_backend=ns(),
        model_config=ns(context_len=131072),
    )
    inner = ns(
        cuda_graph_runner_for_draft_extend=ns(),
        draft_extend_attn_backend=ns(),
        draft_runner=ns(piecewise_cuda_graph_runner=None),
        hot_token_id=ns(shape=(32000,)) if hot else None,
    )
    return ns(
        server_args=ns(
            disable_piecewise_cuda_graph=not piecewise,
            attention_backend="fa3",
            load_format="auto",
            speculative_algorithm="EAGLE3",
        ),
        tp_worker=ns(model_runner=runner_),
        draft_worker=ns(_draft_worker=inner) if v2 else inner,
    )


def test_facts_of_a_scheduler_and_what_was_in_force():
    facts = engine_facts.facts_of_scheduler(_scheduler(piecewise=True))
    assert facts["disable_piecewise_cuda_graph"] is False and facts["piecewise_runner"] == "SimpleNamespace"
    assert facts["attention_backend"] == "fa3" and facts["context_len"] == 131072
    assert facts["draft_extend_graph_runner"] == "SimpleNamespace" and facts["hot_token_id_shape"] == [32000]
    assert facts["draft_piecewise_runner"] is None
    v1 = engine_facts.facts_of_scheduler(_scheduler(piecewise=False, hot=False, v2=False))
    assert v1["piecewise_runner"] is None and v1["hot_token_id_shape"] is None
    log = engine_facts.log_facts(
        "x Capture piecewise CUDA graph begin. avail\n"
        "Capture draft extend cuda graph begin. This can\nCapture cuda graph bs [1, 2]\n"
    )
    assert log == {"piecewise_capture": 1, "draft_extend_capture": 1, "cuda_graph_capture": 1, "draft_load_format": 0}
    run = {"draft": "checkpoint", "engine_facts": [dict(facts, tp_rank=0), dict(facts, tp_rank=1)], "engine_log": log}
    f = engine_facts.in_force(run)
    assert (f["piecewise"], f["attention_backend"], f["processes"]) == ("on", "fa3", 2)
    assert engine_facts.backend_in_force(run, "default") == "fa3"
    assert engine_facts.problems("k", run) == []
    assert "| k | on | SimpleNamespace / None | fa3 |" in engine_facts.settings_markdown({"k": run})
    off = {"draft": "checkpoint", "engine_facts": [v1]}
    assert engine_facts.in_force(off)["piecewise"] == "off"
    assert engine_facts.problems("k", off) == ["k: the checkpoint draft has no hot_token_id (None)"]
    mixed = {"engine_facts": [dict(facts, tp_rank=0), dict(v1, tp_rank=1)]}
    assert engine_facts.in_force(mixed)["piecewise"] == "mixed"
    assert engine_facts.in_force({})["piecewise"] == "?" and engine_facts.backend_in_force({}, "triton") == "triton"


def test_piecewise_in_force_on_a_release_with_only_the_enable_switch():
    """0.5.4 … 0.5.9 have no disable_piecewise_cuda_graph: enable_… (off by default) is the switch."""
    old = dict(disable_piecewise_cuda_graph=None, enforce_piecewise_cuda_graph=None)
    default = dict(old, enable_piecewise_cuda_graph=False, piecewise_runner=None)
    assert engine_facts.in_force({"engine_facts": [default]})["piecewise"] == "off"
    on = dict(old, enable_piecewise_cuda_graph=True, piecewise_runner="PiecewiseCudaGraphRunner")
    assert engine_facts.in_force({"engine_facts": [on]})["piecewise"] == "on"


def test_facts_are_noted_after_the_scheduler_starts():
    from gpu_e2e import syncs

    module = types.ModuleType("fake_scheduler")

    class Scheduler:
        def __init__(self, make):
            self.__dict__.update(vars(make()))

    module.Scheduler = Scheduler
    engine_facts._hook_scheduler(module)
    engine_facts._hook_scheduler(module)  # once only
    module.Scheduler(lambda: _scheduler(piecewise=True))
    assert syncs.snapshot()["notes"]["engine"]["piecewise_runner"] == "SimpleNamespace"


# ------------------------------------------------------------------ the new-site rule


def _run(whole: dict, startup: dict | None, pfd: int) -> dict:
    batch = {
        "batch_size": 8,
        "syncs": {f"cpu|{PFD}:174": pfd} if pfd else {},
        "decode_steps": 100,
        "tok_per_s": 100.0,
        "ms_per_token": 10.0,
        "accept_length": 1.0,
        "deterministic": (True),
        "output_ids": [[1, 2]],
        "elapsed_s": [1.0],
    }
    run = {"size": "small", "batches": [batch], "syncs_whole_run": whole}
    if startup is not None:
        run["syncs_startup"] = startup
    return run


PRISTINE = _run({f"cpu|{PFD}:174": 300}, {}, 100)


def test_sites_seen_only_during_start_up_are_reported_not_failed():
    patched = _run({CAPTURE: 12}, {CAPTURE: 12}, 0)
    (row,) = report.compare("0.5.12.post1", PRISTINE, patched)
    assert row["new_sites_whole_run"] == [] and row["new_sites_startup"] == [
        "item sglang/srt/speculative/eagle_draft_extend_cuda_graph_runner.py:capture_one"
    ]
    assert report.verdict([row]) == []
    assert "start-up only" in orchestrate._startup_notes([row])[0]


def test_a_new_site_that_syncs_after_start_up_fails():
    patched = _run({CAPTURE: 13}, {CAPTURE: 12}, 0)  # once more while serving
    (row,) = report.compare("0.5.12.post1", PRISTINE, patched)
    assert row["new_sites_startup"] == []
    assert any("whole run (after start-up)" in p and "capture_one" in p for p in report.verdict([row]))
    # recorded before the rule: no start-up table, every new site counts
    assert sites.new_sites({}, {CAPTURE: 1}, None) == (
        ["item sglang/srt/speculative/eagle_draft_extend_cuda_graph_runner.py:capture_one"],
        [],
    )


def test_per_rank_rule_reads_each_ranks_start_up():
    def tp(whole_per_rank: dict, startup_per_rank: dict | None, pfd: int, decision=None) -> dict:
        run = {
            "size": "small",
            "tp_size": 2,
            "batches": [
                {
                    "batch_size": 8,
                    "tok_per_s": 1.0,
                    "output_ids": [[1]],
                    "ranks": [
                        {"tp_rank": r, "decode_steps": 100, "syncs": {f"cpu|{PFD}:174": pfd} if pfd else {}}
                        for r in (0, 1)
                    ],
                }
            ],
            "ranks": [
                {"tp_rank": r, "needs_cpu_seq_lens": decision, "syncs_whole_run": whole_per_rank[r]} for r in (0, 1)
            ],
        }
        if startup_per_rank is not None:
            run["ranks_startup"] = [{"tp_rank": r, "syncs_whole_run": startup_per_rank[r]} for r in (0, 1)]
        return run

    pristine = tp({0: {}, 1: {}}, {0: {}, 1: {}}, 100)
    patched = tp({0: {CAPTURE: 4}, 1: {CAPTURE: 4}}, {0: {CAPTURE: 4}, 1: {CAPTURE: 4}}, 0, decision=False)
    rows = rank_report.compare("0.5.12.post1", pristine, patched)
    assert rank_report.verdict(rows, tp=2) == []
    assert "(start-up only)" in rank_report.markdown(rows)
    grown = tp({0: {CAPTURE: 4}, 1: {CAPTURE: 5}}, {0: {CAPTURE: 4}, 1: {CAPTURE: 4}}, 0, decision=False)
    problems = rank_report.verdict(rank_report.compare("0.5.12.post1", pristine, grown), tp=2)
    assert len(problems) == 1 and "rank 1: new sync sites" in problems[0]
