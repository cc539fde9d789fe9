"""Snippet tests of tests/trees/test_replay_page_table.py (no release read; the quick loop runs them)."""

from __future__ import annotations

import pytest

from patchkit.backends import page_table as pt
from patchkit.codemods import fa3_spec_v2 as fa3
from patchkit.codemods import trtllm_mha_spec_v2 as mha
from patchkit.codemods.common.base import State
from patchkit.testing import apply, assert_codemod, detect

BEFORE = """
class TRTLLMHAAttnBackend:
    def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens, forward_mode):
        if forward_mode.is_target_verify():
            metadata = self.target_verify_metadata[bs]
            metadata.cache_seqlens_int32.copy_(seq_lens + self.speculative_num_draft_tokens)
            page_indices = self.req_to_token[
                req_pool_indices[:, None],
                self.strided_indices[:max_seq_pages],
            ]
            metadata.page_table[:, :max_seq_pages].copy_(page_indices // self.page_size)
            self._copy_swa_page_table(metadata, page_indices, max_seq_pages)
        self.forward_metadata = metadata
"""


AFTER = """
from sglang.srt._patchkit.backends.page_table import fill_page_table_rows
class TRTLLMHAAttnBackend:
    def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens, forward_mode):
        if forward_mode.is_target_verify():
            metadata = self.target_verify_metadata[bs]
            metadata.cache_seqlens_int32.copy_(seq_lens + self.speculative_num_draft_tokens)
            # patchkit trtllm-mha-spec-v2 (sglang #28106): the page table is built on
            # the device, each row up to its own cache_seqlens (all the kernels read),
            # not gathered as wide as the longest row (without the CPU mirror, the
            # static bound). Sliding-window tables are declined: they keep the gather.
            if not fill_page_table_rows(self.req_to_token, req_pool_indices, metadata.cache_seqlens_int32, metadata.page_table, self.page_size, metadata.swa_page_table):
                page_indices = self.req_to_token[
                    req_pool_indices[:, None],
                    self.strided_indices[:max_seq_pages],
                ]
                metadata.page_table[:, :max_seq_pages].copy_(page_indices // self.page_size)
                self._copy_swa_page_table(metadata, page_indices, max_seq_pages)
        self.forward_metadata = metadata
"""


def test_the_gather_becomes_the_device_build():
    assert_codemod(mha.ReplayPageTableOnDevice, BEFORE, AFTER)


def test_a_gather_before_the_lengths_are_written_is_left_alone():
    """The kernel stops at cache_seqlens: without a write of them earlier in the
    branch, they could be an earlier batch's."""
    src = BEFORE.replace(
        "            metadata.cache_seqlens_int32.copy_(seq_lens + self.speculative_num_draft_tokens)\n", ""
    )
    assert detect(mha.ReplayPageTableOnDevice, src).state is State.DONE


@pytest.mark.parametrize(
    "old, new",
    [
        # a fork's spellings: another local, rows without [:, None], a keyword copy, a cast
        ("page_indices", "pages"),
        ("req_pool_indices[:, None],", "req_pool_indices.unsqueeze(1),"),
        (".copy_(page_indices // self.page_size)", ".copy_(src=(page_indices // self.page_size).int())"),
    ],
)
def test_fork_spellings_of_the_gather(old, new):
    src = BEFORE.replace(old, new)
    out = apply(mha.ReplayPageTableOnDevice, src)
    assert "if not fill_page_table_rows(self.req_to_token, req_pool_indices, metadata.cache_seqlens_int32, " in out
    assert detect(mha.ReplayPageTableOnDevice, out).state is State.DONE
    compile(out, "x.py", "exec")


def test_fa3_keeps_upstreams_draft_extend_gather_once_verify_is_on_the_device():
    """0.5.16+: the verify tables are built on the device, the draft extend still
    gathers (upstream's newest form): done, untouched."""
    src = BEFORE.replace("class TRTLLMHAAttnBackend", "class FlashAttentionBackend").replace(
        "is_target_verify", "is_draft_extend_v2"
    )
    finding = detect(fa3.ReplayPageTableOnDevice, src)
    assert finding.state is State.DONE and "upstream" in finding.detail
    # With a verify gather left, the draft-extend one is carried along.
    both = src.replace(
        "        self.forward_metadata = metadata\n",
        BEFORE.split("        if forward_mode.is_target_verify():\n")[1]
        .split("        self.forward_metadata")[0]
        .replace("            ", "            ", 1)
        .join(["        elif forward_mode.is_target_verify():\n", ""])
        + "        self.forward_metadata = metadata\n",
    )
    out = apply(fa3.ReplayPageTableOnDevice, both)
    assert out.count("if not fill_page_table_rows(") == 2


torch = pytest.importorskip("torch")


class _NS:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def _run_replay(source: str, swa: bool):
    page_size, width = 4, 40
    req_to_token = torch.arange(6 * 160, dtype=torch.int32).reshape(6, 160)
    metadata = _NS(
        cache_seqlens_int32=torch.zeros(3, dtype=torch.int32),
        page_table=torch.full((3, width), -1, dtype=torch.int32),
        swa_page_table=torch.full((3, width), -1, dtype=torch.int32) if swa else None,
    )
    backend = _NS(
        target_verify_metadata={3: metadata},
        speculative_num_draft_tokens=4,
        req_to_token=req_to_token,
        strided_indices=torch.arange(0, 160, page_size),
        page_size=page_size,
        _copy_swa_page_table=lambda md, idx, n: (
            md.swa_page_table is None or md.swa_page_table[:, :n].copy_(idx // page_size + 1000)
        ),
    )
    namespace = {"fill_page_table_rows": pt.fill_page_table_rows, "max_seq_pages": width}
    body = source.split("from sglang.srt._patchkit.backends.page_table import fill_page_table_rows\n")[-1]
    exec(compile(body, "replay.py", "exec"), namespace)
    cls = namespace["TRTLLMHAAttnBackend"]
    mode = _NS(is_target_verify=lambda: True)
    cls.init_forward_metadata_replay_cuda_graph(backend, 3, torch.tensor([5, 0, 2]), torch.tensor([1, 20, 3]), mode)
    return metadata


@pytest.mark.parametrize("swa", [False, True])
def test_patched_replay_writes_what_the_kernels_read(swa):
    before, after = _run_replay(BEFORE, swa), _run_replay(AFTER, swa)
    assert torch.equal(before.cache_seqlens_int32, after.cache_seqlens_int32)
    for row, kv_len in enumerate(after.cache_seqlens_int32.tolist()):
        live = -(-kv_len // 4)
        assert torch.equal(after.page_table[row, :live], before.page_table[row, :live])
        if not swa:  # never read: no longer written
            assert (after.page_table[row, live:] == -1).all()
    if swa:  # declined: the gather, unchanged
        assert torch.equal(after.page_table, before.page_table)
        assert torch.equal(after.swa_page_table, before.swa_page_table)
