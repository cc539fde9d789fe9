"""flashinfer-host-indptr (issue 71) on snippets: each codemod turns the
0.5.4.post3 .. 0.5.12.post1 shape into the host-planned one, is done on its
own output, and refuses shapes it cannot place its edit in; 0.5.13+'s
missing replay method moots the patch in one line."""

from __future__ import annotations

from patchkit.codemods import flashinfer_host_indptr as fhi
from patchkit.codemods.common.base import State
from patchkit.testing import apply, assert_state, code, detect

IMPORT = "from sglang.srt._patchkit.backends.flashinfer_host_indptr import {}\n"

BACKEND = code("""
    class FlashInferAttnBackend(AttentionBackend):
        def init_forward_metadata(self, forward_batch):
            if forward_batch.forward_mode.is_decode_or_idle():
                self.indices_updater_decode.update(forward_batch.req_pool_indices)
            elif forward_batch.forward_mode.is_target_verify():
                self.indices_updater_prefill.update(
                    forward_batch.req_pool_indices,
                    use_ragged=False,
                    spec_info=forward_batch.spec_info,
                )
            else:
                if self.is_multimodal:
                    use_ragged = False
                else:
                    use_ragged = not self.enable_deterministic

                self.indices_updater_prefill.update(
                    forward_batch.req_pool_indices,
                    use_ragged=use_ragged,
                    spec_info=None,
                )

        def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu):
            if forward_mode.is_target_verify():
                self.indices_updater_prefill.update(req_pool_indices[:bs], use_ragged=False, spec_info=spec_info)
            elif forward_mode.is_draft_extend():
                self.indices_updater_prefill.update(req_pool_indices[:bs], use_ragged=False, spec_info=spec_info)
""")


def test_the_eager_verify_hands_over_a_host_plan():
    out = apply(fhi.EagerVerifyHostPlan, BACKEND)
    assert out.startswith(IMPORT.format("verify_host_plan"))
    assert (
        "            host_plan = verify_host_plan(self, forward_batch.spec_info, forward_batch.seq_lens_cpu, "
        "forward_batch.batch_size, forward_batch.seq_lens_sum)\n"
        "            self.indices_updater_prefill.update(\n"
    ) in out
    assert out.count("host_plan=host_plan") == 1  # the extend branch's update is another codemod's
    assert "spec_info=forward_batch.spec_info,\n                host_plan=host_plan,\n            )" in out


def test_the_verify_replay_hands_over_a_host_plan_and_leaves_the_draft_extend():
    out = apply(fhi.VerifyReplayHostPlan, BACKEND)
    assert "host_plan = verify_host_plan(self, spec_info, seq_lens_cpu, bs, seq_lens_sum)\n" in out
    assert "use_ragged=False, spec_info=spec_info, host_plan=host_plan)\n        elif" in out
    assert out.count("host_plan=host_plan") == 1


def test_the_eager_draft_extend_hands_over_a_host_plan():
    out = apply(fhi.EagerDraftExtendHostPlan, BACKEND)
    assert (
        "            host_plan = draft_extend_host_plan(self, forward_batch, use_ragged)\n"
        "\n"
        "            self.indices_updater_prefill.update(\n"
    ) in out
    assert "spec_info=None,\n                host_plan=host_plan,\n" in out
    no_decision = BACKEND.replace("use_ragged = not self.enable_deterministic", "pass").replace(
        "use_ragged = False", "pass"
    )
    assert detect(fhi.EagerDraftExtendHostPlan, no_decision).state is State.MISSING


def test_0513s_missing_replay_method_moots_the_patch():
    later = BACKEND.replace("def init_forward_metadata_replay_cuda_graph(", "def _apply_cuda_graph_metadata(")
    finding = detect(fhi.VerifyReplayHostPlan, later)
    assert finding.state is State.SUPERSEDED and finding.moots_patch
    assert "not carried onto 0.5.13+" in finding.detail and "SGLANG_OPT_FLASHINFER_VERIFY_HOST_PLAN" in finding.detail


PREFILL = code("""
    class FlashInferIndicesUpdaterPrefill:
        def update(self, req_pool_indices, seq_lens, prefix_lens, use_ragged, spec_info):
            raise NotImplementedError()

        def update_single_wrapper(self, req_pool_indices, seq_lens, prefix_lens, use_ragged, spec_info):
            if use_ragged:
                paged_kernel_lens = prefix_lens
                paged_kernel_lens_sum = paged_kernel_lens.sum().item()
            self.call_begin_forward(self.prefill_wrapper_ragged, req_pool_indices, spec_info)

        def update_sliding_window(self, req_pool_indices, seq_lens, prefix_lens, use_ragged, spec_info):
            self.call_begin_forward(self.prefill_wrapper_ragged, req_pool_indices, spec_info)

        def call_begin_forward(self, wrapper_ragged, wrapper_paged, qo_indptr, kv_indptr):
            if use_ragged:
                wrapper_ragged.begin_forward(qo_indptr, qo_indptr, self.num_qo_heads)
            wrapper_paged.begin_forward(qo_indptr, kv_indptr, kv_indices, self.kv_last_page_len[:bs], custom_mask=m)
""")


