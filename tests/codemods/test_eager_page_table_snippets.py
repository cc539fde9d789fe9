"""Snippet tests of tests/trees/test_eager_page_table.py (no release read; the quick loop runs them)."""

from __future__ import annotations

import pytest

from patchkit.backends import page_table as pt
from patchkit.codemods import trtllm_mha_spec_v2 as mha
from patchkit.codemods.common.base import State
from patchkit.testing import apply, assert_codemod, assert_state, detect

EAGER = mha.EagerPageTableOnDevice


BEFORE = """
class TRTLLMHAAttnBackend:
    def _maybe_translate_swa(self, token_indices):
        if not self.use_sliding_window_kv_pool:
            return None
        return self._swa_kv_pool.translate_loc_from_full_to_swa(token_indices)

    def init_forward_metadata(self, forward_batch):
        metadata = TRTLLMMHAMetadata()

        if forward_batch.forward_mode.is_decode_or_idle():
            metadata.cache_seqlens_int32 = forward_batch.seq_lens.to(torch.int32)
            metadata.max_seq_len_k = host_max_seq_len(forward_batch.seq_lens_cpu, self.max_context_len, forward_batch)
            metadata.page_table = forward_batch.req_to_token_pool.req_to_token[
                forward_batch.req_pool_indices, : metadata.max_seq_len_k
            ]
        else:
            metadata.cache_seqlens_int32 = (forward_batch.seq_lens + 4).to(torch.int32)
            metadata.max_seq_len_k = host_max_seq_len(forward_batch.seq_lens_cpu, self.max_context_len, forward_batch) + 4
            metadata.page_table = forward_batch.req_to_token_pool.req_to_token[
                forward_batch.req_pool_indices, : metadata.max_seq_len_k
            ]

        # Compute SWA page table (None for non-SWA models)
        metadata.swa_page_table = self._maybe_translate_swa(metadata.page_table)

        # Convert the page tables to a strided format
        if self.page_size > 1:
            self.strided_indices = torch.arange(0, metadata.page_table.shape[1], self.page_size)
            metadata.page_table = metadata.page_table[:, self.strided_indices] // self.page_size
            if metadata.swa_page_table is not None:
                metadata.swa_page_table = metadata.swa_page_table[:, self.strided_indices] // self.page_size

        self.forward_metadata = metadata
"""


AFTER = """
from sglang.srt._patchkit.backends.page_table import eager_page_table
class TRTLLMHAAttnBackend:
    def _maybe_translate_swa(self, token_indices):
        if not self.use_sliding_window_kv_pool:
            return None
        return self._swa_kv_pool.translate_loc_from_full_to_swa(token_indices)

    def init_forward_metadata(self, forward_batch):
        metadata = TRTLLMMHAMetadata()

        # patchkit trtllm-mha-spec-v2 (sglang #28106): the page table is built on
        # the device after the branches, each row up to its own cache_seqlens (all
        # the kernels read), not gathered as wide as the longest row (without the CPU
        # mirror, the static bound) and strided. Sliding-window backends keep the gather.
        page_table_on_device = not self.use_sliding_window_kv_pool
        if forward_batch.forward_mode.is_decode_or_idle():
            metadata.cache_seqlens_int32 = forward_batch.seq_lens.to(torch.int32)
            metadata.max_seq_len_k = host_max_seq_len(forward_batch.seq_lens_cpu, self.max_context_len, forward_batch)
            if not page_table_on_device:
                metadata.page_table = forward_batch.req_to_token_pool.req_to_token[
                    forward_batch.req_pool_indices, : metadata.max_seq_len_k
                ]
        else:
            metadata.cache_seqlens_int32 = (forward_batch.seq_lens + 4).to(torch.int32)
            metadata.max_seq_len_k = host_max_seq_len(forward_batch.seq_lens_cpu, self.max_context_len, forward_batch) + 4
            if not page_table_on_device:
                metadata.page_table = forward_batch.req_to_token_pool.req_to_token[
                    forward_batch.req_pool_indices, : metadata.max_seq_len_k
                ]

        if page_table_on_device:
            metadata.page_table = eager_page_table(forward_batch.req_to_token_pool.req_to_token, forward_batch.req_pool_indices, metadata.cache_seqlens_int32, self.page_size)

        # Compute SWA page table (None for non-SWA models)
        metadata.swa_page_table = self._maybe_translate_swa(metadata.page_table)

        # Convert the page tables to a strided format
        if not page_table_on_device:
            if self.page_size > 1:
                self.strided_indices = torch.arange(0, metadata.page_table.shape[1], self.page_size)
                metadata.page_table = metadata.page_table[:, self.strided_indices] // self.page_size
                if metadata.swa_page_table is not None:
                    metadata.swa_page_table = metadata.swa_page_table[:, self.strided_indices] // self.page_size

        self.forward_metadata = metadata
"""


def test_the_gathers_become_one_device_build():
    assert_codemod(EAGER, BEFORE, AFTER)


