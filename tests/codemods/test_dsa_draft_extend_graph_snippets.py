"""Snippet tests of patch dsa-draft-extend-graph (sglang #29413 + #30378; the releases are
in tests/trees/test_dsa_draft_extend_graph.py, the replay run on CPU in
tests/behaviour/test_dsa_draft_extend_graph_behaviour.py): the fixed-width DRAFT_EXTEND_V2
replay branch and the worker's admission, on 0.5.12.post1's shape and the shapes forks
use (values through locals, renamed classes, a branch that already does it, early
returns), upstream's shapes left alone, refusals in one line."""

from __future__ import annotations

import sys
import types

import pytest

from patchkit.backends import dsa_graph
from patchkit.codemods import dsa_draft_extend_graph as g
from patchkit.codemods.common.base import State
from patchkit.testing import assert_codemod, assert_state, code, detect, run

# 0.5.12.post1's replay (after dsa-no-mirror), the branches that matter.
REPLAY = code("""
    class NativeSparseAttnBackend(AttentionBackend):
        def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens, seq_lens_sum,
                                                    encoder_lens, forward_mode, spec_info, seq_lens_cpu):
            seq_lens = seq_lens[:bs]
            metadata: NSAMetadata = self.decode_cuda_graph_metadata[bs]
            if forward_mode.is_decode_or_idle():
                metadata.cache_seqlens_int32.copy_(seq_lens.to(torch.int32))
            elif forward_mode.is_draft_extend(include_v2=True):
                max_seqlen_k = int(graph_max_len(seq_lens_cpu, 0, metadata.page_table_1, self.req_to_token))
                cache_seqlens = seq_lens.to(torch.int32)
                metadata.cache_seqlens_int32.copy_(cache_seqlens)
                extend_seq_lens = spec_info.num_accept_tokens[:bs]
                extend_seq_lens_cpu = extend_seq_lens.tolist()
                page_indices = self.req_to_token[req_pool_indices, :max_seqlen_k]
                page_indices = torch.repeat_interleave(page_indices, repeats=extend_seq_lens, dim=0)
                metadata.page_table_1[: page_indices.shape[0], :max_seqlen_k].copy_(page_indices)
                seqlens_expanded = seqlens_expand_triton(
                    extend_seq_lens, cache_seqlens, sum(extend_seq_lens_cpu), self.speculative_num_draft_tokens
                )
                metadata.nsa_seqlens_expanded[: seqlens_expanded.shape[0]].copy_(seqlens_expanded)
                nsa_cache_seqlens = compute_nsa_seqlens(seqlens_expanded, self.nsa_index_topk)
                metadata.nsa_cache_seqlens_int32[: seqlens_expanded.shape[0]].copy_(nsa_cache_seqlens)

            metadata.nsa_cu_seqlens_k[1:].copy_(torch.cumsum(nsa_cache_seqlens, dim=0))
""")

