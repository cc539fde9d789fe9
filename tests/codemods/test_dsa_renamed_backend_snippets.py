"""Snippet tests of patch dsa-no-mirror on the renamed backend before upstream's opt-out
(0.5.13 / 0.5.14's ``DeepseekSparseAttnBackend`` in ``dsa_backend.py``; the releases are
in tests/trees/test_dsa_no_mirror.py, 0.5.14's own backend run on CPU in
tests/behaviour/test_dsa_renamed_backend_behaviour.py).

What is new there: the release gate lets those releases through (their GPU-only draft
extend hands over ``extend_seq_lens_cpu = [D] * bs``; what it leaves unset, the
mirror and the prefix list, the patch does without), and the draft extend's assert of
``extend_prefix_lens_cpu`` goes from 0.5.14's own ``DRAFT_EXTEND_V2`` branch as from
0.5.13's shared one, in the shapes forks use: values through locals, the other class
name, a branch that already does it (0.5.15's refill left as upstream wrote it), early
returns. The rest of the patch meets the shapes it already carries (the eager width
behind its assert, the replay in ``_apply_cuda_graph_metadata``)."""

from __future__ import annotations

from dsa_shapes import MAX_CONTEXT_LEN, eager_width

from patchkit.codemods import dsa_no_mirror as d
from patchkit.codemods.common.base import State
from patchkit.runtime.host_bound import SeqLensBound
from patchkit.testing import assert_state, code, detect, run, run_all

#: 0.5.14's backend, the lines that matter (0.5.13: the draft extend shares one branch with v1).
DSA_0_5_14 = code("""
    import torch


    class DeepseekSparseAttnBackend(DeepseekSparseAttnBackendMTPPrecomputeMixin, AttentionBackend):
        def __init__(self, model_runner):
            self.max_context_len = model_runner.model_config.context_len

        def init_forward_metadata(self, forward_batch: ForwardBatch):
            batch_size = forward_batch.batch_size
            if forward_batch.forward_mode.is_target_verify():
                draft_token_num = self.speculative_num_draft_tokens
            else:
                draft_token_num = 0
            cache_seqlens_int32 = (forward_batch.seq_lens + draft_token_num).to(torch.int32)
            assert forward_batch.seq_lens_cpu is not None
            max_seqlen_k = int(forward_batch.seq_lens_cpu.max().item() + draft_token_num)
            page_table = self.req_to_token_pool.req_to_token[forward_batch.req_pool_indices, :max_seqlen_k]
            indexer_seq_lens_cpu = forward_batch.seq_lens_cpu
            if forward_batch.forward_mode.is_decode_or_idle():
                extend_seq_lens_cpu = [1] * batch_size
            elif forward_batch.forward_mode.is_target_verify():
                extend_seq_lens_cpu = [self.speculative_num_draft_tokens] * batch_size
            elif forward_batch.forward_mode.is_draft_extend_v2():
                assert (
                    forward_batch.extend_seq_lens_cpu is not None
                    and forward_batch.extend_seq_lens is not None
                    and forward_batch.extend_prefix_lens_cpu is not None
                ), "All of them must not be None"
                extend_seq_lens_cpu = forward_batch.extend_seq_lens_cpu
                seqlens_expanded = seqlens_expand_triton(
                    forward_batch.extend_seq_lens,
                    cache_seqlens_int32,
                    sum(extend_seq_lens_cpu),
                    self.speculative_num_draft_tokens,
                )
                if forward_batch.forward_mode.is_draft_extend_v2():
                    page_table = torch.repeat_interleave(page_table, repeats=self.speculative_num_draft_tokens, dim=0)
            elif forward_batch.forward_mode.is_extend():
                assert (
                    forward_batch.extend_seq_lens_cpu is not None
                    and forward_batch.extend_seq_lens is not None
                    and forward_batch.extend_prefix_lens_cpu is not None
                ), "All of them must not be None"
                extend_seq_lens_cpu = forward_batch.extend_seq_lens_cpu

        def _apply_cuda_graph_metadata(self, bs, req_pool_indices, seq_lens, seq_lens_cpu, forward_mode, spec_info):
            assert seq_lens_cpu is not None
            seq_lens = seq_lens[:bs]
            seq_lens_cpu = seq_lens_cpu[:bs]
            metadata: DSAMetadata = self.decode_cuda_graph_metadata[bs]
            if forward_mode.is_decode_or_idle():
                max_len = int(seq_lens_cpu.max().item())
            elif forward_mode.is_target_verify():
                max_seqlen_k = int(
                    seq_lens_cpu.max().item() + self.speculative_num_draft_tokens
                )
            elif forward_mode.is_draft_extend_v2():
                max_seqlen_k = int(seq_lens_cpu.max().item())


    class DeepseekSparseAttnMultiStepBackend:

        def __init__(self, model_runner, topk, speculative_num_steps):
            self.topk = topk
""")

