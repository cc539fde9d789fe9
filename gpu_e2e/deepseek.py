"""DeepSeek-V3-shaped model folders for dummy-weight MTP runs (issue 44).

Shaped like the published DeepSeek-V3 / R1 checkpoints' ``config.json`` where it
matters to the code paths a spec-v2 MTP run takes, and cut down where it does not:

* ``DeepseekV3ForCausalLM``, ``model_type`` ``deepseek_v3``, MLA with the real head
  geometry (``kv_lora_rank`` 512, ``qk_rope_head_dim`` 64, ``qk_nope_head_dim`` 128,
  ``v_head_dim`` 128, ``q_lora_rank`` 1536), the real vocabulary (129280) and the
  real context (163840 positions: YaRN factor 40 over 4096);
* fewer layers, heads and experts: ``ds`` has 4 layers, the first dense and three
  MoE (64 routed experts in 8 groups, 8 per token, one shared expert, sigmoid
  scoring with the ``noaux_tc`` bias, as V3 routes); ``ds-dense`` has no MoE layer
  (``first_k_dense_replace`` = layers), for an image where the fused-MoE path fails;
* ``dsv32``: DeepSeek-V3.2 (issue 72): ``DeepseekV32ForCausalLM``, ``model_type``
  ``deepseek_v32``, with the published checkpoint's sparse-attention indexer
  (``index_n_heads`` 64, ``index_head_dim`` 128, ``index_topk`` 2048), which sends sglang
  down DeepSeek sparse attention (``is_deepseek_nsa``); the rest as ``ds``;
* ``num_nextn_predict_layers`` 1: the MTP draft. As users serve it, no draft path is
  named: sglang takes the target's folder and builds ``DeepseekV3ForCausalLMNextN``
  from the same config (its one decoder layer is MoE like V3's MTP layer).

Weights are dummy (seeded, ``load_format="dummy"``); sglang's dummy loader still
runs ``post_load_weights``, which builds MLA's absorbed ``w_kc`` / ``w_vc``.
"""

from __future__ import annotations

import json
from pathlib import Path

VOCAB = 129280
CONTEXT = 163840
ROPE_SCALING = {
    "beta_fast": 32,
    "beta_slow": 1,
    "factor": 40,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "original_max_position_embeddings": 4096,
    "type": "yarn",
}
#: MLA head geometry of DeepSeek-V3 (what the attention kernels see).
MLA = dict(kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128)

#: DeepSeek-V3.2's sparse-attention indexer, as its published config.json has it.
DSA_INDEXER = dict(index_n_heads=64, index_head_dim=128, index_topk=2048)

#: ``ds``: V3's geometry, cut down (the module doc).
_DS = dict(
    hidden_size=1024,
    intermediate_size=2816,
    moe_intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=16,
    first_k_dense_replace=1,
    n_routed_experts=64,
)
SIZES = {
    "ds": _DS,
    "dsv32": {**_DS, "sparse_attention": True},
    "ds-dense": {**_DS, "first_k_dense_replace": 4},
}


def is_deepseek(size: str) -> bool:
    return size in SIZES


def moe_layers(size: str) -> int:
    """How many of the target's layers are MoE (the MTP layer not counted)."""
    s = SIZES[size]
    return max(0, s["num_hidden_layers"] - s["first_k_dense_replace"])


def target_config(size: str) -> dict:
    if size not in SIZES:
        raise ValueError(f"unknown DeepSeek size {size!r} (known: {', '.join(SIZES)})")
    s = SIZES[size]
    sparse = s.get("sparse_attention", False)
    return {
        "architectures": ["DeepseekV32ForCausalLM" if sparse else "DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v32" if sparse else "deepseek_v3",
        **(DSA_INDEXER if sparse else {}),
        "hidden_size": s["hidden_size"],
        "intermediate_size": s["intermediate_size"],
        "moe_intermediate_size": s["moe_intermediate_size"],
        "num_hidden_layers": s["num_hidden_layers"],
        "num_attention_heads": s["num_attention_heads"],
        "num_key_value_heads": s["num_attention_heads"],
        **MLA,
        "n_routed_experts": s["n_routed_experts"],
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "n_group": 8,
        "topk_group": 4,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "first_k_dense_replace": s["first_k_dense_replace"],
        "moe_layer_freq": 1,
        "num_nextn_predict_layers": 1,
        "vocab_size": VOCAB,
        "max_position_embeddings": CONTEXT,
        "rope_scaling": dict(ROPE_SCALING),
        "rope_theta": 10000,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "aux_loss_alpha": 0.001,
        "seq_aux": True,
        "ep_size": 1,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 0,
        "eos_token_id": 1,
        "use_cache": True,
    }


def write_model(root: Path, size: str) -> Path:
    """``root/<size>-target/config.json``; the MTP draft is read from the same folder."""
    target = Path(root) / f"{size}-target"
    target.mkdir(parents=True, exist_ok=True)
    (target / "config.json").write_text(json.dumps(target_config(size), indent=2) + "\n")
    return target
