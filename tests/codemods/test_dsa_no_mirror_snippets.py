"""Snippet tests of patch dsa-no-mirror (tests/trees/test_dsa_no_mirror.py has the releases):
each codemod on a snippet of the NSA / DSA shapes, upstream's shapes left alone, the shims,
forks refused with one line; and the eager width, run without the mirror, reading no device
length (sglang #33973)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from dsa_shapes import eager_width

from patchkit.backends import dsa
from patchkit.codemods import dsa_no_mirror as d
from patchkit.codemods.common.base import State
from patchkit.runtime.host_bound import SeqLensBound
from patchkit.testing import assert_state, code, detect, run, run_all

BACKEND = code("""
    import torch


    class NativeSparseAttnBackend(NativeSparseAttnBackendMTPPrecomputeMixin, AttentionBackend):
        def __init__(self, model_runner):
            self.max_context_len = model_runner.model_config.context_len

        def init_forward_metadata(self, forward_batch: ForwardBatch):
            if forward_batch.forward_mode.is_target_verify():
                draft_token_num = self.speculative_num_draft_tokens
            else:
                draft_token_num = 0
            assert forward_batch.seq_lens_cpu is not None
            max_seqlen_k = int(forward_batch.seq_lens_cpu.max().item() + draft_token_num)
            page_table = forward_batch.req_to_token_pool.req_to_token[
                forward_batch.req_pool_indices, :max_seqlen_k
            ]
            if forward_batch.forward_mode.is_decode_or_idle():
                extend_seq_lens_cpu = [1] * batch_size
            elif forward_batch.forward_mode.is_target_verify():
                seqlens_expanded = seqlens_expand_triton(lens, cache_seqlens_int32, n, d)
            elif forward_batch.forward_mode.is_draft_extend(include_v2=True):
                assert (
                    forward_batch.extend_seq_lens_cpu is not None
                    and forward_batch.extend_seq_lens is not None
                    and forward_batch.extend_prefix_lens_cpu is not None
                ), "All of them must not be None"
                extend_seq_lens_cpu = forward_batch.extend_seq_lens_cpu
            elif forward_batch.forward_mode.is_extend():
                assert (
                    forward_batch.extend_seq_lens_cpu is not None
                    and forward_batch.extend_prefix_lens_cpu is not None
                ), "All of them must not be None"

        def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens, seq_lens_sum,
                                                    encoder_lens, forward_mode, spec_info, seq_lens_cpu):
            assert seq_lens_cpu is not None
            seq_lens = seq_lens[:bs]
            seq_lens_cpu = seq_lens_cpu[:bs]
            metadata: NSAMetadata = self.decode_cuda_graph_metadata[bs]
            if forward_mode.is_decode_or_idle():
                max_len = int(seq_lens_cpu.max().item())
                metadata.page_table_1[:, :max_len].copy_(self.req_to_token[req_pool_indices, :max_len])
            elif forward_mode.is_target_verify():
                max_seqlen_k = int(
                    seq_lens_cpu.max().item() + self.speculative_num_draft_tokens
                )


    class NativeSparseAttnMultiStepBackend:

        def __init__(self, model_runner, topk, speculative_num_steps):
            self.topk = topk
""")

#: sglang 0.5.15 .. 0.5.23's eager width: the device max without the mirror (sglang #33973).
UPSTREAM_EAGER = code("""
    class DeepseekSparseAttnBackend(AttentionBackend):
        needs_cpu_seq_lens: bool = False

        def init_forward_metadata(self, forward_batch: ForwardBatch):
            draft_token_num = 0
            if forward_batch.seq_lens_cpu is not None:
                max_seqlen_k = int(
                    forward_batch.seq_lens_cpu.max().item() + draft_token_num
                )
            else:
                max_seqlen_k = int(forward_batch.seq_lens.max().item()) + draft_token_num
            if forward_batch.forward_mode.is_draft_extend_v2():
                if forward_batch.extend_prefix_lens_cpu is None:
                    assert forward_batch.extend_prefix_lens is not None
                    forward_batch.extend_prefix_lens_cpu = (
                        forward_batch.extend_prefix_lens.cpu().tolist()
                    )
                assert (
                    forward_batch.extend_seq_lens_cpu is not None
                    and forward_batch.extend_prefix_lens_cpu is not None
                ), "All of them must not be None"
""")

SHIM = code("""
    import warnings

    warnings.warn("deprecated", DeprecationWarning, stacklevel=2)
    from sglang.srt.layers.attention.dsa_backend import *  # noqa: F401, F403
    from sglang.srt.layers.attention.dsa_backend import NativeSparseAttnBackend  # noqa: F401
