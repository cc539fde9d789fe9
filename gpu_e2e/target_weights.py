"""Random target weights for a Llama shape, written as safetensors on the GPU machine.

The harness serves its targets with ``load_format="dummy"``. sglang's
``initialize_dummy_weights`` fills every parameter, the norms' too, uniformly in
±1e-3, so each layer's attention and MLP add far less than the token's own
embedding to the residual stream: the next token is, to that precision, a function
of the current one. Speed does not care. A draft-side fix does: with the draft a copy of the
target (STANDALONE) every engine then accepts near the ceiling whatever its draft's
attention reads, which is how the fourteenth run (docs/gpu.md, 2026-11-29e) could
not show ``triton-draft-extend-prefix``'s double count.

Where ``PK_E2E_TARGET_WEIGHTS=random`` is set in the runner's environment, the
target folder gets a checkpoint with Llama's tensor names, weights drawn from
N(0, 0.02) and norms of 1 (a fresh model's init), written by the draft's own writer
(:func:`.draft_checkpoint.ensure`, seeded: every engine loads the same bytes), and
the engine loads it (``load_format="auto"``; a STANDALONE draft reads the same
folder). With norms of 1 each layer's output is as large as its input, so what the
attention reads changes the next token. Meant for the small shape (0.7 GB a file; 8B's
would be 16 GB, written by every engine of a duel).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from . import draft_checkpoint

#: "random": the target loads the checkpoint this module writes; anything else: dummy weights.
ENV = "PK_E2E_TARGET_WEIGHTS"


def wanted() -> bool:
    return os.environ.get(ENV, "") == "random"


def load_format() -> str:
    """The target's ``load_format``: its checkpoint where one is wanted, sglang's dummy fill else."""
    return "auto" if wanted() else "dummy"


def tensor_specs(cfg: Mapping) -> list[tuple[str, str, tuple[int, ...]]]:
    """``(name, dtype, shape)`` of every tensor of a Llama checkpoint for ``cfg`` (its
    config.json: untied embeddings, no biases), in file order."""
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    bf = "BF16"
    specs: list[tuple[str, str, tuple[int, ...]]] = [("model.embed_tokens.weight", bf, (v, h))]
    for n in range(cfg["num_hidden_layers"]):
        layer = f"model.layers.{n}"
        specs += [
            (f"{layer}.input_layernorm.weight", bf, (h,)),
            (f"{layer}.self_attn.q_proj.weight", bf, (q, h)),
            (f"{layer}.self_attn.k_proj.weight", bf, (kv, h)),
            (f"{layer}.self_attn.v_proj.weight", bf, (kv, h)),
            (f"{layer}.self_attn.o_proj.weight", bf, (h, q)),
            (f"{layer}.post_attention_layernorm.weight", bf, (h,)),
            (f"{layer}.mlp.gate_proj.weight", bf, (i, h)),
            (f"{layer}.mlp.up_proj.weight", bf, (i, h)),
            (f"{layer}.mlp.down_proj.weight", bf, (h, i)),
        ]
    return specs + [("model.norm.weight", bf, (h,)), ("lm_head.weight", bf, (v, h))]


def ensure(folder: Path) -> dict:
    """The target's checkpoint in ``folder`` (beside its config.json), written once per config."""
    return draft_checkpoint.ensure(folder, specs_of=tensor_specs)