FIXED = """\
        elif forward_mode.is_draft_extend_v2():
            # patchkit dsa-draft-extend-graph (sglang #29413, #30378): spec v2's
            # draft extend runs every request at the fixed width of the draft tokens,
            # as target verify does, so the replay reads no accepted counts from the
            # device and writes the captured shapes. Padded rows carry the graph's fill
            # length (1), below that width: their expanded lengths are clamped at 0
            # instead of going negative.
            max_seqlen_k = int(
                graph_max_len(seq_lens_cpu, 0, metadata.page_table_1, self.req_to_token)
            )
            cache_seqlens = seq_lens.to(torch.int32)
            metadata.cache_seqlens_int32.copy_(cache_seqlens)
            metadata.cu_seqlens_k[1:].copy_(
                torch.cumsum(cache_seqlens, dim=0, dtype=torch.int32)
            )
            page_indices = self.req_to_token[req_pool_indices, :max_seqlen_k]
            page_indices = torch.repeat_interleave(
                page_indices, repeats=self.speculative_num_draft_tokens, dim=0
            )
            metadata.page_table_1[:, :max_seqlen_k].copy_(page_indices)
            extend_seq_lens = torch.full(
                (bs,),
                self.speculative_num_draft_tokens,
                dtype=torch.int32,
                device=self.device,
            )
            seqlens_expanded = seqlens_expand_triton(
                extend_seq_lens,
                cache_seqlens,
                bs * self.speculative_num_draft_tokens,
                self.speculative_num_draft_tokens,
            ).clamp_(min=0)
            metadata.nsa_seqlens_expanded.copy_(seqlens_expanded)
            nsa_cache_seqlens = compute_nsa_seqlens(seqlens_expanded, self.nsa_index_topk)
            metadata.nsa_cache_seqlens_int32.copy_(nsa_cache_seqlens)
"""
IMPORT = "from sglang.srt._patchkit.backends.dsa import graph_max_len\n"
AFTER = IMPORT + REPLAY.replace(
    "        elif forward_mode.is_draft_extend(include_v2=True):\n",
    FIXED + "        elif forward_mode.is_draft_extend(include_v2=True):\n",
)


def test_the_replay_gets_a_fixed_width_branch_before_the_shared_one():
    assert_codemod(g.NsaDraftExtendReplayAtFixedWidth, REPLAY, AFTER)
    # the v1 branch (DRAFT_EXTEND, variable lengths) is kept as it was
    assert AFTER.count("spec_info.num_accept_tokens[:bs]") == 1


def test_a_renamed_backend_is_carried_by_the_dsa_codemod():
    renamed = REPLAY.replace("NativeSparseAttnBackend", "DeepseekSparseAttnBackend")
    assert_codemod(g.DsaDraftExtendReplayAtFixedWidth, renamed, AFTER.replace("NativeSparseAttn", "DeepseekSparseAttn"))
    assert detect(g.NsaDraftExtendReplayAtFixedWidth, renamed).state is State.MISSING  # never a silent pass


def test_values_through_locals_keep_the_forks_names():
    fork = (
        REPLAY.replace("if forward_mode.is_decode", "mode = forward_mode\n        if mode.is_decode")
        .replace("elif forward_mode.is_draft_extend(include_v2=True)", "elif mode.is_draft_extend(include_v2=True)")
        .replace(
            "extend_seq_lens = spec_info.num_accept_tokens[:bs]",
            "accepted = spec_info.num_accept_tokens\n            extend_seq_lens = accepted[:bs]",
        )
        .replace("seqlens_expanded", "expanded")
        .replace("nsa_cache_seqlens =", "topk_lens =")
        .replace("copy_(nsa_cache_seqlens)", "copy_(topk_lens)")
        .replace("torch.cumsum(nsa_cache_seqlens", "torch.cumsum(topk_lens")
        .replace("page_indices", "rows")
    )
    state, out, after = run(g.NsaDraftExtendReplayAtFixedWidth, fork)
    assert (state, after) == (State.TODO, State.DONE)
    fixed = out.split("elif mode.is_draft_extend_v2():")[1].split("elif mode.is_draft_extend(include_v2=True)")[0]
    assert (
        "metadata.nsa_expanded.copy_(expanded)" in fixed
        and "metadata.nsa_cache_seqlens_int32.copy_(topk_lens)" in fixed
    )
    assert "rows = torch.repeat_interleave(" in fixed and ".clamp_(min=0)" in fixed
    assert "tolist" not in fixed and "num_accept_tokens" not in fixed


def test_an_early_return_at_the_top_is_fine_one_in_the_branch_is_refused_in_one_line():
    early = REPLAY.replace(
        "seq_lens = seq_lens[:bs]", "if bs == 0:\n            return\n        seq_lens = seq_lens[:bs]"
    )
    assert run(g.NsaDraftExtendReplayAtFixedWidth, early)[2] is State.DONE
    returns = REPLAY.replace("copy_(nsa_cache_seqlens)\n\n", "copy_(nsa_cache_seqlens)\n            return\n\n")
    finding = detect(g.NsaDraftExtendReplayAtFixedWidth, returns)
    assert finding.state is State.MISSING and "\n" not in finding.detail
    assert "returns before the method's shared tail" in finding.detail


