"""The settings DeepSeek is served with at scale (issue 58), as a user passes
them, and which way the needs-cpu-seq-lens decision must go under each when
every spec-v2 attention backend opts out of the CPU mirror
(docs/research/dp-attention.md, "Per setting").

Imported by tests/trees/test_dp_attention_decision.py (every release's decision) and
tests/behaviour/test_dp_attention_behaviour.py (0.5.12.post1's own parsing and
backend classes, imported)."""

from __future__ import annotations

from types import SimpleNamespace

TP4 = {"tp_size": 4, "speculative_algorithm": "EAGLE"}
DP4 = {**TP4, "dp_size": 4, "enable_dp_attention": True}

#: name -> (server-args fields a user sets, does the mirror stay with opted-out backends?)
#: Only two-batch overlap keeps it: its split of a verify batch
#: (two_batch_overlap.py: split_spec_info) and TboAttnBackend's replay read
#: ``seq_lens_cpu`` unguarded, in every release up to 0.5.23.
SETTINGS = {
    "tp4": (TP4, False),
    "dp-attention": (DP4, False),
    "dp-attention+dp-lm-head": ({**DP4, "enable_dp_lm_head": True}, False),
    "dp-attention+deepep": ({**DP4, "moe_a2a_backend": "deepep"}, False),
    "dp-attention+deepep-normal": ({**DP4, "moe_a2a_backend": "deepep", "deepep_mode": "normal"}, False),
    "dp-attention+deepep+tbo": ({**DP4, "moe_a2a_backend": "deepep", "enable_two_batch_overlap": True}, True),
    "deepep+tbo": ({**TP4, "moe_a2a_backend": "deepep", "enable_two_batch_overlap": True}, True),
}

#: What differs between the ranks of one run (each rank's scheduler holds its own).
RANK_FIELDS = ("tp_rank", "dp_rank", "attn_tp_rank", "moe_ep_rank", "gpu_id", "nccl_port")


def rank_view(server_args: SimpleNamespace, backends, rank: int) -> SimpleNamespace:
    """A stand-in scheduler of DP rank ``rank``: what ``init_overlap`` hands
    to the decision (``self.server_args``, ``self.draft_worker``,
    ``self.tp_worker``), with its rank-specific fields filled in."""
    args = SimpleNamespace(**{**vars(server_args), **{f: rank for f in RANK_FIELDS}})
    return SimpleNamespace(
        server_args=args,
        draft_worker=SimpleNamespace(spec_v2_attn_backends=tuple(backends), dp_rank=rank),
        tp_worker=SimpleNamespace(model_runner=SimpleNamespace(model_is_mrope=False, gpu_id=rank), dp_rank=rank),
        dp_rank=rank,
    )