DSA_CODEMODS = [
    d.DsaHasSpecV2Path,
    d.DsaOptsOut,
    d.DsaMultiStepOptsOut,
    d.DsaEagerMaxFromHostBound,
    d.DsaDraftExtendNeedsNoPrefixList,
    d.DsaReplayWithoutMirror,
]

V2 = "elif forward_batch.forward_mode.is_draft_extend_v2():"
PREFILL = "elif forward_batch.forward_mode.is_extend():"


def draft_branch(out: str, opens: str = V2) -> str:
    return out.split(opens, 1)[1].split(PREFILL, 1)[0]


def test_0_5_14_is_carried_then_idempotent():
    finding = detect(d.DsaHasSpecV2Path, DSA_0_5_14)  # the release gate: no longer moot
    assert finding.state is State.SUPERSEDED and not finding.moots_patch
    out, states = run_all(DSA_CODEMODS, DSA_0_5_14)
    assert states == [State.SUPERSEDED] + [State.DONE] * 5
    assert out.count("needs_cpu_seq_lens: bool = False") == 2
    draft = draft_branch(out)
    assert "extend_prefix_lens_cpu" not in draft
    assert (
        "forward_batch.extend_seq_lens_cpu is not None\n                and forward_batch.extend_seq_lens is not None\n"
        in draft
    )
    assert "sum(extend_seq_lens_cpu)" in draft  # the GPU-only draft extend hands this list over
    assert "extend_prefix_lens_cpu is not None" in out.split(PREFILL, 1)[1]  # prefill keeps its assert
    assert "assert forward_batch.seq_lens_cpu is not None" not in out
    assert "host_max_seq_len(forward_batch.seq_lens_cpu, self.max_context_len, forward_batch)" in out
    replay = out.split("def _apply_cuda_graph_metadata", 1)[1]
    assert "seq_lens_cpu.max().item()" not in replay and replay.count("graph_max_len(seq_lens_cpu, ") == 3
    # the eager width run without the mirror: no device read, the static bound (no host bound on 0.5.13+)
    assert eager_width(out, "DeepseekSparseAttnBackend", None) == (MAX_CONTEXT_LEN, 0)
    assert eager_width(out, "DeepseekSparseAttnBackend", SeqLensBound(300, 2000)) == (300, 0)
    again, states = run_all(DSA_CODEMODS, out)
    assert again == out and states == [State.SUPERSEDED] + [State.DONE] * 5


def test_0_5_13s_shared_draft_extend_branch():
    shared = DSA_0_5_14.replace(V2, "elif forward_batch.forward_mode.is_draft_extend(include_v2=True):")
    state, out, after = run(d.DsaDraftExtendNeedsNoPrefixList, shared)
    assert (state, after) == (State.TODO, State.DONE)
    assert "extend_prefix_lens_cpu" not in draft_branch(out, "is_draft_extend(include_v2=True):")