UPSTREAM = code("""
    class DeepseekSparseAttnBackend(AttentionBackend):
        def _apply_cuda_graph_metadata(self, bs, req_pool_indices, seq_lens, seq_lens_cpu, forward_mode, spec_info):
            metadata = self.decode_cuda_graph_metadata[bs]
            if forward_mode.is_draft_extend_v2():
                max_seqlen_k = self._graph_page_table_width(metadata)
                extend_seq_lens = torch.full((bs,), self.speculative_num_draft_tokens, dtype=torch.int32)
                if is_cuda() and not _is_hip:
                    fused_dsa_draft_extend_metadata(seq_lens=seq_lens, seqlens_expanded=metadata.dsa_seqlens_expanded)
                    used_fused_metadata_generation = True
                if not used_fused_metadata_generation:
                    seqlens_expanded = seqlens_expand_triton(extend_seq_lens, seq_lens, bs * 3, 3)
                    metadata.dsa_seqlens_expanded.copy_(seqlens_expanded)
""")


def test_upstreams_branch_is_done_and_a_forks_own_is_clamped_or_left():
    assert_state(g.DsaDraftExtendReplayAtFixedWidth, UPSTREAM, State.DONE)  # 0.5.15+: the fused kernel clamps
    own = UPSTREAM.replace("fused_dsa_draft_extend_metadata", "vendor_metadata")
    state, out, after = run(g.DsaDraftExtendReplayAtFixedWidth, own)
    assert (state, after) == (State.TODO, State.DONE)
    assert "seqlens_expanded = (seqlens_expand_triton(extend_seq_lens, seq_lens, bs * 3, 3)).clamp_(min=0)" in out
    for clamped in ("seqlens_expanded.clamp_(min=0)", "seqlens_expanded = torch.clamp(seqlens_expanded, min=0)"):
        done = own.replace(
            "metadata.dsa_seqlens_expanded.copy_", f"{clamped}\n                metadata.dsa_seqlens_expanded.copy_"
        )
        assert_state(g.DsaDraftExtendReplayAtFixedWidth, done, State.DONE)
    # a fork whose shared branch already runs at the width (no counts read): its own way, left alone
    shared = AFTER.split("elif forward_mode.is_draft_extend(include_v2=True):")[0].replace(
        "elif forward_mode.is_draft_extend_v2():", "elif forward_mode.is_draft_extend(include_v2=True):"
    )
    finding = detect(g.NsaDraftExtendReplayAtFixedWidth, shared)
    assert finding.state is State.SUPERSEDED and "replays the draft extend at a fixed width itself" in finding.detail


def test_0_5_14s_own_branch_at_the_counts_gets_the_fixed_width_body():
    split = REPLAY.replace("is_draft_extend(include_v2=True)", "is_draft_extend_v2()")
    state, out, after = run(g.NsaDraftExtendReplayAtFixedWidth, split)
    assert (state, after) == (State.TODO, State.DONE)
    assert out.count("is_draft_extend_v2()") == 1 and "num_accept_tokens" not in out and ".clamp_(min=0)" in out


CAPTURE = code("""
    class NativeSparseAttnBackend(AttentionBackend):
        def init_forward_metadata_capture_cuda_graph(self, bs, num_tokens, req_pool_indices, seq_lens,
                                                     encoder_lens, forward_mode, spec_info):
            if forward_mode.is_target_verify() or forward_mode.is_draft_extend(include_v2=True):
                page_table_1 = self.decode_cuda_graph_metadata["page_table"][: bs * self.speculative_num_draft_tokens, :]
                self.decode_cuda_graph_metadata[bs] = NSAMetadata(page_table_1=page_table_1)
""")


