"""flashinfer-mla-host-plan (sglang #27689) on snippets: each codemod turns
the 0.5.10 .. 0.5.12.post1 shape into the host-planned one, leaves
upstream's 0.5.18 shape alone (done), says in one line that 0.5.13 ..
0.5.17's shared capture/replay body is not carried, and refuses shapes it
cannot place its edit in."""

from __future__ import annotations

from patchkit.codemods import flashinfer_mla_host_plan as fmp
from patchkit.codemods.common.base import State
from patchkit.testing import apply, assert_codemod, assert_state, code, detect

IMPORT = "from sglang.srt._patchkit.backends.flashinfer_mla import {}\n"

CAPTURE = code("""
    from functools import partial


    class FlashInferMLAAttnBackend(AttentionBackend):
        def init_forward_metadata_capture_cuda_graph(self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info):
            if forward_mode.is_decode_or_idle():
                decode_wrapper = BatchMLAPagedAttentionWrapper(self.workspace_buffer, use_cuda_graph=True)
                decode_wrapper.plan = partial(fast_mla_decode_plan, decode_wrapper)
            elif forward_mode.is_target_verify():
                verify_wrapper = BatchMLAPagedAttentionWrapper(self.workspace_buffer, use_cuda_graph=True)
                self.indices_updater_prefill.update(req_pool_indices, seq_lens, 1, prefix_lens=None)
                self.prefill_cuda_graph_metadata[bs] = verify_wrapper
            else:
                raise ValueError("Invalid mode")
""")
CAPTURE_AFTER = code("""
    from functools import partial
    from sglang.srt._patchkit.backends.flashinfer_mla import fast_mla_prefill_plan


    class FlashInferMLAAttnBackend(AttentionBackend):
        def init_forward_metadata_capture_cuda_graph(self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info):
            if forward_mode.is_decode_or_idle():
                decode_wrapper = BatchMLAPagedAttentionWrapper(self.workspace_buffer, use_cuda_graph=True)
                decode_wrapper.plan = partial(fast_mla_decode_plan, decode_wrapper)
            elif forward_mode.is_target_verify():
                verify_wrapper = BatchMLAPagedAttentionWrapper(self.workspace_buffer, use_cuda_graph=True)
                self.indices_updater_prefill.update(req_pool_indices, seq_lens, 1, prefix_lens=None)
                self.prefill_cuda_graph_metadata[bs] = verify_wrapper
                # patchkit flashinfer-mla-host-plan (sglang #27689): its replays plan from host arrays,
                # without plan()'s three .to("cpu") waits (planned above: module built).
                verify_wrapper.plan = partial(fast_mla_prefill_plan, verify_wrapper)
            else:
                raise ValueError("Invalid mode")
""")


def test_the_verify_wrapper_replans_without_waits():
    assert_codemod(fmp.VerifyCaptureInstallsFastPlan, CAPTURE, CAPTURE_AFTER)


# 0.5.18+: capture and replay in one body, the fast plan installed there.
UPSTREAM_OUT_GRAPH = code("""
    class FlashInferMLAAttnBackend(AttentionBackend):
        def init_forward_metadata_out_graph(self, forward_batch, in_capture=False):
            if in_capture:
                prefill_wrapper = BatchMLAPagedAttentionWrapper(self.workspace_buffer)
                self._apply_cuda_graph_metadata(bs=bs, seq_lens_cpu=seq_lens_cpu)
                if forward_mode.is_target_verify():
                    prefill_wrapper.plan = partial(fast_mla_prefill_plan, prefill_wrapper)

        def _apply_cuda_graph_metadata(self, bs, seq_lens_cpu, spec_info, forward_mode):
            if forward_mode.is_decode_or_idle():
                pass
            elif forward_mode.is_target_verify():
                self.indices_updater_prefill.update(
                    req_pool_indices[:bs],
                    qo_indptr_cpu=self.fast_plan_qo_indptr_cpu[: bs + 1],
                    kv_indptr_cpu=self.fast_plan_kv_indptr_cpu[: bs + 1],
                    kv_len_arr_cpu=self.fast_plan_kv_len_arr_cpu[:bs],
                )
""")
# 0.5.13 .. 0.5.17: the same body without it.
SHARED_BODY = UPSTREAM_OUT_GRAPH.replace(
    "            if forward_mode.is_target_verify():\n"
    "                prefill_wrapper.plan = partial(fast_mla_prefill_plan, prefill_wrapper)\n",
    "",
).replace(
    "                qo_indptr_cpu=self.fast_plan_qo_indptr_cpu[: bs + 1],\n"
    "                kv_indptr_cpu=self.fast_plan_kv_indptr_cpu[: bs + 1],\n"
    "                kv_len_arr_cpu=self.fast_plan_kv_len_arr_cpu[:bs],\n",
    "",
)


