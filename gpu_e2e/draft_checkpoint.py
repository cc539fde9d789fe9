"""A checkpoint-shaped EAGLE3 draft, written as safetensors on the GPU machine.

Published EAGLE3 drafts of Llama-3 models (one decoder layer named ``midlayer``,
``fc`` over three aux hidden states, ``norm``, ``lm_head`` over a reduced vocab, and
the token maps ``d2t`` / ``t2d``) are loaded by ``LlamaForCausalLMEagle3.load_weights``,
which sets ``hot_token_id = d2t + arange(draft_vocab_size)``: the target id of each
draft id. A dummy load never runs ``load_weights``, so only a real file gives the
draft worker a ``hot_token_id``; this module writes one with the names and shapes of
a published checkpoint and seeded random values (no ``embed_tokens``: the draft
worker shares the target's, as with a published draft).

The hot tokens are a seeded sample of the target's ids, in ascending order (as a
frequency-ranked map written by id is), so every ``d2t[i] + i`` is a valid, distinct
target id; :func:`hot_token_ids` is what sglang derives from the file.

The safetensors format is written by hand (a little-endian u64 header length, a JSON
header, the raw tensors), so this needs torch only for the values.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import struct
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

WEIGHTS = "model.safetensors"
STAMP = "checkpoint.json"
SEED = 20261126
#: What the values are drawn from: weights N(0, 0.02), norms 1 (a fresh draft's init).
STD = 0.02


def tensor_specs(cfg: Mapping) -> list[tuple[str, str, tuple[int, ...]]]:
    """``(name, dtype, shape)`` of every tensor of a published-style EAGLE3 checkpoint
    for the draft ``cfg`` (its config.json), in file order."""
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    h_in = cfg.get("target_hidden_size") or h
    bf = "BF16"
    return [
        ("midlayer.input_layernorm.weight", bf, (h,)),
        ("midlayer.hidden_norm.weight", bf, (h,)),
        ("midlayer.post_attention_layernorm.weight", bf, (h,)),
        ("midlayer.self_attn.q_proj.weight", bf, (q, 2 * h)),
        ("midlayer.self_attn.k_proj.weight", bf, (kv, 2 * h)),
        ("midlayer.self_attn.v_proj.weight", bf, (kv, 2 * h)),
        ("midlayer.self_attn.o_proj.weight", bf, (h, q)),
        ("midlayer.mlp.gate_proj.weight", bf, (i, h)),
        ("midlayer.mlp.up_proj.weight", bf, (i, h)),
        ("midlayer.mlp.down_proj.weight", bf, (h, i)),
        ("fc.weight", bf, (h, 3 * h_in)),
        ("norm.weight", bf, (h,)),
        ("lm_head.weight", bf, (cfg["draft_vocab_size"], h)),
        ("d2t", "I64", (cfg["draft_vocab_size"],)),
        ("t2d", "BOOL", (cfg["vocab_size"],)),
    ]


def hot_token_ids(vocab: int, draft_vocab: int, seed: int = SEED) -> list[int]:
    """The target id of each draft id: a seeded sample, ascending (all ids when equal)."""
    if draft_vocab > vocab:
        raise ValueError(f"draft vocab {draft_vocab} exceeds the target's {vocab}")
    if draft_vocab == vocab:
        return list(range(vocab))
    return sorted(random.Random(seed).sample(range(vocab), draft_vocab))


def d2t_of(hot: list[int]) -> list[int]:
    """sglang's ``d2t``: the offset from each draft id to its target id."""
    return [t - d for d, t in enumerate(hot)]


_SIZES = {"BF16": 2, "I64": 8, "BOOL": 1}


def header(specs: list[tuple[str, str, tuple[int, ...]]]) -> bytes:
    """The safetensors header (length prefix included), padded to 8 bytes."""
    meta: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape in specs:
        n = _SIZES[dtype]
        for d in shape:
            n *= d
        meta[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(meta, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def _values(cfg: Mapping, specs, seed: int) -> Iterator[bytes]:
    import torch

    hot = hot_token_ids(cfg["vocab_size"], cfg["draft_vocab_size"], seed) if "draft_vocab_size" in cfg else []
    gen = torch.Generator().manual_seed(seed)
    for name, dtype, shape in specs:
        if name == "d2t":
            t = torch.tensor(d2t_of(hot), dtype=torch.int64)
        elif name == "t2d":
            t = torch.zeros(shape, dtype=torch.bool)
            t[torch.tensor(hot)] = True
        elif len(shape) == 1:
            t = torch.ones(shape, dtype=torch.bfloat16)
        else:
            t = (torch.randn(shape, generator=gen) * STD).to(torch.bfloat16)
        raw = t.view(torch.int16) if dtype == "BF16" else (t.to(torch.uint8) if dtype == "BOOL" else t)
        yield raw.contiguous().numpy().tobytes()


def write(folder: Path, seed: int = SEED, specs_of: Callable[[Mapping], list] = tensor_specs) -> dict:
    """Write ``folder/model.safetensors`` for the model whose config.json is in ``folder``
    (the draft's tensors, or ``specs_of``'s: :mod:`.target_weights`); returns (and stamps
    in ``checkpoint.json``) its seed, size and sha256."""
    folder = Path(folder)
    cfg = json.loads((folder / "config.json").read_text())
    specs = specs_of(cfg)
    digest = hashlib.sha256()
    part = folder / (WEIGHTS + ".part")
    size = 0
    with open(part, "wb") as fh:
        for chunk in (header(specs), *_values(cfg, specs, seed)):
            fh.write(chunk)
            digest.update(chunk)
            size += len(chunk)
    os.replace(part, folder / WEIGHTS)
    stamp = {
        "seed": seed,
        "bytes": size,
        "sha256": digest.hexdigest(),
        "draft_vocab_size": cfg.get("draft_vocab_size"),
        "vocab_size": cfg["vocab_size"],
        "config_sha256": hashlib.sha256((folder / "config.json").read_bytes()).hexdigest(),
    }
    (folder / STAMP).write_text(json.dumps(stamp, indent=1, sort_keys=True) + "\n")
    return stamp


def ensure(folder: Path, seed: int = SEED, specs_of: Callable[[Mapping], list] = tensor_specs) -> dict:
    """:func:`write` unless the folder already holds the checkpoint of this config and seed
    (the runs of one orchestrator share the models folder)."""
    folder = Path(folder)
    stamp_path = folder / STAMP
    config_sha = hashlib.sha256((folder / "config.json").read_bytes()).hexdigest()
    if stamp_path.exists() and (folder / WEIGHTS).exists():
        stamp = json.loads(stamp_path.read_text())
        if (stamp.get("seed"), stamp.get("config_sha256")) == (seed, config_sha) and (
            folder / WEIGHTS
        ).stat().st_size == stamp.get("bytes"):
            return stamp
    return write(folder, seed, specs_of)
