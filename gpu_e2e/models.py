"""Tiny and Llama-3.1-8B-shaped model folders for dummy-weight runs (config.json only).

sglang with ``load_format="dummy"`` builds the model from ``config.json`` and fills
every weight from a seeded uniform generator, so two trees that compute the same
thing produce the same token ids. The draft is an EAGLE3 head
(``LlamaForCausalLMEagle3``, one layer, ``draft_vocab_size == vocab_size``, so no
hot-token map is needed); it reads the target's default aux layers
``[2, L // 2, L - 3]``.
"""

from __future__ import annotations

import json
from pathlib import Path

SIZES = {
    # Small: GPU time per step is tiny, so host-side scheduling overhead shows.
    "small": dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                  num_attention_heads=16, num_key_value_heads=4, vocab_size=32000),
    # Llama-3.1-8B shapes.
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=8, vocab_size=128256),
}


def _llama(shape: dict, *, architectures: list[str], layers: int) -> dict:
    return {
        "architectures": architectures,
        "model_type": "llama",
        "hidden_size": shape["hidden_size"],
        "intermediate_size": shape["intermediate_size"],
        "num_hidden_layers": layers,
        "num_attention_heads": shape["num_attention_heads"],
        "num_key_value_heads": shape["num_key_value_heads"],
        "head_dim": shape["hidden_size"] // shape["num_attention_heads"],
        "vocab_size": shape["vocab_size"],
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


def target_config(size: str) -> dict:
    shape = SIZES[size]
    return _llama(shape, architectures=["LlamaForCausalLM"], layers=shape["num_hidden_layers"])


def draft_config(size: str) -> dict:
    shape = SIZES[size]
    cfg = _llama(shape, architectures=["LlamaForCausalLMEagle3"], layers=1)
    cfg["draft_vocab_size"] = shape["vocab_size"]
    cfg["target_hidden_size"] = shape["hidden_size"]
    return cfg


def write_models(root: Path, size: str) -> tuple[Path, Path]:
    """Write ``root/<size>-target/config.json`` and ``root/<size>-draft/config.json``."""
    target = Path(root) / f"{size}-target"
    draft = Path(root) / f"{size}-draft"
    for folder, cfg in ((target, target_config(size)), (draft, draft_config(size))):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return target, draft