""")

NSA_CODEMODS = [
    d.NsaHasSpecV2Path,
    d.NsaOptsOut,
    d.NsaMultiStepOptsOut,
    d.NsaEagerMaxFromHostBound,
    d.NsaDraftExtendNeedsNoPrefixList,
    d.NsaReplayWithoutMirror,
]


def test_backend_snippet_all_codemods_then_idempotent():
    out, states = run_all(NSA_CODEMODS, BACKEND)
    assert states == [State.SUPERSEDED] + [State.DONE] * 5
    assert "from sglang.srt._patchkit.backends.mirror_reads import host_max_seq_len" in out
    assert "from sglang.srt._patchkit.backends.dsa import graph_max_len" in out
    assert out.count("needs_cpu_seq_lens: bool = False") == 2
    eager = out.split("def init_forward_metadata(")[1].split("def init_forward_metadata_replay")[0]
    assert "assert forward_batch.seq_lens_cpu is not None" not in eager
    assert (
        "max_seqlen_k = int(host_max_seq_len(forward_batch.seq_lens_cpu, self.max_context_len, forward_batch)"
        " + draft_token_num)" in eager
    )
    assert "# DP-attention ranks, sglang #33973" in eager
    draft, extend = eager.split("is_draft_extend(include_v2=True):")[1].split(
        "elif forward_batch.forward_mode.is_extend():"
    )
    assert "extend_prefix_lens_cpu" not in draft and "extend_seq_lens_cpu is not None" in draft
    assert "extend_prefix_lens_cpu is not None" in extend  # the prefill branch keeps its assert
    replay = out.split("def init_forward_metadata_replay_cuda_graph")[1]
    assert "assert seq_lens_cpu is None or len(seq_lens_cpu) >= bs" in replay
    assert "seq_lens_cpu = seq_lens_cpu[:bs] if seq_lens_cpu is not None else None" in replay
    assert "int(graph_max_len(seq_lens_cpu, 0, metadata.page_table_1, self.req_to_token))" in replay
    assert (
        "max_seqlen_k = graph_max_len(seq_lens_cpu, self.speculative_num_draft_tokens, metadata.page_table_1, "
        "self.req_to_token)" in replay
    )
    again, states = run_all(NSA_CODEMODS, out)
    assert again == out


def test_renamed_backend_is_carried_by_the_dsa_codemods():
    """A fork of 0.5.12.post1 that took upstream's names (DeepseekSparseAttnBackend, dsa_backend.py)."""
    renamed = BACKEND.replace("NativeSparseAttn", "DeepseekSparseAttn")
    dsa_codemods = [getattr(d, c.__name__.replace("Nsa", "Dsa", 1)) for c in NSA_CODEMODS]
    out, states = run_all(dsa_codemods, renamed)
    assert states == [State.SUPERSEDED] + [State.DONE] * 5
    assert "host_max_seq_len(forward_batch.seq_lens_cpu" in out and "graph_max_len(" in out
    # The NSA names find no class there: missing, never a silent pass.
    assert detect(d.NsaEagerMaxFromHostBound, renamed).state is State.MISSING


def test_upstream_eager_fallback_is_rewritten_past_upstream():
    state, out, after = run(d.DsaEagerMaxFromHostBound, UPSTREAM_EAGER)
    assert (state, after) == (State.TODO, State.DONE)
    assert "seq_lens.max().item()" not in out
    assert "if forward_batch.seq_lens_cpu is not None:" not in out
    # upstream's flag and its DRAFT_EXTEND_V2 branch are left as upstream wrote them
    assert_state(d.DsaOptsOut, UPSTREAM_EAGER, State.DONE)
    assert_state(d.DsaDraftExtendNeedsNoPrefixList, UPSTREAM_EAGER, State.SUPERSEDED)


def test_0_5_20_kpool_condition_is_kept():
    kpool = UPSTREAM_EAGER.replace(
        "        def init_forward_metadata(",
        "        def __init__(self, model_runner):\n"
        "            self.dsa_index_kpool = get_dsa_index_kpool(hf_config)\n"
        "            self.needs_cpu_seq_lens = self.dsa_index_kpool > 1\n\n"
        "        def init_forward_metadata(",
    )
    state, out, _ = run(d.DsaOptsOut, kpool)
    assert state is State.DONE and out == kpool


def test_shims_are_superseded_not_missing():
    for codemod in (*NSA_CODEMODS[1:], d.NsaPrecomputeDecodeWithoutMirror, d.IndexerEmptyBatchFromShape):
        finding = detect(codemod, SHIM)
        assert finding.state is State.SUPERSEDED, codemod
        assert "re-exports the renamed dsa module" in finding.detail