def test_0513s_switch_and_pool_spelling():
    """0.5.13: the translator tests ``self._swa_kv_pool is None`` and the
    gathers read ``self.req_to_token_pool``: the flag is that test, the build
    reads that pool."""
    src = BEFORE.replace("if not self.use_sliding_window_kv_pool:", "if self._swa_kv_pool is None:").replace(
        "forward_batch.req_to_token_pool.req_to_token[", "self.req_to_token_pool.req_to_token["
    )
    out = apply(EAGER, src)
    assert "        page_table_on_device = self._swa_kv_pool is None\n" in out
    assert "eager_page_table(self.req_to_token_pool.req_to_token, forward_batch.req_pool_indices, " in out
    compile(out, "x.py", "exec")


def test_a_release_without_sliding_window_tables():
    """0.5.4.post3 - 0.5.6.post2: no SWA translation: always on the device."""
    src = BEFORE.replace(
        "        # Compute SWA page table (None for non-SWA models)\n"
        "        metadata.swa_page_table = self._maybe_translate_swa(metadata.page_table)\n\n",
        "",
    )
    out = apply(EAGER, src)
    assert "        page_table_on_device = True\n" in out
    assert "# (No sliding-window pool in this release: the gathers are never run.)" in out


def test_a_gather_before_the_lengths_is_left_alone():
    """The build stops at cache_seqlens: a branch that gathers before writing
    them is not the shape this change knows."""
    src = BEFORE.replace(
        "            metadata.cache_seqlens_int32 = forward_batch.seq_lens.to(torch.int32)\n", ""
    ).replace("            metadata.cache_seqlens_int32 = (forward_batch.seq_lens + 4).to(torch.int32)\n", "")
    assert_state(EAGER, src, State.DONE, "no eager page-table gather")


@pytest.mark.parametrize(
    "old, new, why",
    [
        (
            "forward_batch.req_pool_indices, : metadata.max_seq_len_k\n            ]\n\n",
            "forward_batch.req_pool_indices[:1], : metadata.max_seq_len_k\n            ]\n\n",
            "different rows or pools",
        ),
        (
            "        # Compute SWA page table",
            "        self.log(metadata.page_table)\n        # Compute SWA page table",
            "a read of the token-level page table before it is strided",
        ),
        (
            "        if not self.use_sliding_window_kv_pool:\n",
            "        if token_indices is None:\n",
            "a sliding-window translator (_maybe_translate_swa)",
        ),
    ],
)
def test_shapes_it_does_not_know_are_missing_in_one_line(old, new, why):
    assert old in BEFORE
    finding = assert_state(EAGER, BEFORE.replace(old, new), State.MISSING, why)
    assert "\n" not in finding.detail


def test_upstreams_device_build_is_done():
    """0.5.14+: upstream builds the eager table itself (_fill_page_table_device)."""
    src = BEFORE.replace(
        "    def init_forward_metadata(self, forward_batch):",
        "    def _fill_page_table_device(self, metadata, req_pool_indices, cache_seqlens):\n"
        "        pass\n\n"
        "    def init_forward_metadata(self, forward_batch):",
    )
    finding = detect(EAGER, src)
    assert finding.state is State.DONE and "device-side page table" in finding.detail


torch = pytest.importorskip("torch")


class _NS:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class _Metadata:
    swa_page_table = None


def _run_eager(source: str, page_size: int, swa: bool, decode: bool):
    req_to_token = torch.arange(6 * 70, dtype=torch.int32).reshape(6, 70)
    body = source.split("from sglang.srt._patchkit.backends.page_table import eager_page_table\n")[-1]
    namespace = {
        "eager_page_table": pt.eager_page_table,
        "torch": torch,
        "TRTLLMMHAMetadata": _Metadata,
        "host_max_seq_len": lambda cpu, bound, batch=None: bound if cpu is None else int(cpu.max()),
    }
    exec(compile(body, "eager.py", "exec"), namespace)
    backend = _NS(
        use_sliding_window_kv_pool=swa,
        page_size=page_size,
        max_context_len=64,
        _swa_kv_pool=_NS(translate_loc_from_full_to_swa=lambda t: t + 5000),
    )
    cls = namespace["TRTLLMHAAttnBackend"]
    backend._maybe_translate_swa = lambda t: cls._maybe_translate_swa(backend, t)
    batch = _NS(
        forward_mode=_NS(is_decode_or_idle=lambda: decode),
        seq_lens=torch.tensor([3, 17, 9]),
        seq_lens_cpu=None,
        req_pool_indices=torch.tensor([4, 0, 2]),
        req_to_token_pool=_NS(req_to_token=req_to_token),
    )
    cls.init_forward_metadata(backend, batch)
    return backend.forward_metadata


@pytest.mark.parametrize("decode", [True, False])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("swa", [False, True])
def test_patched_eager_reads_what_pristine_gave(page_size, swa, decode):
    before, after = _run_eager(BEFORE, page_size, swa, decode), _run_eager(AFTER, page_size, swa, decode)
    assert torch.equal(before.cache_seqlens_int32, after.cache_seqlens_int32)
    if swa:  # declined: the gather, the translation and the striding, unchanged
        assert torch.equal(after.page_table, before.page_table)
        assert torch.equal(after.swa_page_table, before.swa_page_table)
        return
    assert after.swa_page_table is None and after.page_table.shape == (3, -(-70 // page_size))
    for row, kv_len in enumerate(after.cache_seqlens_int32.tolist()):
        live = -(-kv_len // page_size)
        assert torch.equal(after.page_table[row, :live], before.page_table[row, :live])
        assert (after.page_table[row, live:] == 0).all()
