"""flashinfer-swa-host-sum, run: the patched 0.5.14 ``flashinfer_backend``
imported on CPU, ``FlashInferIndicesUpdaterPrefill.update_sliding_window``
driven as a target verify (its planning call recorded): the window wrapper
gets the sum the device gave, without reading a device sum, and a draft
extend (accepted-token counts) still sums on the device."""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import pytest

pytestmark = pytest.mark.behaviour

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("transformers")
pytest.importorskip("fastapi")


MODULE = "sglang.srt.layers.attention.flashinfer_backend"
PATCH = "flashinfer-swa-host-sum"
WINDOW = 4


@pytest.fixture(scope="module")
def fi(load_patched):
    return load_patched("0.5.14", PATCH, MODULE)


class NoItem(torch.Tensor):
    """A tensor whose host read (``.item()``) fails: stands for a device sum the host must not wait for."""

    def item(self):  # noqa: D401
        raise AssertionError("a device sum was read back to the host")


def run(fi, seq_lens, seq_lens_cpu, spec_info):
    up = object.__new__(fi.FlashInferIndicesUpdaterPrefill)
    up.sliding_window_size = WINDOW
    up.kv_indptr = up.qo_indptr = [None, None]
    up.prefill_wrapper_ragged = None
    up._swa_kv_pool = None
    up.call_begin_forward = mock.Mock()
    up.update_sliding_window(
        torch.arange(len(seq_lens)),
        seq_lens,
        seq_lens_cpu,
        int(seq_lens.sum()),
        None,
        [None, None],
        False,
        None,
        spec_info,
    )
    return [c.args[4] for c in up.call_begin_forward.call_args_list]  # paged_kernel_lens_sum per wrapper


def test_a_verify_sums_the_mirror_and_never_reads_a_device_sum(fi):
    lens = torch.tensor([2, 4, 9, 30])
    expected = int(torch.minimum(lens, torch.full_like(lens, WINDOW)).sum())
    sums = run(fi, lens.as_subclass(NoItem), lens.clone(), SimpleNamespace())
    assert sums == [expected, int(lens.sum())]


def test_without_the_mirror_or_with_accepted_counts_the_device_sum_stays(fi):
    lens = torch.tensor([2, 4, 9, 30])
    expected = int(torch.minimum(lens, torch.full_like(lens, WINDOW)).sum())
    assert run(fi, lens, None, SimpleNamespace()) == [expected, int(lens.sum())]
    accepted = SimpleNamespace(num_accept_tokens=torch.tensor([1, 2, 1, 3]))
    with pytest.raises(AssertionError, match="read back"):
        run(fi, lens.as_subclass(NoItem), lens.clone(), accepted)