def test_releases_without_spec_v2_or_with_host_expansion_are_not_applicable():
    old = BACKEND.replace("is_draft_extend(include_v2=True)", "is_draft_extend()")
    finding = detect(d.NsaHasSpecV2Path, old)
    assert finding.state is State.SUPERSEDED and finding.moots_patch and "0.5.7" in finding.detail
    host = BACKEND.replace(  # a fork's host expansion over a list patchkit cannot follow to the device
        "seqlens_expanded = seqlens_expand_triton(lens, cache_seqlens_int32, n, d)",
        "seqlens_expanded = torch.cat([torch.arange(kv - qo + 1, kv + 1) for qo, kv in zip(self.lens(), "
        "forward_batch.seq_lens_cpu.tolist())])",
    )
    finding = detect(d.NsaHasSpecV2Path, host)
    assert finding.moots_patch and "0.5.10 expands them on the device" in finding.detail
    followed = host.replace("self.lens()", "forward_batch.extend_seq_lens_cpu")  # 0.5.7 .. 0.5.9's shape: carried
    assert detect(d.NsaHasSpecV2Path, followed).moots_patch is False


def test_a_vendor_eager_width_is_refused_with_one_line():
    vendor = BACKEND.replace(
        "max_seqlen_k = int(forward_batch.seq_lens_cpu.max().item() + draft_token_num)",
        "max_seqlen_k = self.vendor_width(forward_batch) + draft_token_num",
    )
    finding = detect(d.NsaEagerMaxFromHostBound, vendor)
    assert finding.state is State.MISSING
    assert "the patch needs" in finding.detail and "\n" not in finding.detail


INDEXER = code("""
    class Indexer(MultiPlatformOp):
        def forward_cuda(self, x, forward_batch, layer_id):
            if _is_cuda or _is_hip:
                assert forward_batch.seq_lens_cpu is not None
                if len(forward_batch.seq_lens_cpu) == 0:
                    return None
""")


def test_indexer_empty_batch_reads_a_shape():
    state, out, after = run(d.IndexerEmptyBatchFromShape, INDEXER)
    assert (state, after) == (State.TODO, State.DONE)
    assert "if forward_batch.seq_lens.numel() == 0:" in out and "seq_lens_cpu" not in out


def test_indexer_vendor_edit_is_refused_with_one_line():
    """A vendor's indexer that tests emptiness its own way (a fork shape)."""
    vendor = INDEXER.replace("len(forward_batch.seq_lens_cpu) == 0", "forward_batch.batch_size == 0")
    finding = detect(d.IndexerEmptyBatchFromShape, vendor)
    assert finding.state is State.MISSING and "len(forward_batch.seq_lens_cpu) == 0" in finding.detail


PRECOMPUTE = code("""
    class NativeSparseAttnBackendMTPPrecomputeMixin:
        def _precompute_replay_metadata(self, bs, req_pool_indices, seq_lens, seq_lens_cpu, forward_mode, spec_info):
            seq_lens = seq_lens[:bs]
            seq_lens_cpu = seq_lens_cpu[:bs]
            return self._precompute_decode_mode(bs, req_pool_indices, seq_lens, seq_lens_cpu)

        def _precompute_decode_mode(self, bs, req_pool_indices, seq_lens, seq_lens_cpu):
            max_len = int(seq_lens_cpu.max().item())
            return self.req_to_token[req_pool_indices, :max_len]
""")


def test_precompute_mixin():
    out, states = run_all([d.NsaPrecomputeSliceWithoutMirror, d.NsaPrecomputeDecodeWithoutMirror], PRECOMPUTE)
    assert states == [State.DONE, State.DONE]
    assert "seq_lens_cpu = seq_lens_cpu[:bs] if seq_lens_cpu is not None else None" in out
    assert "graph_max_len(seq_lens_cpu, 0, self.decode_cuda_graph_metadata[bs].page_table_1, self.req_to_token)" in out


# -- no device read in the eager width without the mirror (sglang #33973) ------------------------


def test_upstream_eager_width_reads_the_device_and_the_patched_one_does_not():
    assert eager_width(UPSTREAM_EAGER, "DeepseekSparseAttnBackend", None) == (100, 1)  # upstream: a device read
    _, patched, _ = run(d.DsaEagerMaxFromHostBound, UPSTREAM_EAGER)
    assert eager_width(patched, "DeepseekSparseAttnBackend", SeqLensBound(120, 900)) == (120, 0)
    assert eager_width(patched, "DeepseekSparseAttnBackend", None) == (163840, 0)  # no host bound: the static one
    with pytest.raises(AssertionError):  # 0.5.12.post1 as released: the mirror is required
        eager_width(BACKEND, "NativeSparseAttnBackend", None)
    _, patched, _ = run(d.NsaEagerMaxFromHostBound, BACKEND)
    assert eager_width(patched, "NativeSparseAttnBackend", SeqLensBound(120, 900)) == (120, 0)


def test_graph_max_len():
    table, req_to_token = SimpleNamespace(shape=(64, 1028)), SimpleNamespace(shape=(128, 1032))
    mirror = SimpleNamespace(max=lambda: SimpleNamespace(item=lambda: 37))
    assert dsa.graph_max_len(mirror, 4, table, req_to_token) == 41  # as before with the mirror
    assert dsa.graph_max_len(None, 4, table, req_to_token) == 1028  # the width both share


