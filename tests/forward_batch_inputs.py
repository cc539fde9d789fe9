"""What ``ForwardBatch.init_new`` takes, for behaviour tests that run it on CPU
(tests/behaviour/test_spec_v2_decode_copies_behaviour.py, test_forks_vi_behaviour.py):
a ModelWorkerBatch of a spec-v2 draft extend and a model runner, each with the
fields init_new reads."""

from __future__ import annotations

from types import SimpleNamespace


class WorkerBatch(SimpleNamespace):
    """The fields init_new reads of a ModelWorkerBatch: those set here, None for the rest."""

    def __getattr__(self, name):
        return None


def draft_extend(module, seq_lens=None, prefix_lens=None) -> WorkerBatch:
    """DRAFT_EXTEND_V2 of three requests (``module``: forward_batch_info): the lists spec v2
    hands init_new every decode step, or (the GPU-only draft extend) tensors given instead."""
    import torch

    return WorkerBatch(
        forward_mode=module.ForwardMode.DRAFT_EXTEND_V2,
        seq_lens=torch.tensor([7, 12, 4]),
        input_ids=torch.arange(12),
        extend_seq_lens=[4, 4, 4] if seq_lens is None else seq_lens,  # num_draft_tokens a request
        extend_prefix_lens=[7, 12, 4] if prefix_lens is None else prefix_lens,
        extend_num_tokens=12,
        reqs=[],
    )


def runner() -> SimpleNamespace:
    """A model runner on the CPU, with what init_new reads of it."""
    return SimpleNamespace(
        device="cpu",
        req_to_token_pool=None,
        token_to_kv_pool=None,
        attn_backend=None,
        server_args=SimpleNamespace(attention_backend="torch_native", enable_lora=False),
        use_ngram_embedding=False,
        model_is_mrope=False,
        is_hybrid_swa=False,
    )
