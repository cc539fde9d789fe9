"""flashinfer-mla-host-plan (sglang #27689) on the real releases: applied on
0.5.10 .. 0.5.12.post1 (apply, verify, a second apply changes nothing,
revert byte-exact), not applicable on 0.5.13 .. 0.5.17 with its one-line
reason, native on 0.5.18+ (whose eager verify and draft decode still plan from
the device: those two sites say so and are left)."""

from __future__ import annotations

import pytest
from support import class_section, patch_states, snapshot, verified_idempotent_reverted

PATCH = "flashinfer-mla-host-plan"
MLA = "srt/layers/attention/flashinfer_mla_backend.py"
RUNTIME = "srt/_patchkit/backends/flashinfer_mla.py"


@pytest.mark.trees
@pytest.mark.parametrize("version", ["0.5.10", "0.5.12.post1"])
def test_applied_verified_and_reverted_exactly(make_tree, cli, version):
    tree = make_tree(version)
    before = snapshot(tree)
    pristine = (tree / MLA).read_text()
    assert "verify_host_plan" not in pristine and "kv_indptr_cpu: Optional" not in pristine
    assert patch_states(cli, tree, PATCH)[PATCH]["state"] == "absent"
    result = cli("apply", tree, PATCH)
    assert result.exit_code == 0, result.output
    text = (tree / MLA).read_text()
    compile(text, MLA, "exec")  # valid Python (nothing written beside it)
    backend = class_section(text, "FlashInferMLAAttnBackend")
    assert backend.count("verify_wrapper.plan = partial(fast_mla_prefill_plan, verify_wrapper)") == 1
    assert backend.count("= verify_host_plan(") == 1 and backend.count("= draft_extend_host_plan(") == 1
    # the verify replay, the eager verify and the eager extend; the eager draft decode's wrapper
    assert backend.count("kv_len_arr_cpu=kv_len_arr_cpu,") == 3
    assert backend.count("= eager_verify_host_plan(forward_batch)") == 1
    assert backend.count("decode_wrapper=draft_decode_planned(self.decode_wrapper, forward_batch),") == 1
    updater = class_section(text, "FlashInferMLAIndicesUpdaterPrefill")
    assert updater.count("kv_indptr_cpu: Optional[torch.Tensor] = None,") == 2
    assert "kv_indptr if kv_indptr_cpu is None else kv_indptr_cpu," in updater
    assert (tree / RUNTIME).exists()
    verified_idempotent_reverted(cli, tree, PATCH, before)


@pytest.mark.trees
@pytest.mark.parametrize(
    "version, state",
    [("0.5.13", "not-applicable"), ("0.5.17", "not-applicable"), ("0.5.18", "native"), ("0.5.23", "native")],
)
def test_later_releases(make_tree, cli, version, state):
    tree = make_tree(version)
    report = patch_states(cli, tree, PATCH)[PATCH]
    assert report["state"] == state
    if state == "not-applicable":
        assert "not carried onto 0.5.13 .. 0.5.17" in report["reason"]
        assert "_apply_cuda_graph_metadata" in report["reason"]
    else:
        assert "draft_decode_planned" not in (tree / MLA).read_text()


@pytest.mark.trees
def test_flashinfer_keeps_the_mirror_in_a_tree_with_every_patch(make_tree, cli):
    """Its plans need the exact lengths (docs/research/flashinfer-spec-v2.md, item 2):
    no patch opts FlashInfer's backends out of the CPU seq_lens mirror."""
    tree = make_tree("0.5.12.post1")
    assert cli("apply", tree).exit_code == 0
    for rel, cls in [(MLA, "FlashInferMLAAttnBackend"), (MLA, "FlashInferMLAMultiStepDraftBackend")] + [
        ("srt/layers/attention/flashinfer_backend.py", c)
        for c in ("FlashInferAttnBackend", "FlashInferMultiStepDraftBackend")
    ]:
        assert "needs_cpu_seq_lens" not in class_section((tree / rel).read_text(), cls), cls