# -- the decision with DSA (docs/research/dp-attention.md §7) -----------------------------------


def test_decision_with_dsa_backends():
    from patchkit.runtime import seq_lens as rt

    class Dsa:  # the patched class (or 0.5.15+): opted out
        needs_cpu_seq_lens = False

    pooled = Dsa()
    pooled.needs_cpu_seq_lens = True  # 0.5.20 .. 0.5.21: `self.needs_cpu_seq_lens = self.dsa_index_kpool > 1`

    def args(**kw):
        return SimpleNamespace(**{"enable_two_batch_overlap": False, "disable_piecewise_cuda_graph": True, **kw})

    backends = [Dsa(), Dsa(), None]  # target, draft (multi-step), no draft-extend backend
    assert rt.decide_needs_cpu_seq_lens(args(), backends) is False  # TP, DP attention alike
    assert rt.decide_needs_cpu_seq_lens(args(), [pooled, Dsa()]) is True  # pooled index keys
    assert rt.decide_needs_cpu_seq_lens(args(enable_two_batch_overlap=True), backends) is True  # TBO reads it
    piecewise_on = SimpleNamespace(enable_two_batch_overlap=False, disable_piecewise_cuda_graph=False)
    assert rt.decide_needs_cpu_seq_lens(piecewise_on, backends) is True  # unless piecewise-no-forced-mirror
    assert rt.decide_needs_cpu_seq_lens(piecewise_on, backends, piecewise_reads_mirror=False) is False
    assert rt.decide_needs_cpu_seq_lens(args(), [SimpleNamespace(), Dsa()]) is True  # pristine NSA: no flag


# -- 0.5.7 .. 0.5.9: the verify / draft-extend lengths expanded on the device ------------------------

HOST = code("""
    import torch


    class NativeSparseAttnBackend(AttentionBackend):
        def init_forward_metadata(self, forward_batch: ForwardBatch):
            batch_size = forward_batch.batch_size
            device = forward_batch.seq_lens.device
            if forward_batch.forward_mode.is_decode_or_idle():
                extend_seq_lens_cpu = [1] * batch_size
            elif forward_batch.forward_mode.is_target_verify():
                extend_seq_lens_cpu = [self.speculative_num_draft_tokens] * batch_size
                forward_batch.extend_seq_lens_cpu = extend_seq_lens_cpu

                seqlens_int32_cpu = [
                    self.speculative_num_draft_tokens + kv_len
                    for kv_len in forward_batch.seq_lens_cpu.tolist()
                ]
                seqlens_expanded = torch.cat(
                    [
                        torch.arange(kv_len - qo_len + 1, kv_len + 1, dtype=torch.int32, device=device)
                        for qo_len, kv_len in zip(extend_seq_lens_cpu, seqlens_int32_cpu, strict=True)
                    ]
                )
            elif forward_batch.forward_mode.is_draft_extend(include_v2=True):
                extend_seq_lens_cpu = forward_batch.extend_seq_lens_cpu
                seqlens_expanded = torch.cat(
                    [
                        torch.arange(kv_len - qo_len + 1, kv_len + 1, dtype=torch.int32, device=device)
                        for qo_len, kv_len in zip(
                            forward_batch.extend_seq_lens_cpu, forward_batch.seq_lens_cpu.tolist(), strict=True
                        )
                    ]
                )
            elif forward_batch.forward_mode.is_extend():
                seqlens_expanded = torch.cat(
                    [
                        torch.arange(kv_len - qo_len + 1, kv_len + 1, dtype=torch.int32, device=device)
                        for qo_len, kv_len in zip(
                            forward_batch.extend_seq_lens_cpu, forward_batch.seq_lens_cpu.tolist(), strict=True
                        )
                    ]
                )
            return seqlens_expanded
""")
VERIFY_ON_DEVICE = (
    "seqlens_expanded = seqlens_expand(self.speculative_num_draft_tokens, (forward_batch.seq_lens + "
    "self.speculative_num_draft_tokens), self.speculative_num_draft_tokens * batch_size)"
)
DRAFT_ON_DEVICE = (
    "seqlens_expanded = seqlens_expand(forward_batch.extend_seq_lens, forward_batch.seq_lens, "
    "sum(forward_batch.extend_seq_lens_cpu))"
)


def _spec_part(out: str) -> tuple[str, str]:
    return tuple(out.split("elif forward_batch.forward_mode.is_extend():"))  # type: ignore[return-value]