def test_upstreams_shape_is_done_and_the_shared_body_is_not_carried():
    assert_state(fmp.VerifyCaptureInstallsFastPlan, UPSTREAM_OUT_GRAPH, State.DONE)
    assert_state(fmp.VerifyReplayHostPlan, UPSTREAM_OUT_GRAPH, State.DONE)
    finding = detect(fmp.VerifyCaptureInstallsFastPlan, SHARED_BODY)
    assert finding.state is State.SUPERSEDED and finding.moots_patch
    assert "not carried onto 0.5.13 .. 0.5.17" in finding.detail and "_apply_cuda_graph_metadata" in finding.detail
    replay = detect(fmp.VerifyReplayHostPlan, SHARED_BODY)
    assert replay.state is State.SUPERSEDED and not replay.moots_patch


def test_a_verify_branch_without_one_wrapper_is_refused():
    two = CAPTURE.replace(
        "            self.prefill_cuda_graph_metadata[bs] = verify_wrapper\n",
        "            other = BatchMLAPagedAttentionWrapper(self.workspace_buffer)\n"
        "            self.prefill_cuda_graph_metadata[bs] = verify_wrapper\n",
    )
    finding = detect(fmp.VerifyCaptureInstallsFastPlan, two)
    assert finding.state is State.MISSING and "one BatchMLAPagedAttentionWrapper" in finding.detail


REPLAY = code("""
    class FlashInferMLAAttnBackend(AttentionBackend):
        def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu):
            if forward_mode.is_decode_or_idle():
                assert seq_lens_cpu is not None
            elif forward_mode.is_target_verify():
                self.indices_updater_prefill.update(
                    req_pool_indices[:bs],
                    seq_lens[:bs],
                    seq_lens_sum,
                    prefix_lens=None,
                    spec_info=spec_info,
                )
            elif forward_mode.is_draft_extend():
                self.indices_updater_prefill.update(req_pool_indices[:bs], seq_lens[:bs], seq_lens_sum, prefix_lens=None)
""")
REPLAY_AFTER = IMPORT.format("verify_host_plan") + REPLAY.replace(
    "        elif forward_mode.is_target_verify():\n",
    "        elif forward_mode.is_target_verify():\n"
    "            # patchkit flashinfer-mla-host-plan (sglang #27689): the plan's arrays on the host, from\n"
    "            # the CPU mirror (None without it: the stock plan from the device).\n"
    "            qo_indptr_cpu, kv_indptr_cpu, kv_len_arr_cpu = verify_host_plan(\n"
    '                seq_lens_cpu, bs, getattr(spec_info, "draft_token_num", None)\n'
    "            )\n",
).replace(
    "                spec_info=spec_info,\n            )\n",
    "                spec_info=spec_info,\n"
    "                qo_indptr_cpu=qo_indptr_cpu,\n"
    "                kv_indptr_cpu=kv_indptr_cpu,\n"
    "                kv_len_arr_cpu=kv_len_arr_cpu,\n"
    "            )\n",
)


def test_the_verify_replay_hands_over_host_arrays_and_leaves_the_draft_extend():
    assert_codemod(fmp.VerifyReplayHostPlan, REPLAY, REPLAY_AFTER)


EAGER = code("""
    class FlashInferMLAAttnBackend(AttentionBackend):
        def init_forward_metadata(self, forward_batch):
            if forward_batch.forward_mode.is_decode_or_idle():
                self.indices_updater_decode.update(forward_batch.req_pool_indices)
            elif forward_batch.forward_mode.is_target_verify():
                self.indices_updater_prefill.update(forward_batch.req_pool_indices, use_ragged=False)
            else:
                prefix_lens = forward_batch.extend_prefix_lens
                use_ragged = not any(forward_batch.extend_prefix_lens_cpu)

                self.indices_updater_prefill.update(
                    forward_batch.req_pool_indices,
                    prefix_lens,
                    use_ragged=use_ragged,
                )
""")


