"""trtllm-mha-draft-decode-capture (sglang #26521) on CPU: the real
``TRTLLMHAAttnBackend.init_forward_metadata_capture_cuda_graph`` of 0.5.12.post1,
pristine and patched, driven for a draft-decode step on a stand-in ``self``
holding the graph buffers init_cuda_graph_state allocates (zeros).

Pristine, the lengths the capture's warm-up forwards hand the kernel stay
zero (an empty KV range: NaN on the GPU); patched, they are the lengths
replay would write. The same check, run on the pristine tree, fails."""

from __future__ import annotations

import importlib
from types import SimpleNamespace as NS

import pytest

pytestmark = pytest.mark.behaviour

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("transformers")

from click.testing import CliRunner  # noqa: E402

from patchkit.cli import main  # noqa: E402
from patchkit.fetch import copy_tree  # noqa: E402

VERSION, PATCH = "0.5.12.post1", "trtllm-mha-draft-decode-capture"
MAX_BS, PAGES, STEP = 4, 16, 2


def _backend():
    return NS(
        decode_cuda_graph_metadata={
            "cache_seqlens": torch.zeros(MAX_BS, dtype=torch.int32),
            "cu_seqlens_q": torch.arange(0, MAX_BS + 1, dtype=torch.int32),
            "page_table_draft_decode": torch.zeros(MAX_BS, PAGES, dtype=torch.int32),
        },
        speculative_step_id=STEP,
        _bind_swa_page_table=lambda *a, **k: None,
    )


def _captured_lengths(mha, modes, bs=3):
    b = _backend()
    seq_lens = torch.ones(bs, dtype=torch.int64)  # the graph runner's capture fill value
    mha.TRTLLMHAAttnBackend.init_forward_metadata_capture_cuda_graph(
        b,
        bs=bs,
        num_tokens=bs,
        req_pool_indices=torch.zeros(bs, dtype=torch.int64),
        seq_lens=seq_lens,
        encoder_lens=None,
        forward_mode=modes.DECODE,
        spec_info=NS(),
    )
    md = b.decode_cuda_graph_metadata[bs]
    md.buffer = b.decode_cuda_graph_metadata["cache_seqlens"]
    return md, seq_lens + STEP + 1


def _seeded(md, expected) -> bool:
    return (
        md.cache_seqlens_int32.tolist() == expected.tolist()
        and md.cu_seqlens_k[1:].tolist() == torch.cumsum(expected, 0).tolist()
    )


def _load(tmp_path_factory, load_sglang, patched: bool):
    package = copy_tree(VERSION, tmp_path_factory.mktemp("mha-capture"), "package")
    if patched:
        result = CliRunner().invoke(main, ["apply", str(package), PATCH], catch_exceptions=False)
        assert result.exit_code == 0, result.output
    load_sglang(package)
    return (
        importlib.import_module("sglang.srt.layers.attention.trtllm_mha_backend"),
        importlib.import_module("sglang.srt.model_executor.forward_batch_info").ForwardMode,
    )


def test_pristine_capture_leaves_the_draft_decode_lengths_at_zero(tmp_path_factory, load_sglang):
    mha, modes = _load(tmp_path_factory, load_sglang, patched=False)
    md, expected = _captured_lengths(mha, modes)
    assert md.cache_seqlens_int32.tolist() == [0, 0, 0]  # the bug: an empty KV range for the warm-up
    assert not _seeded(md, expected)


def test_patched_capture_seeds_them_as_replay_does(tmp_path_factory, load_sglang):
    mha, modes = _load(tmp_path_factory, load_sglang, patched=True)
    md, expected = _captured_lengths(mha, modes)
    assert _seeded(md, expected)
    # Still the graph buffer (captured kernels read it by address).
    assert md.cache_seqlens_int32.data_ptr() == md.buffer.data_ptr() and md.buffer[:3].tolist() == expected.tolist()