def test_host_expansion_runs_on_the_device_prefill_left():
    state, out, after = run(d.NsaEagerExpandsOnDevice, HOST)
    assert (state, after) == (State.TODO, State.DONE)
    assert "\nfrom sglang.srt._patchkit.backends.dsa import seqlens_expand\n" in out
    spec, prefill = _spec_part(out)
    assert VERIFY_ON_DEVICE in spec and DRAFT_ON_DEVICE in spec
    assert "seq_lens_cpu.tolist()" not in spec and "seqlens_int32_cpu" not in spec and "torch.cat(" not in spec
    assert "forward_batch.extend_seq_lens_cpu = extend_seq_lens_cpu" in spec  # still read downstream
    assert "torch.cat(" in prefill and "forward_batch.seq_lens_cpu.tolist()" in prefill
    assert run(d.NsaEagerExpandsOnDevice, out)[1] == out  # idempotent


def test_host_expansion_the_lengths_through_locals_and_swapped_loop_names():
    """A fork that reads the mirror into a local first and names its loop the other way round."""
    fork = HOST.replace(
        "            extend_seq_lens_cpu = forward_batch.extend_seq_lens_cpu\n",
        "            extend_seq_lens_cpu = forward_batch.extend_seq_lens_cpu\n"
        "            kv_lens = forward_batch.seq_lens_cpu.tolist()\n",
    ).replace(
        """                    torch.arange(kv_len - qo_len + 1, kv_len + 1, dtype=torch.int32, device=device)
                    for qo_len, kv_len in zip(
                        forward_batch.extend_seq_lens_cpu, forward_batch.seq_lens_cpu.tolist(), strict=True
                    )
                ]
            )
        elif forward_batch.forward_mode.is_extend():""",
        """                    torch.arange(kv - q + 1, kv + 1, dtype=torch.int32, device=device)
                    for kv, q in zip(kv_lens, extend_seq_lens_cpu)
                ]
            )
        elif forward_batch.forward_mode.is_extend():""",
    )
    assert "for kv, q in zip(kv_lens, extend_seq_lens_cpu)" in fork
    state, out, after = run(d.NsaEagerExpandsOnDevice, fork)
    assert (state, after) == (State.TODO, State.DONE)
    spec, _ = _spec_part(out)
    assert "seqlens_expand(forward_batch.extend_seq_lens, forward_batch.seq_lens, sum(extend_seq_lens_cpu))" in spec
    assert "kv_lens" not in spec  # the local only the expansion read goes with it


def test_host_expansion_under_a_renamed_class_and_beside_a_branch_already_on_the_device():
    renamed = HOST.replace("NativeSparseAttnBackend", "DeepseekSparseAttnBackend")
    state, out, after = run(d.DsaEagerExpandsOnDevice, renamed)
    assert (state, after) == (State.TODO, State.DONE) and VERIFY_ON_DEVICE in out
    assert detect(d.NsaEagerExpandsOnDevice, renamed).state is State.MISSING  # no NSA class there
    verify_done = HOST.replace(
        HOST[
            HOST.index("            seqlens_int32_cpu = [") : HOST.index(
                "        elif forward_batch.forward_mode.is_draft_extend"
            )
        ],
        "            seqlens_expanded = seqlens_expand_triton(lens, cache_seqlens_int32, n, d)\n",
    )
    state, out, _ = run(d.NsaEagerExpandsOnDevice, verify_done)
    assert state is State.TODO and "seqlens_expand_triton(lens, cache_seqlens_int32, n, d)" in out
    assert DRAFT_ON_DEVICE in out
    upstream = out.replace("seqlens_expand(", "seqlens_expand_triton(")  # 0.5.10+: upstream's kernel
    assert detect(d.NsaEagerExpandsOnDevice, upstream).state is State.SUPERSEDED


def test_host_expansion_with_early_returns():
    early = HOST.replace(
        "        batch_size = forward_batch.batch_size\n",
        "        if forward_batch.forward_mode.is_idle():\n            return None\n"
        "        batch_size = forward_batch.batch_size\n",
    ).replace(
        "            forward_batch.extend_seq_lens_cpu = extend_seq_lens_cpu\n",
        "            forward_batch.extend_seq_lens_cpu = extend_seq_lens_cpu\n"
        "            if batch_size == 0:\n                return None\n",
    )
    state, out, after = run(d.NsaEagerExpandsOnDevice, early)
    assert (state, after) == (State.TODO, State.DONE)
    assert VERIFY_ON_DEVICE in out and DRAFT_ON_DEVICE in out and out.count("return None") == 2


def test_host_expansion_a_list_not_followed_is_refused_in_one_line():
    vendor = HOST.replace(
        "zip(extend_seq_lens_cpu, seqlens_int32_cpu, strict=True)", "zip(self.q(), seqlens_int32_cpu)"
    )
    finding = detect(d.NsaEagerExpandsOnDevice, vendor)
    assert finding.state is State.MISSING and "\n" not in finding.detail and "the patch needs" in finding.detail
    assert detect(d.NsaHasSpecV2Path, vendor).moots_patch  # the release gate says not applicable first


