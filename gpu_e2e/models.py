"""Llama-3-shaped model folders for dummy-weight runs, and the EAGLE3 draft beside them.

sglang with ``load_format="dummy"`` builds the target from ``config.json`` and fills
every weight from a seeded uniform generator, so two trees that compute the same
thing produce the same token ids.

Both sizes have the Llama-3 vocabulary (128256) and Llama-3.1's context: 131072
positions with ``rope_scaling`` of type ``llama3`` (factor 8 over 8192), as
Llama-3.1-8B's own config.json has it, so buffers sized by the context length (the
request-to-token table, static page-table bounds) have their real size.

The draft (``--draft``):

* ``checkpoint`` (the default): shaped like a published EAGLE3 checkpoint of a
  Llama-3 model: one layer, the target's hidden size, ``draft_vocab_size`` 32000 and
  a ``d2t`` map. A dummy load never calls ``load_weights``, so it would leave
  ``hot_token_id`` None; the draft is therefore a real safetensors checkpoint that
  :mod:`.draft_checkpoint` writes on the GPU machine (seeded, so every variant loads
  the same bytes) and the engine loads with ``speculative_draft_load_format="auto"``.
* ``dummy``: the earlier proofs' draft: dummy weights, ``draft_vocab_size`` = vocab,
  so ``hot_token_id`` stays None.

The draft reads the target's default aux layers ``[2, L // 2, L - 3]``.
"""

from __future__ import annotations

import json
from pathlib import Path

#: Llama-3.1-8B's config.json: context and RoPE scaling.
CONTEXT = 131072
ROPE_SCALING = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
}
#: The reduced vocabulary of published Llama-3 EAGLE3 drafts.
DRAFT_VOCAB = 32000
DRAFTS = ("checkpoint", "dummy")

SIZES = {
    # Small: GPU time per step is tiny, so host-side scheduling overhead shows.
    "small": dict(
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=8,
        num_attention_heads=16,
        num_key_value_heads=4,
        vocab_size=128256,
    ),
    # Llama-3.1-8B shapes.
    "8b": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
    ),
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
        "max_position_embeddings": CONTEXT,
        "rope_scaling": dict(ROPE_SCALING),
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 128000,
        "eos_token_id": 128001,
    }


def target_config(size: str) -> dict:
    shape = SIZES[size]
    return _llama(shape, architectures=["LlamaForCausalLM"], layers=shape["num_hidden_layers"])


def draft_config(size: str, draft: str = "checkpoint") -> dict:
    if draft not in DRAFTS:
        raise ValueError(f"unknown draft {draft!r} (known: {', '.join(DRAFTS)})")
    shape = SIZES[size]
    cfg = _llama(shape, architectures=["LlamaForCausalLMEagle3"], layers=1)
    cfg["draft_vocab_size"] = min(DRAFT_VOCAB, shape["vocab_size"]) if draft == "checkpoint" else shape["vocab_size"]
    cfg["target_hidden_size"] = shape["hidden_size"]
    return cfg


def draft_folder_name(size: str, draft: str = "checkpoint") -> str:
    return f"{size}-draft" if draft == "dummy" else f"{size}-draft-{draft}"


def write_models(root: Path, size: str, draft: str = "checkpoint") -> tuple[Path, Path]:
    """Write ``root/<size>-target/config.json`` and the draft's folder's config.json
    (a ``checkpoint`` draft's weights: :func:`.draft_checkpoint.ensure`)."""
    target = Path(root) / f"{size}-target"
    folder = Path(root) / draft_folder_name(size, draft)
    for where, cfg in ((target, target_config(size)), (folder, draft_config(size, draft))):
        where.mkdir(parents=True, exist_ok=True)
        (where / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return target, folder
