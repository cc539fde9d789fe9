"""flashinfer-host-indptr (issue 71) on the real releases: applied on 0.5.10
and 0.5.12.post1 (apply, verify, a second apply changes nothing, revert
byte-exact), not applicable on 0.5.13+ with its one-line reason."""

from __future__ import annotations

import pytest
from support import class_section, patch_states, snapshot, verified_idempotent_reverted

PATCH = "flashinfer-host-indptr"
MHA = "srt/layers/attention/flashinfer_backend.py"
RUNTIME = "srt/_patchkit/backends/flashinfer_host_indptr.py"


@pytest.mark.trees
@pytest.mark.parametrize("version", ["0.5.10", "0.5.12.post1"])
def test_applied_verified_and_reverted_exactly(make_tree, cli, version):
    tree = make_tree(version)
    before = snapshot(tree)
    assert "host_plan" not in (tree / MHA).read_text()
    assert patch_states(cli, tree, PATCH)[PATCH]["state"] == "absent"
    result = cli("apply", tree, PATCH)
    assert result.exit_code == 0, result.output
    text = (tree / MHA).read_text()
    compile(text, MHA, "exec")
    backend = class_section(text, "FlashInferAttnBackend")
    assert backend.count("= verify_host_plan(") == 2 and backend.count("= draft_extend_host_plan(") == 1
    assert backend.count("host_plan=host_plan,") == 3  # eager verify, verify replay, eager extend
    prefill = class_section(text, "FlashInferIndicesUpdaterPrefill")
    assert prefill.count("host_plan=None,") == 5 and prefill.count("host_plan=host_plan,") == 1
    assert "host_plan.kv_len_sum if host_plan is not None else paged_kernel_lens.sum().item()" in prefill
    assert "ragged_plan_from_host(wrapper_ragged, host_plan)(" in prefill
    assert "paged_plan_from_host(wrapper_paged, host_plan)(" in prefill
    decode = class_section(text, "FlashInferIndicesUpdaterDecode")
    assert "decode_plan_from_host(wrapper, None if locally_override else global_override_indptr_cpu)(" in decode
    draft = class_section(text, "FlashInferMultiStepDraftBackend")
    assert "indptr_cpu_whole = draft_host_indptr(forward_batch, self.topk, self.speculative_num_steps)" in draft
    assert "    indptr_cpu_whole = self.kv_indptr[:, : bs + 1].cpu()" in draft  # the fallback
    assert (tree / RUNTIME).exists()
    verified_idempotent_reverted(cli, tree, PATCH, before)


@pytest.mark.trees
@pytest.mark.parametrize("version", ["0.5.13", "0.5.23"])
def test_later_releases_are_not_carried(make_tree, cli, version):
    report = patch_states(cli, make_tree(version), PATCH)[PATCH]
    assert report["state"] == "not-applicable"
    assert "not carried onto 0.5.13+" in report["reason"]
    assert "SGLANG_OPT_FLASHINFER_DRAFT_HOST_INDPTR" in report["reason"]