def test_replay_host_expansion_runs_on_the_device():
    replay = code("""
        class NativeSparseAttnBackend(AttentionBackend):
            def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens, seq_lens_sum,
                                                        encoder_lens, forward_mode, spec_info, seq_lens_cpu):
                seq_lens = seq_lens[:bs]
                seq_lens_cpu = seq_lens_cpu[:bs]
                if forward_mode.is_target_verify():
                    extend_seq_lens_cpu = [self.speculative_num_draft_tokens] * bs
                    seqlens_int32_cpu = [
                        self.speculative_num_draft_tokens + kv_len for kv_len in seq_lens_cpu.tolist()
                    ]
                    seqlens_expanded = torch.cat(
                        [
                            torch.arange(kv_len - qo_len + 1, kv_len + 1, dtype=torch.int32, device=self.device)
                            for qo_len, kv_len in zip(extend_seq_lens_cpu, seqlens_int32_cpu, strict=True)
                        ]
                    )
                elif forward_mode.is_draft_extend(include_v2=True):
                    extend_seq_lens = spec_info.accept_length[:bs]
                    extend_seq_lens_cpu = extend_seq_lens.tolist()
                    seqlens_expanded = torch.cat(
                        [
                            torch.arange(kv_len - qo_len + 1, kv_len + 1, dtype=torch.int32, device=self.device)
                            for qo_len, kv_len in zip(extend_seq_lens_cpu, seq_lens_cpu.tolist(), strict=True)
                        ]
                    )
    """)
    state, out, after = run(d.NsaReplayExpandsOnDevice, replay)
    assert (state, after) == (State.TODO, State.DONE)
    assert (
        "seqlens_expanded = seqlens_expand(self.speculative_num_draft_tokens, (seq_lens + "
        "self.speculative_num_draft_tokens), self.speculative_num_draft_tokens * bs)" in out
    )
    assert "seqlens_expanded = seqlens_expand(extend_seq_lens, seq_lens, sum(extend_seq_lens_cpu))" in out
    assert "seq_lens_cpu.tolist()" not in out and "seqlens_int32_cpu" not in out


@pytest.mark.parametrize("seed", range(5))
def test_seqlens_expand_equals_the_host_expansion(seed):
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(seed)
    bs = int(torch.randint(1, 9, (1,), generator=gen))
    kv = torch.randint(4, 200, (bs,), generator=gen)
    qo = torch.randint(1, 5, (bs,), generator=gen)
    host = torch.cat(
        [torch.arange(k - q + 1, k + 1, dtype=torch.int32) for q, k in zip(qo.tolist(), kv.tolist(), strict=True)]
    )
    assert torch.equal(dsa.seqlens_expand(qo, kv, int(qo.sum())), host)
    fixed = torch.cat([torch.arange(k + 4 - 4 + 1, k + 4 + 1, dtype=torch.int32) for k in kv.tolist()])
    assert torch.equal(dsa.seqlens_expand(4, kv + 4, 4 * bs), fixed)


# -- target verify: the query lengths filled on the device, not copied from a host list ------------

VERIFY = code("""
    import torch


    class NativeSparseAttnBackend(AttentionBackend):
        def init_forward_metadata(self, forward_batch: ForwardBatch):
            batch_size = forward_batch.batch_size
            device = forward_batch.seq_lens.device
            if forward_batch.forward_mode.is_decode_or_idle():
                extend_seq_lens_cpu = [1] * batch_size
            elif forward_batch.forward_mode.is_target_verify():
                extend_seq_lens_cpu = [self.speculative_num_draft_tokens] * batch_size
                forward_batch.extend_seq_lens_cpu = extend_seq_lens_cpu

                seqlens_expanded = seqlens_expand_triton(
                    torch.tensor(extend_seq_lens_cpu, dtype=torch.int32, device=device),
                    cache_seqlens_int32,
                    self.speculative_num_draft_tokens * batch_size,
                    self.speculative_num_draft_tokens,
                )
            elif forward_batch.forward_mode.is_draft_extend(include_v2=True):
                extend_seq_lens_cpu = forward_batch.extend_seq_lens_cpu
                lens = torch.tensor(extend_seq_lens_cpu, dtype=torch.int32, device=device)
            return seqlens_expanded, extend_seq_lens_cpu

        def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens, seq_lens_sum,
                                                    encoder_lens, forward_mode, spec_info, seq_lens_cpu):
            if forward_mode.is_target_verify():
                extend_seq_lens_cpu = [self.speculative_num_draft_tokens] * bs

                seqlens_expanded = seqlens_expand_triton(
                    torch.tensor(
                        extend_seq_lens_cpu, dtype=torch.int32, device=self.device
                    ),
                    cache_seqlens,
                    self.speculative_num_draft_tokens * bs,
                    self.speculative_num_draft_tokens,
                )
            elif forward_mode.is_draft_extend(include_v2=True):
                extend_seq_lens_cpu = spec_info.num_accept_tokens[:bs].tolist()
""")
VERIFY_CODEMODS = [d.NsaVerifyLengthsOnDevice, d.NsaReplayVerifyLengthsOnDevice]
EAGER_FULL = "torch.full((batch_size,), self.speculative_num_draft_tokens, dtype=torch.int32, device=device)"
REPLAY_FULL = "torch.full((bs,), self.speculative_num_draft_tokens, dtype=torch.int32, device=self.device)"