def test_values_through_locals():
    """A fork that names the mode and the prefix list in locals, and asserts the list alone."""
    fork = (
        DSA_0_5_14.replace(
            "        indexer_seq_lens_cpu = forward_batch.seq_lens_cpu\n",
            "        indexer_seq_lens_cpu = forward_batch.seq_lens_cpu\n"
            "        mode = forward_batch.forward_mode\n"
            "        prefix_lens = forward_batch.extend_prefix_lens_cpu\n",
        )
        .replace(V2, "elif mode.is_draft_extend_v2():")
        .replace(
            "                and forward_batch.extend_seq_lens is not None\n"
            "                and forward_batch.extend_prefix_lens_cpu is not None\n"
            '            ), "All of them must not be None"\n'
            "            extend_seq_lens_cpu = forward_batch.extend_seq_lens_cpu\n"
            "            seqlens_expanded",
            "                and prefix_lens is not None\n"
            "                and forward_batch.extend_seq_lens is not None\n"
            '            ), "All of them must not be None"\n'
            "            assert prefix_lens is not None\n"
            "            extend_seq_lens_cpu = forward_batch.extend_seq_lens_cpu\n"
            "            seqlens_expanded",
            1,
        )
    )
    assert fork.count("prefix_lens is not None") == 2
    state, out, after = run(d.DsaDraftExtendNeedsNoPrefixList, fork)
    assert (state, after) == (State.TODO, State.DONE)
    draft = draft_branch(out, "elif mode.is_draft_extend_v2():")
    assert "prefix_lens" not in draft and "assert (\n" in draft
    assert (
        "forward_batch.extend_seq_lens_cpu is not None\n                and forward_batch.extend_seq_lens is not None\n"
        in draft
    )
    assert "prefix_lens = forward_batch.extend_prefix_lens_cpu" in out  # the read stays: None is fine
    assert run(d.DsaDraftExtendNeedsNoPrefixList, out)[1] == out


def test_the_other_class_name():
    """A 0.5.12.post1 fork that took 0.5.14's DRAFT_EXTEND_V2 branch under its own names."""
    fork = DSA_0_5_14.replace("DeepseekSparseAttn", "NativeSparseAttn")
    state, out, after = run(d.NsaDraftExtendNeedsNoPrefixList, fork)
    assert (state, after) == (State.TODO, State.DONE) and "extend_prefix_lens_cpu" not in draft_branch(out)
    assert detect(d.DsaDraftExtendNeedsNoPrefixList, fork).state is State.MISSING  # never a silent pass


def test_a_branch_already_doing_it_and_upstreams_refill():
    done = DSA_0_5_14.replace(
        "                and forward_batch.extend_seq_lens is not None\n"
        "                and forward_batch.extend_prefix_lens_cpu is not None\n"
        '            ), "All of them must not be None"\n'
        "            extend_seq_lens_cpu = forward_batch.extend_seq_lens_cpu\n"
        "            seqlens_expanded",
        "                and forward_batch.extend_seq_lens is not None\n"
        '            ), "All of them must not be None"\n'
        "            extend_seq_lens_cpu = forward_batch.extend_seq_lens_cpu\n"
        "            seqlens_expanded",
    )
    assert done != DSA_0_5_14
    assert_state(d.DsaDraftExtendNeedsNoPrefixList, done, State.DONE)
    # 0.5.15+: the branch fills the list first (a device read of upstream's own): left as it is
    refill = DSA_0_5_14.replace(
        f"        {V2}\n",
        f"        {V2}\n"
        "            if forward_batch.extend_prefix_lens_cpu is None:\n"
        "                forward_batch.extend_prefix_lens_cpu = forward_batch.extend_prefix_lens.cpu().tolist()\n",
    )
    state, out, _ = run(d.DsaDraftExtendNeedsNoPrefixList, refill)
    assert state is State.SUPERSEDED and out == refill


def test_early_returns():
    early = DSA_0_5_14.replace(
        "        batch_size = forward_batch.batch_size\n",
        "        if forward_batch.forward_mode.is_idle():\n            return None\n"
        "        batch_size = forward_batch.batch_size\n",
    ).replace(
        "            extend_seq_lens_cpu = forward_batch.extend_seq_lens_cpu\n            seqlens_expanded",
        "            extend_seq_lens_cpu = forward_batch.extend_seq_lens_cpu\n"
        "            if batch_size == 0:\n                return None\n"
        "            seqlens_expanded",
    )
    out, states = run_all(DSA_CODEMODS, early)
    assert states == [State.SUPERSEDED] + [State.DONE] * 5
    assert "extend_prefix_lens_cpu" not in draft_branch(out) and out.count("return None") == 2
    assert "extend_prefix_lens_cpu is not None" in out.split(PREFILL, 1)[1]
