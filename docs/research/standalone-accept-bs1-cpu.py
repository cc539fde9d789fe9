"""CPU check for docs/research/standalone-accept-bs1.md (torch + transformers, no sglang).

Builds the "small" Llama of gpu_e2e/models.py in bf16 and fills every floating tensor the
way sglang's initialize_dummy_weights does (a fresh generator seeded 1234 per tensor,
U(-1e-3, 1e-3)); the CPU generator draws other numbers than CUDA's, so token ids differ
from the H200 runs, the structure does not. Prints:
  1. embed == lm_head (same shape, same seed -> same values);
  2. greedy outputs: period-2 cycles after a short transient;
  3. next token from the last token alone / full context / context minus its first token
     (the EAGLE-style shifted draft context) -> all agree: the model is a bigram map;
  4. how often the bf16 top-2 logits tie exactly and how far context moves the logits.
Run: .venv/bin/python docs/research/standalone-accept-bs1-cpu.py  (about 1 minute)
"""

import random

import torch
from transformers import LlamaConfig, LlamaForCausalLM

cfg = LlamaConfig(
    hidden_size=1024,
    intermediate_size=2816,
    num_hidden_layers=8,
    num_attention_heads=16,
    num_key_value_heads=4,
    head_dim=64,
    vocab_size=32000,
    max_position_embeddings=4096,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    tie_word_embeddings=False,
)
m = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
for p in m.state_dict().values():
    if torch.is_floating_point(p):
        p.uniform_(-1e-3, 1e-3, generator=torch.Generator().manual_seed(1234))
print("1. embed == lm_head:", torch.equal(m.model.embed_tokens.weight, m.lm_head.weight))


def logits(ctx):
    with torch.no_grad():
        return m(torch.tensor([ctx])).logits[0, -1].float()  # bf16 GEMM, then float (as sglang)


def nxt(ctx):
    return int(logits(ctx).argmax())


for seed in (1, 2, 8):
    rng = random.Random(seed)
    out = [rng.randrange(32000) for _ in range(32)]
    for _ in range(24):
        out.append(nxt(out))
    gen = out[32:]
    alone = sum(nxt([gen[i]]) == gen[i + 1] for i in range(len(gen) - 1))
    shifted = sum(nxt(out[1 : 33 + i]) == gen[i + 1] for i in range(len(gen) - 1))
    print(
        f"2./3. seed {seed}: {gen[:8]} ... last-token-only agrees {alone}/{len(gen) - 1}, "
        f"context-minus-first agrees {shifted}/{len(gen) - 1}"
    )

rng = random.Random(0)
ties, same, rows, rel = 0, 0, 60, []
for _ in range(rows):
    ctx = [rng.randrange(32000) for _ in range(65)]
    full, short = logits(ctx), logits(ctx[1:])
    top = torch.topk(full, 2).values
    gap = float(top[0] - top[1])
    ties += gap == 0.0
    same += int(torch.equal(full, short))
    if gap:
        rel.append(float((full - short).abs().max()) / gap)
rel.sort()
print(
    f"4. {rows} rows: exact bf16 top-2 ties {ties}; logits bitwise equal with/without the first "
    f"context token in {same}; max|dlogit|/gap median {rel[len(rel) // 2]:.3f} max {rel[-1]:.3f}"
)