def _methods(out: str) -> tuple[str, str]:
    eager, replay = out.split("def init_forward_metadata_replay_cuda_graph(")
    return eager, replay


def test_verify_lengths_filled_on_the_device_eager_and_replay():
    out, states = run_all(VERIFY_CODEMODS, VERIFY)
    assert states == [State.DONE, State.DONE]
    eager, replay = _methods(out)
    verify, draft = eager.split("is_draft_extend(include_v2=True):")
    assert EAGER_FULL in verify and "torch.tensor(" not in verify
    # the host list stays: forward_batch carries it, the method returns it
    assert "extend_seq_lens_cpu = [self.speculative_num_draft_tokens] * batch_size" in verify
    assert "forward_batch.extend_seq_lens_cpu = extend_seq_lens_cpu" in verify
    assert "torch.tensor(extend_seq_lens_cpu, dtype=torch.int32, device=device)" in draft  # not verify: left
    assert REPLAY_FULL in replay and "torch.tensor(" not in replay
    assert "extend_seq_lens_cpu = [self.speculative_num_draft_tokens] * bs" in replay  # the draft branch names it too
    assert out.count("# The verify query lengths, one value per request, filled on the device:") == 2
    again, _ = run_all(VERIFY_CODEMODS, out)
    assert again == out  # idempotent


@pytest.mark.parametrize("n", [0, 1, 5])
def test_the_fill_has_the_copys_values_and_dtype(n):
    torch = pytest.importorskip("torch")
    copied = torch.tensor([4] * n, dtype=torch.int32, device="cpu")
    filled = torch.full((n,), 4, dtype=torch.int32, device="cpu")
    assert filled.dtype == copied.dtype and torch.equal(filled, copied)


def _replay_verify(body: str) -> str:
    """A replay whose verify branch is ``body`` (lines at the branch's indent)."""
    lines = "".join(f"                    {ln}\n" if ln else "\n" for ln in body.strip("\n").splitlines())
    return code(f"""
        class DeepseekSparseAttnBackend(AttentionBackend):
            def _apply_cuda_graph_metadata(self, bs, req_pool_indices, seq_lens, forward_mode, metadata):
                if forward_mode.is_decode_or_idle():
                    pass
                elif forward_mode.is_target_verify():
{lines}
    """)


FILL = "torch.full((bs,), self.speculative_num_draft_tokens, dtype=torch.int32, device=self.device)"


@pytest.mark.parametrize(
    "body",
    [
        # the list inline, either operand order
        "x = f(torch.tensor([self.speculative_num_draft_tokens] * bs, dtype=torch.int32, device=self.device))",
        "x = f(torch.tensor(bs * [self.speculative_num_draft_tokens], dtype=torch.int32, device=self.device))",
        # through a local only the copy reads: the local goes
        "lens = [self.speculative_num_draft_tokens] * bs\nx = f(torch.tensor(lens, dtype=torch.int32, device=self.device))",
        # a longer chain of locals, each read once: all go
        "lens = [self.speculative_num_draft_tokens] * bs\nq = lens\n\nqo = q\n"
        "x = f(torch.tensor(qo, dtype=torch.int32, device=self.device))",
    ],
)
def test_fork_shapes_the_list_inline_or_through_locals(body):
    state, out, after = run(d.DsaReplayVerifyLengthsOnDevice, _replay_verify(body))
    assert (state, after) == (State.TODO, State.DONE)
    assert f"x = f({FILL})" in out and "torch.tensor" not in out and "[self.speculative" not in out
    assert "lens =" not in out and "q =" not in out and "qo =" not in out


def test_a_local_read_elsewhere_stays_and_a_chain_is_followed_through_it():
    body = (
        "lens = [self.speculative_num_draft_tokens] * bs\nq = lens\n"
        "x = f(torch.tensor(q, dtype=torch.int32, device=self.device))\nmetadata.lens = lens"
    )
    state, out, after = run(d.DsaReplayVerifyLengthsOnDevice, _replay_verify(body))
    assert (state, after) == (State.TODO, State.DONE)
    assert f"x = f({FILL})" in out and "q = lens" not in out
    assert "lens = [self.speculative_num_draft_tokens] * bs" in out and "metadata.lens = lens" in out