def test_every_update_takes_host_plan_and_the_single_wrapper_hands_it_on():
    out = apply(fhi.PrefillUpdaterTakesHostPlan, PREFILL)
    assert out.count("use_ragged, spec_info, host_plan=None):") == 3
    assert (
        out.count(
            "self.call_begin_forward(self.prefill_wrapper_ragged, req_pool_indices, spec_info, host_plan=host_plan)"
        )
        == 1
    )
    starred = PREFILL.replace(
        "def update_sliding_window(self, req_pool_indices,", "def update_sliding_window(self, *args,"
    )
    assert detect(fhi.PrefillUpdaterTakesHostPlan, starred).state is State.MISSING


def test_the_ragged_sum_reads_the_host_plan():
    out = apply(fhi.RaggedSumFromHostPlan, PREFILL)
    assert (
        "paged_kernel_lens_sum = host_plan.kv_len_sum if host_plan is not None else paged_kernel_lens.sum().item()\n"
    ) in out


def test_both_wrappers_plan_from_the_host_plan():
    out = apply(fhi.PrefillPlanFromHost, PREFILL)
    assert out.startswith(IMPORT.format("paged_plan_from_host, ragged_plan_from_host"))
    assert "def call_begin_forward(self, wrapper_ragged, wrapper_paged, qo_indptr, kv_indptr, host_plan=None):" in out
    assert "ragged_plan_from_host(wrapper_ragged, host_plan)(qo_indptr, qo_indptr, self.num_qo_heads)" in out
    assert "paged_plan_from_host(wrapper_paged, host_plan)(qo_indptr, kv_indptr, kv_indices," in out
    two = PREFILL.replace(
        "    wrapper_paged.begin_forward(", "    wrapper_paged.begin_forward(x)\n        wrapper_paged.begin_forward("
    )
    assert detect(fhi.PrefillPlanFromHost, two).state is State.MISSING


DRAFT = code("""
    class FlashInferMultiStepDraftBackend:
        def common_template(self, forward_batch, kv_indices_buffer, call_fn):
            bs = self.topk * forward_batch.batch_size
            # Copy the kv_indptr once to avoid multiple device-to-host copies in flashinfer's plan.
            indptr_cpu_whole = self.kv_indptr[:, : bs + 1].cpu()
            global global_override_indptr_cpu
""")
DRAFT_AFTER = IMPORT.format("draft_host_indptr") + DRAFT.replace(
    "        indptr_cpu_whole = self.kv_indptr[:, : bs + 1].cpu()\n",
    "        # patchkit flashinfer-host-indptr (issue 71): built on the host from the mirror and the\n"
    "        # draft's positions, as the kernel wrote it; the device copy only without them.\n"
    "        indptr_cpu_whole = draft_host_indptr(forward_batch, self.topk, self.speculative_num_steps)\n"
    "        if indptr_cpu_whole is None:\n"
    "            indptr_cpu_whole = self.kv_indptr[:, : bs + 1].cpu()\n",
)


def test_the_draft_indptr_is_built_on_the_host_with_the_copy_as_fallback():
    assert apply(fhi.DraftIndptrFromMirror, DRAFT) == DRAFT_AFTER
    upstream = DRAFT.replace("self.kv_indptr[:, : bs + 1].cpu()", "_build_draft_indptr_host(lens, self.topk, n)")
    assert_state(fhi.DraftIndptrFromMirror, upstream, State.DONE)
    nested = DRAFT.replace("        indptr_cpu_whole =", "        if x:\n            indptr_cpu_whole =")
    assert detect(fhi.DraftIndptrFromMirror, nested).state is State.MISSING


DECODE = code("""
    class FlashInferIndicesUpdaterDecode:
        def call_begin_forward(self, wrapper, kv_indptr, kv_indices, bs, seq_lens_cpu):
            global global_override_indptr_cpu
            locally_override = False
            if wrapper_uses_fast_decode_plan:
                wrapper.begin_forward(kv_indptr, kv_indices, global_override_indptr_cpu=global_override_indptr_cpu)
            else:
                # When using original begin_forward, don't pass global_override_indptr_cpu
                wrapper.begin_forward(kv_indptr, kv_indices, self.kv_last_page_len[:bs], 1)
""")


def test_the_stock_decode_plan_is_fed_the_drafts_host_indptr():
    out = apply(fhi.DraftDecodePlanFromHost, DECODE)
    assert (
        "            # When using original begin_forward, don't pass global_override_indptr_cpu\n"
        "            # patchkit flashinfer-host-indptr (issue 71): the multi-step draft's override is the\n"
        "            # host copy of kv_indptr: plan from it.\n"
        "            decode_plan_from_host(wrapper, None if locally_override else global_override_indptr_cpu)"
        "(kv_indptr, kv_indices, self.kv_last_page_len[:bs], 1)\n"
    ) in out
    assert "wrapper.begin_forward(kv_indptr, kv_indices, global_override_indptr_cpu=" in out  # the fast plan's call
    no_override = DECODE.replace("locally_override = False", "pass")
    assert detect(fhi.DraftDecodePlanFromHost, no_override).state is State.MISSING