def test_the_capture_is_checked_not_changed():
    assert_state(g.NsaCapturesDraftExtendAtFixedWidth, CAPTURE, State.SUPERSEDED)
    varying = CAPTURE.replace("bs * self.speculative_num_draft_tokens", "num_tokens")
    finding = detect(g.NsaCapturesDraftExtendAtFixedWidth, varying)
    assert finding.state is State.MISSING and "bs * self.speculative_num_draft_tokens" in finding.detail


WORKER = code("""
    _is_cuda = is_cuda()


    class EagleDraftWorker(BaseDraftWorker):
        def __init__(self):
            self.hot_token_id = None
            self.speculative_algorithm = SpeculativeAlgorithm.EAGLE

        def init_cuda_graphs(self):
            if not self.draft_extend_attn_backend:
                return
            supports_cuda_draft_extend_graph = (_is_cuda or _is_musa) and (
                isinstance(self.draft_extend_attn_backend, TritonAttnBackend)
                or isinstance(self.draft_extend_attn_backend, TRTLLMMLABackend)
            )
            if self.draft_extend_attn_backend and (_is_npu or supports_cuda_draft_extend_graph):
                self.cuda_graph_runner_for_draft_extend = EAGLEDraftExtendCudaGraphRunner(self)
""")

LET_IN = """\
        if (
            _is_cuda
            and not supports_cuda_draft_extend_graph
            and (self.speculative_algorithm.is_eagle3() or self.hot_token_id is None)
        ):
            # patchkit dsa-draft-extend-graph (sglang #29413): DeepSeek sparse
            # attention replays its spec-v2 draft extend at a fixed query width, so it
            # is captured too. CUDA only (its kernels are); eager with an FR-Spec token
            # map, whose reduced head the graph's logits buffer is not sized for.
            supports_cuda_draft_extend_graph = is_dsa_backend(
                self.draft_extend_attn_backend
            )
"""


def test_the_worker_admits_the_sparse_backend_after_its_check():
    after = "from sglang.srt._patchkit.backends.dsa_graph import is_dsa_backend\n" + WORKER.replace(
        "        )\n        if self.draft_extend_attn_backend and",
        "        )\n" + LET_IN + "        if self.draft_extend_attn_backend and",
    )
    assert_codemod(g.GraphCheckAdmitsDsa, WORKER, after)


def test_the_worker_as_upstream_or_a_fork_names_it_is_done():
    upstream = WORKER.replace(
        "        if self.draft_extend_attn_backend and (",
        "        graph_supported_backend_types.append(DeepseekSparseAttnBackend)\n"
        "        if self.draft_extend_attn_backend and (",
    )
    assert_state(g.GraphCheckAdmitsDsa, upstream, State.DONE)
    fork = WORKER.replace(
        "or isinstance(self.draft_extend_attn_backend, TRTLLMMLABackend)",
        "or isinstance(self.draft_extend_attn_backend, (TRTLLMMLABackend, NativeSparseAttnBackend))",
    )
    assert_state(g.GraphCheckAdmitsDsa, fork, State.DONE)
    finding = detect(g.GraphCheckAdmitsDsa, WORKER.replace("_is_cuda = is_cuda()", "_on_gpu = is_cuda()"))
    assert finding.state is State.MISSING and "_is_cuda" in finding.detail and "\n" not in finding.detail


SHIM = code("""
    from sglang.srt.layers.attention.dsa_backend import *  # noqa: F401, F403
""")


@pytest.mark.parametrize(
    "codemod",
    [g.NsaDraftExtendGraphGate, g.NsaCapturesDraftExtendAtFixedWidth, g.NsaDraftExtendReplayAtFixedWidth],
)
def test_shims_are_superseded_not_missing(codemod):
    finding = detect(codemod, SHIM)
    assert finding.state is State.SUPERSEDED and "re-exports the renamed dsa module" in finding.detail