#: sglang 0.5.15+'s replay: the lengths filled on the device by upstream.
UPSTREAM_FULL = """
# Fill the constant per-req qo lengths on-device; torch.tensor(list,
# device=cuda) does a pageable H2D copy that blocks the host.
extend_seq_lens = torch.full(
    (bs,),
    self.speculative_num_draft_tokens,
    dtype=torch.int32,
    device=self.device,
)
x = f(extend_seq_lens)
"""


def test_a_branch_already_filling_on_the_device_is_left_as_upstream_wrote_it():
    upstream = _replay_verify(UPSTREAM_FULL)
    assert_state(d.DsaReplayVerifyLengthsOnDevice, upstream, State.SUPERSEDED, "torch.full, 0.5.15+")
    fill = UPSTREAM_FULL[UPSTREAM_FULL.index("extend_seq_lens = torch.full(") : UPSTREAM_FULL.index("x = f(")]
    copy = "extend_seq_lens = torch.tensor([self.speculative_num_draft_tokens] * bs, dtype=torch.int32, device=self.device)\n"
    ours = run(d.DsaReplayVerifyLengthsOnDevice, _replay_verify(UPSTREAM_FULL.replace(fill, copy)))[1]
    assert "extend_seq_lens = torch.full((bs,), self.speculative_num_draft_tokens" in ours
    assert_state(d.DsaReplayVerifyLengthsOnDevice, ours, State.DONE)  # patchkit's own, by its comment


@pytest.mark.parametrize(
    ("body", "why"),
    [
        # a list patchkit cannot follow to [W] * n
        ("x = f(torch.tensor(self.q_lens(bs), dtype=torch.int32, device=self.device))", "left as it is"),
        ("lens = self.q_lens(bs)\nx = f(torch.tensor(lens, dtype=torch.int32, device=self.device))", "left as it is"),
        # the list changed in place before the copy
        (
            "lens = [self.speculative_num_draft_tokens] * bs\nlens[0] = 1\n"
            "x = f(torch.tensor(lens, dtype=torch.int32, device=self.device))",
            "left as it is",
        ),
        # the count rebound between the list and the copy: the fill would read another bs
        (
            "lens = [self.speculative_num_draft_tokens] * bs\nbs = bs * 2\n"
            "x = f(torch.tensor(lens, dtype=torch.int32, device=self.device))",
            "left as it is",
        ),
        # assigned in a nested block only, read after it
        (
            "if flag:\n    lens = [self.speculative_num_draft_tokens] * bs\n"
            "x = f(torch.tensor(lens, dtype=torch.int32, device=self.device))",
            "left as it is",
        ),
        # no dtype: torch.tensor([]) is float32, torch.full((0,), 4) int64
        ("x = f(torch.tensor([self.speculative_num_draft_tokens] * bs, device=self.device))", "left as it is"),
        # built on the host: no copy here
        ("x = f(torch.tensor([self.speculative_num_draft_tokens] * bs, dtype=torch.int32, device='cpu'))", "no tensor"),
    ],
)
def test_shapes_it_cannot_follow_are_left_alone_with_the_reason(body, why):
    fork = _replay_verify(body)
    finding = assert_state(d.DsaReplayVerifyLengthsOnDevice, fork, State.SUPERSEDED, why)  # never refused
    assert "\n" not in finding.detail


def test_verify_lengths_outside_verify_or_without_a_branch_or_in_a_shim():
    no_verify = _replay_verify("pass").replace("elif forward_mode.is_target_verify():", "else:")
    assert_state(d.DsaReplayVerifyLengthsOnDevice, no_verify, State.SUPERSEDED, "no `elif")
    combined = VERIFY.replace(
        "elif forward_batch.forward_mode.is_target_verify():",
        "elif forward_batch.forward_mode.is_target_verify() or forward_batch.forward_mode.is_draft_extend():",
    )
    assert detect(d.NsaVerifyLengthsOnDevice, combined).state is State.SUPERSEDED  # not its own branch: left
    for codemod in (*VERIFY_CODEMODS, d.DsaVerifyLengthsOnDevice):
        assert detect(codemod, SHIM).state is State.SUPERSEDED
    renamed = VERIFY.replace("NativeSparseAttnBackend", "DeepseekSparseAttnBackend")
    out, states = run_all([d.DsaVerifyLengthsOnDevice, d.DsaReplayVerifyLengthsOnDevice], renamed)
    assert states == [State.DONE, State.DONE] and EAGER_FULL in out and REPLAY_FULL in out
    assert detect(d.NsaVerifyLengthsOnDevice, renamed).state is State.MISSING  # no NSA class there


def test_0_5_7_to_0_5_9_verify_after_the_device_expansion_has_nothing_to_fill():
    assert_state(d.NsaVerifyLengthsOnDevice, HOST, State.SUPERSEDED, "builds no tensor from a host list")
    _, expanded, _ = run(d.NsaEagerExpandsOnDevice, HOST)
    assert_state(d.NsaVerifyLengthsOnDevice, expanded, State.SUPERSEDED, "builds no tensor from a host list")