def test_the_eager_draft_extend_hands_over_host_arrays():
    out = apply(fmp.EagerDraftExtendHostPlan, EAGER)
    assert IMPORT.format("draft_extend_host_plan") in out
    assert (
        "            qo_indptr_cpu, kv_indptr_cpu, kv_len_arr_cpu = draft_extend_host_plan(forward_batch, use_ragged)\n"
        "\n"
        "            self.indices_updater_prefill.update(\n"
    ) in out
    assert out.count("kv_indptr_cpu=kv_indptr_cpu,") == 1  # the verify branch's update is not this one
    assert_state(fmp.EagerDraftExtendHostPlan, out, State.DONE)
    no_branch = EAGER.replace("            use_ragged = not any(forward_batch.extend_prefix_lens_cpu)\n", "")
    assert detect(fmp.EagerDraftExtendHostPlan, no_branch).state is State.MISSING


UPDATER = code("""
    class FlashInferMLAIndicesUpdaterPrefill:
        def update(
            self,
            req_pool_indices,
            seq_lens,
            spec_info: Optional[SpecInput] = None,
        ):
            self.call_begin_forward(
                req_pool_indices,
                seq_lens,
                spec_info,
            )

        def call_begin_forward(
            self,
            wrapper_paged,
            qo_indptr,
            kv_indptr,
            kv_indices,
            spec_info: Optional[SpecInput] = None,
        ):
            kv_len_arr = kv_indptr[1:] - kv_indptr[:-1]
            wrapper_paged.plan(
                qo_indptr,
                kv_indptr,
                kv_indices,
                kv_len_arr,
                self.num_local_heads,
            )
""")
PARAMS = (
    "        spec_info: Optional[SpecInput] = None,\n"
    "        qo_indptr_cpu: Optional[torch.Tensor] = None,\n"
    "        kv_indptr_cpu: Optional[torch.Tensor] = None,\n"
    "        kv_len_arr_cpu: Optional[torch.Tensor] = None,\n"
)


def test_the_updater_takes_and_hands_on_the_host_arrays():
    out = apply(fmp.PrefillUpdaterTakesHostPlan, UPDATER)
    assert out.count(PARAMS) == 1
    assert (
        "            spec_info,\n"
        "            qo_indptr_cpu=qo_indptr_cpu,\n"
        "            kv_indptr_cpu=kv_indptr_cpu,\n"
        "            kv_len_arr_cpu=kv_len_arr_cpu,\n"
        "        )\n"
    ) in out


def test_the_paged_plan_is_fed_the_host_arrays_when_given():
    out = apply(fmp.PrefillPlanFromHost, UPDATER)
    assert out.count(PARAMS) == 1
    assert "kv_len_arr = kv_indptr[1:] - kv_indptr[:-1] if kv_len_arr_cpu is None else kv_len_arr_cpu\n" in out
    assert (
        "            qo_indptr if qo_indptr_cpu is None else qo_indptr_cpu,\n"
        "            kv_indptr if kv_indptr_cpu is None else kv_indptr_cpu,\n"
        "            kv_indices,\n"
    ) in out


def test_upstreams_keyword_only_parameters_are_done_and_a_star_signature_is_refused():
    upstream = UPDATER.replace(
        "        spec_info: Optional[SpecInput] = None,\n    ):\n        kv_len_arr",
        "        spec_info: Optional[SpecInput] = None,\n"
        "        *,\n"
        "        qo_indptr_cpu=None,\n"
        "        kv_indptr_cpu=None,\n"
        "        kv_len_arr_cpu=None,\n"
        "    ):\n"
        "        kv_len_arr",
    )
    assert_state(fmp.PrefillPlanFromHost, upstream, State.DONE)
    starred = UPDATER.replace(
        "        spec_info: Optional[SpecInput] = None,\n    ):\n        self.call",
        "        **kwargs,\n    ):\n        self.call",
    )
    finding = detect(fmp.PrefillUpdaterTakesHostPlan, starred)
    assert finding.state is State.MISSING and "star parameters" in finding.detail