def test_the_gate_lets_0_5_13_through_and_says_where_dsa_no_mirror_is_not_applicable():
    renamed_0_5_13 = code("""
        class DeepseekSparseAttnBackend(AttentionBackend):
            def init_forward_metadata(self, forward_batch):
                if forward_batch.forward_mode.is_draft_extend(include_v2=True):
                    pass

            def _apply_cuda_graph_metadata(self, bs):
                pass
    """)
    finding = detect(g.DsaDraftExtendGraphGate, renamed_0_5_13)  # 0.5.13 / 0.5.14: carried now
    assert finding.state is State.SUPERSEDED and not finding.moots_patch
    before_0_5_7 = renamed_0_5_13.replace("is_draft_extend(include_v2=True)", "is_draft_extend()")
    finding = detect(g.DsaDraftExtendGraphGate, before_0_5_7)
    assert finding.moots_patch and finding.detail.startswith("builds on dsa-no-mirror, not applicable here: no spec-v2")


def test_is_dsa_backend_knows_both_names_and_imports_nothing(monkeypatch):
    classes = {}
    for module_name, class_name in dsa_graph.SPARSE_ATTN_BACKENDS:
        module = types.ModuleType(module_name)
        classes[class_name] = type(class_name, (), {})
        setattr(module, class_name, classes[class_name])
        monkeypatch.setitem(sys.modules, module_name, module)
    for cls in classes.values():
        assert dsa_graph.is_dsa_backend(cls()) and dsa_graph.is_dsa_backend(type("Fork", (cls,), {})())
    assert not dsa_graph.is_dsa_backend(object())
    for module_name, _ in dsa_graph.SPARSE_ATTN_BACKENDS:
        monkeypatch.delitem(sys.modules, module_name)
    assert not dsa_graph.is_dsa_backend(classes["NativeSparseAttnBackend"]())  # not imported: not this tree's


# -- 0.5.8 .. 0.5.9: the capture gate inline, the replay expanding on the host ---------------------

INLINE_WORKER = code("""
    _is_npu = is_npu()
    _is_cuda = is_cuda()


    class EagleDraftWorker(BaseDraftWorker):
        def __init__(self):
            self.hot_token_id = None
            self.speculative_algorithm = SpeculativeAlgorithm.EAGLE

        def init_cuda_graphs(self):
            if self.server_args.disable_cuda_graph:
                return
            if self.draft_extend_attn_backend and (
                _is_npu
                or (
                    _is_cuda
                    and isinstance(self.draft_attn_backend, TritonMultiStepDraftBackend)
                )
            ):
                self.cuda_graph_runner_for_draft_extend = Device2ExtendCudaGraphRunner(self)

        def _draft_extend_for_decode(self, forward_batch):
            return self.cuda_graph_runner_for_draft_extend and self.cuda_graph_runner_for_draft_extend.can_run(forward_batch)
""")


def test_the_inline_capture_gate_of_0_5_8_gets_a_flag_and_a_term():
    state, out, after = run(g.GraphCheckAdmitsDsa, INLINE_WORKER)
    assert (state, after) == (State.TODO, State.DONE)
    assert out.startswith("from sglang.srt._patchkit.backends.dsa_graph import is_dsa_backend\n")
    flag, gate = out.split("        if self.draft_extend_attn_backend and (")
    assert "# patchkit dsa-draft-extend-graph (sglang #29413)" in flag
    assert (
        "dsa_draft_extend_graph = (\n            _is_cuda\n"
        "            and (self.speculative_algorithm.is_eagle3() or self.hot_token_id is None)\n"
        "            and is_dsa_backend(self.draft_extend_attn_backend)\n        )\n" in flag
    )
    assert "            )\n            or dsa_draft_extend_graph\n        ):" in gate
    start = INLINE_WORKER.index("_is_npu\n            or (")
    end = INLINE_WORKER.index("        ):\n            self.cuda_graph_runner_for_draft_extend")
    npu_only = INLINE_WORKER[:start] + "_is_npu\n" + INLINE_WORKER[end:]
    finding = detect(g.GraphCheckAdmitsDsa, npu_only)  # 0.5.7: no CUDA graph to join
    assert finding.moots_patch and "captured on NPU only" in finding.detail


