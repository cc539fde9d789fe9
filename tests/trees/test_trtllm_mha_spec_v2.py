"""trtllm-mha-spec-v2 (sglang #28106): snippets for every codemod, then the
real trees (0.5.10, 0.5.12.post1, 0.5.13 patched; 0.5.14+ native)."""

from __future__ import annotations

import json

import pytest
from support import snapshot

from patchkit.codemods import trtllm_mha_spec_v2 as mha
from patchkit.codemods.common.base import State
from patchkit.testing import apply, detect

MHA = "srt/layers/attention/trtllm_mha_backend.py"
PATCH = "trtllm-mha-spec-v2"

CLASSES = '''
class TRTLLMHAAttnBackend(FlashInferAttnBackend):
    """TRTLLM MHA attention kernel from flashinfer."""

    def init_forward_metadata_replay_cuda_graph(
        self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu
    ):
        seq_lens_cpu = seq_lens_cpu[:bs]
        if forward_mode.is_decode_or_idle():
            max_len = seq_lens_cpu.max().item()
            metadata.max_seq_len_k = max_len + self.speculative_step_id + 1
        elif forward_mode.is_target_verify():
            metadata.max_seq_len_k = (
                seq_lens_cpu.max().item() + self.speculative_num_draft_tokens
            )

    def init_forward_metadata(self, forward_batch):
        if forward_batch.forward_mode.is_decode_or_idle():
            metadata.max_seq_len_k = forward_batch.seq_lens_cpu.max().item()
        else:
            if any(
                forward_batch.extend_prefix_lens_cpu
            ) or forward_batch.forward_mode.is_draft_extend(include_v2=True):
                max_q = max(forward_batch.extend_seq_lens_cpu)


class TRTLLMHAAttnMultiStepDraftBackend(FlashInferMultiStepDraftBackend):
    """Multi-step TRTLLM MHA attention kernel used by EAGLE."""

    def __init__(self, model_runner, topk, speculative_num_steps):
        super().__init__(model_runner, topk, speculative_num_steps)
'''


def test_flags():
    out = apply(mha.BackendOptsOut, CLASSES)
    out = apply(mha.DraftWrapperOptsOut, out)
    assert out.count("    needs_cpu_seq_lens: bool = False\n") == 2
    assert "# Page tables use a static width without the CPU mirror" in out
    compile(out, "x.py", "exec")


def test_eager_and_replay_reads():
    out = apply(mha.EagerMetadataWithoutMirror, CLASSES)
    out = apply(mha.ReplayMetadataWithoutMirror, out)
    assert "seq_lens_cpu.max()" not in out
    assert "seq_lens_cpu = rows_or_none(seq_lens_cpu, bs)" in out
    assert "max_len = host_max_seq_len(seq_lens_cpu, self.max_context_len)" in out
    assert (
        "metadata.max_seq_len_k = host_max_seq_len(forward_batch.seq_lens_cpu, self.max_context_len, forward_batch)"
        in out
    )
    assert "any_host_lens(forward_batch.extend_prefix_lens_cpu)" in out
    assert "max_q = max_host_lens(forward_batch.extend_seq_lens_cpu, self.speculative_num_draft_tokens)" in out


def test_upstream_device_page_table_is_done():
    """0.5.14+: the class builds its page table on the device; the reads are gone."""
    upstream = CLASSES.replace(
        "    def init_forward_metadata(self, forward_batch):",
        "    def _fill_page_table_device(self, metadata, req_pool_indices, cache_seqlens):\n"
        "        build_trtllm_mha_page_table(req_to_token=self.req_to_token)\n\n"
        "    def init_forward_metadata(self, forward_batch):",
    )
    for codemod in (mha.EagerMetadataWithoutMirror, mha.ReplayMetadataWithoutMirror):
        finding = detect(codemod, upstream)
        assert finding.state is State.DONE and "device-side page table" in finding.detail


# -- real trees ----------------------------------------------------------------------------


def states(cli, tree) -> dict[str, dict]:
    result = cli("status", tree, PATCH, "--format", "json")
    assert result.exit_code == 0, result.output
    return {p["id"]: p for p in json.loads(result.output)["patches"]}


@pytest.mark.trees
@pytest.mark.parametrize("version", ["0.5.10", "0.5.12.post1", "0.5.13"])
def test_release_apply_verify_idempotent_and_exact_revert(make_tree, cli, version):
    tree = make_tree(version)
    before = snapshot(tree)
    assert states(cli, tree)[PATCH]["state"] == "absent"
    result = cli("apply", tree, PATCH)
    assert result.exit_code == 0, result.output
    text = (tree / MHA).read_text()
    compile(text, MHA, "exec")
    assert text.count("    needs_cpu_seq_lens: bool = False\n") == 2
    assert "seq_lens_cpu = rows_or_none(seq_lens_cpu, bs)" in text
    assert "host_max_seq_len(forward_batch.seq_lens_cpu, self.max_context_len, forward_batch)" in text
    assert "from sglang.srt._patchkit.backends.mirror_reads import" in text
    st = states(cli, tree)
    assert st[PATCH]["state"] == "applied"
    assert {st[r]["state"] for r in st[PATCH]["requires"]} <= {"applied", "native"}
    patched = snapshot(tree)
    assert cli("apply", tree, PATCH, "--check").exit_code == 0
    assert snapshot(tree) == patched
    assert cli("revert", tree).exit_code == 0
    assert snapshot(tree) == before


@pytest.mark.trees
def test_with_draft_extend_v2_on_the_same_methods(make_tree, cli):
    """trtllm-mha-draft-extend-v2 edits the same replay method: either order of
    revert leaves the other patch applied and exact."""
    tree = make_tree("0.5.12.post1")
    before = snapshot(tree)
    assert cli("apply", tree, PATCH, "trtllm-mha-draft-extend-v2").exit_code == 0
    both = (tree / MHA).read_text()
    assert "fill_draft_extend_v2_cu_seqlens_q" in both and "rows_or_none(seq_lens_cpu, bs)" in both
    assert cli("revert", tree, PATCH).exit_code == 0
    alone = (tree / MHA).read_text()
    assert "fill_draft_extend_v2_cu_seqlens_q" in alone and "rows_or_none" not in alone
    assert cli("apply", tree, PATCH).exit_code == 0
    assert (tree / MHA).read_text() == both
    assert cli("revert", tree).exit_code == 0
    assert snapshot(tree) == before


@pytest.mark.trees
@pytest.mark.parametrize("version", ["0.5.14", "0.5.15", "0.5.16", "0.5.23"])
def test_upstream_releases_are_native_and_untouched(make_tree, cli, version):
    tree = make_tree(version)
    before = snapshot(tree)
    assert states(cli, tree)[PATCH]["state"] == "native"
    assert cli("apply", tree, PATCH).exit_code == 0
    # 0.5.14 and 0.5.15 lack upstream's runner fix: the required
    # replay-no-stale-mirror is applied there, nothing of this patch.
    after = snapshot(tree)
    assert after[MHA] == before[MHA]
    if version in ("0.5.16", "0.5.23"):
        assert after == before