# Past upstream: the eager verify and the eager draft decode (2026-11-28g: 9 waits a step).
EAGER_SITES = code("""
    class FlashInferMLAAttnBackend(AttentionBackend):
        def init_forward_metadata(self, forward_batch):
            if forward_batch.forward_mode.is_decode_or_idle():
                self.indices_updater_decode.update(
                    forward_batch.req_pool_indices,
                    decode_wrapper=self.decode_wrapper,
                    init_metadata_replay=False,
                )
            elif forward_batch.forward_mode.is_target_verify():
                wrapper = self.prefill_wrapper_verify
                self.indices_updater_prefill.update(
                    forward_batch.req_pool_indices,
                    prefill_wrapper_paged=wrapper,
                    spec_info=forward_batch.spec_info,
                )
""")


def test_the_eager_verify_hands_over_host_arrays():
    out = apply(fmp.EagerVerifyHostPlan, EAGER_SITES)
    assert IMPORT.format("eager_verify_host_plan") in out
    assert (
        "            wrapper = self.prefill_wrapper_verify\n"
        "            # patchkit flashinfer-mla-host-plan: an eager verify plans from the mirror's host arrays\n"
        "            # too (None without it: the stock plan); upstream copies them to the host.\n"
        "            qo_indptr_cpu, kv_indptr_cpu, kv_len_arr_cpu = eager_verify_host_plan(forward_batch)\n"
        "            self.indices_updater_prefill.update(\n"
    ) in out
    assert "                spec_info=forward_batch.spec_info,\n                qo_indptr_cpu=qo_indptr_cpu,\n" in out
    assert "decode_wrapper=self.decode_wrapper," in out  # the decode branch is the other codemod's
    assert_state(fmp.EagerVerifyHostPlan, out, State.DONE)


def test_the_eager_draft_decode_plans_through_a_host_planned_wrapper():
    out = apply(fmp.EagerDraftDecodeHostPlan, EAGER_SITES)
    assert IMPORT.format("draft_decode_planned") in out
    assert "                decode_wrapper=draft_decode_planned(self.decode_wrapper, forward_batch),\n" in out
    assert "eager_verify_host_plan" not in out
    assert_state(fmp.EagerDraftDecodeHostPlan, out, State.DONE)


def test_upstreams_eager_sites_and_a_fork_without_them_are_left_as_they_are():
    upstream = EAGER_SITES + "            self.fast_plan_qo_indptr_cpu[: bs + 1] = qo\n"
    for codemod in (fmp.EagerVerifyHostPlan, fmp.EagerDraftDecodeHostPlan):
        finding = detect(codemod, upstream)
        assert finding.state is State.SUPERSEDED and not finding.moots_patch
        assert "0.5.18+ plans its eager" in finding.detail
    # a fork whose decode branch names no wrapper, whose verify branch updates twice
    fork = EAGER_SITES.replace("                decode_wrapper=self.decode_wrapper,\n", "").replace(
        "            wrapper = self.prefill_wrapper_verify\n",
        "            self.indices_updater_prefill.update(forward_batch.req_pool_indices)\n",
    )
    for codemod, what in ((fmp.EagerVerifyHostPlan, "verify"), (fmp.EagerDraftDecodeHostPlan, "draft decode")):
        finding = detect(codemod, fork)
        assert (
            finding.state is State.SUPERSEDED
            and f"no eager {'target ' * (what == 'verify')}{what} site" in finding.detail
        )
    # a fork whose decode update hands over spec_info: the draft's arrays, not the mirror's
    spec = EAGER_SITES.replace(
        "                init_metadata_replay=False,\n",
        "                init_metadata_replay=False,\n                spec_info=forward_batch.spec_info,\n",
    )
    assert detect(fmp.EagerDraftDecodeHostPlan, spec).state is State.SUPERSEDED
    # one keyword more of a fork's own is no spec_info: still carried
    extra = EAGER_SITES.replace(
        "init_metadata_replay=False,\n", "init_metadata_replay=False,\n                trace=True,\n"
    )
    assert detect(fmp.EagerDraftDecodeHostPlan, extra).state is State.TODO
    # a fork that already hands the verify host arrays of its own
    own = EAGER_SITES.replace(
        "                spec_info=forward_batch.spec_info,\n",
        "                spec_info=forward_batch.spec_info,\n                kv_indptr_cpu=self.my_host_indptr,\n",
    )
    assert_state(fmp.EagerVerifyHostPlan, own, State.DONE)