# 0.5.9's replay branch as released: the accepted counts, and the lengths expanded on the host
HOST_REPLAY = REPLAY.replace("spec_info.num_accept_tokens[:bs]", "spec_info.accept_length[:bs]").replace(
    """            seqlens_expanded = seqlens_expand_triton(
                extend_seq_lens, cache_seqlens, sum(extend_seq_lens_cpu), self.speculative_num_draft_tokens
            )
""",
    """            seqlens_expanded = torch.cat(
                [
                    torch.arange(kv_len - qo_len + 1, kv_len + 1, dtype=torch.int32, device=self.device)
                    for qo_len, kv_len in zip(extend_seq_lens_cpu, seq_lens_cpu.tolist(), strict=True)
                ]
            )
""",
)


def test_a_host_expanding_replay_gets_the_fixed_width_branch_on_the_device_expansion():
    """0.5.9 as released (status reads it before dsa-no-mirror): the new branch calls
    backends.dsa seqlens_expand, imported with graph_max_len; the v1 branch is left."""
    state, out, after = run(g.NsaDraftExtendReplayAtFixedWidth, HOST_REPLAY)
    assert (state, after) == (State.TODO, State.DONE)
    assert out.startswith("from sglang.srt._patchkit.backends.dsa import graph_max_len, seqlens_expand\n")
    fixed, shared = out.split("elif forward_mode.is_draft_extend_v2():")[1].split(
        "elif forward_mode.is_draft_extend(include_v2=True):"
    )
    assert "seqlens_expanded = seqlens_expand(\n" in fixed and ").clamp_(min=0)" in fixed
    assert "accept_length" not in fixed and "torch.cat(" in shared
    # after dsa-no-mirror (the order apply takes), the branch names backends.dsa's expansion
    device = HOST_REPLAY.replace(
        HOST_REPLAY[
            HOST_REPLAY.index("            seqlens_expanded = torch.cat(") : HOST_REPLAY.index(
                "            metadata.nsa_seqlens_expanded"
            )
        ],
        "            seqlens_expanded = seqlens_expand(extend_seq_lens, seq_lens, sum(extend_seq_lens_cpu))\n",
    )
    state, out2, after = run(g.NsaDraftExtendReplayAtFixedWidth, device)
    assert (state, after) == (State.TODO, State.DONE) and "seqlens_expand(\n" in out2.split("is_draft_extend_v2")[1]


def test_the_gate_lets_0_5_9s_host_expansion_through_and_moots_an_unfollowable_one():
    host = code("""
        class NativeSparseAttnBackend(AttentionBackend):
            def init_forward_metadata(self, forward_batch):
                if forward_batch.forward_mode.is_target_verify():
                    seqlens_expanded = torch.cat(
                        [torch.arange(kv - qo + 1, kv + 1) for qo, kv in zip(LENS, forward_batch.seq_lens_cpu.tolist())]
                    )
                elif forward_batch.forward_mode.is_draft_extend(include_v2=True):
                    pass
    """)
    finding = detect(g.NsaDraftExtendGraphGate, host)  # LENS: a global list, not followed
    assert finding.moots_patch and "cannot follow to device tensors" in finding.detail
    followed = host.replace("zip(LENS,", "zip(forward_batch.extend_seq_lens_cpu,")
    finding = detect(g.NsaDraftExtendGraphGate, followed)
    assert finding.state is State.SUPERSEDED and not finding.moots_patch
