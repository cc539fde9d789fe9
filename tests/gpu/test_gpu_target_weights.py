"""gpu_e2e.target_weights: a seeded random Llama checkpoint for the target, so that what a
draft's attention reads changes its proposals (the fourteenth run's dummy weights could not).
Its tensors are checked against transformers' own Llama, which the harness did not write."""

from __future__ import annotations

import json

import pytest

from gpu_e2e import draft_checkpoint, models, runner, target_weights

TINY = dict(models.target_config("small"), hidden_size=64, intermediate_size=96, num_hidden_layers=2)
TINY.update(num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=512)


@pytest.mark.parametrize("size", ["small", "8b"])
def test_the_tensors_are_transformers_llamas(size):
    """Every name and shape transformers' LlamaForCausalLM has for the shape's config.json."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = models.target_config(size)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg))
    theirs = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    ours = {name: shape for name, _, shape in target_weights.tensor_specs(cfg)}
    assert ours == theirs


def test_the_checkpoint_is_seeded_n002_with_norms_of_one(tmp_path):
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    stamp = target_weights.ensure(tmp_path)
    weights = st.load_file(str(tmp_path / draft_checkpoint.WEIGHTS))
    assert sorted(weights) == sorted(name for name, _, _ in target_weights.tensor_specs(TINY))
    assert torch.equal(weights["model.norm.weight"], torch.ones(64, dtype=torch.bfloat16))
    embed = weights["model.embed_tokens.weight"].float()
    assert embed.shape == (512, 64) and abs(embed.std().item() - draft_checkpoint.STD) < 0.002
    assert stamp["draft_vocab_size"] is None and stamp["vocab_size"] == 512
    assert target_weights.ensure(tmp_path) == stamp  # kept: every run of one engine loads these bytes
    other = tmp_path / "again"
    other.mkdir()
    (other / "config.json").write_text(json.dumps(TINY))
    assert target_weights.ensure(other)["sha256"] == stamp["sha256"]  # every engine: the same bytes


def test_the_switch_picks_the_targets_load_format(monkeypatch, tmp_path):
    monkeypatch.delenv(target_weights.ENV, raising=False)
    assert target_weights.load_format() == "dummy" and not target_weights.wanted()
    monkeypatch.setenv(target_weights.ENV, "random")
    assert target_weights.load_format() == "auto"
    kwargs = dict(attention_backend="triton", cuda_graph_max_bs=32, mem_fraction_static=0.5, scenario="standalone")
    plain = runner.engine_kwargs(tmp_path / "t", tmp_path / "d", **kwargs)
    loaded = runner.engine_kwargs(tmp_path / "t", tmp_path / "d", target_load_format="auto", **kwargs)
    assert plain["load_format"] == "dummy" and loaded["load_format"] == "auto"
    # STANDALONE's draft is the target's folder, so it loads the same checkpoint
    assert (
        loaded["speculative_draft_model_path"] == str(tmp_path / "t") and "speculative_draft_load_format" not in loaded
    )
