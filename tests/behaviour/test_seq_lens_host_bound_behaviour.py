"""seq-lens-host-bound, run: 0.5.12.post1 patched with it, imported on CPU. A decode batch that
hands over no mirror is built by the real ``ScheduleBatch.get_model_worker_batch`` with its
requests' KV allocations as the bound, ``ForwardBatch.init_new`` hands it on, and the debug
check reads the device lengths and refuses a bound below them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from forward_batch_inputs import WorkerBatch, runner

pytestmark = pytest.mark.behaviour

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("transformers")

from patchkit.cli import main  # noqa: E402
from patchkit.fetch import copy_tree  # noqa: E402

PID = "seq-lens-host-bound"
VERSION = "0.5.12.post1"


@pytest.fixture(scope="module")
def sglang(tmp_path_factory, load_sglang):
    package = copy_tree(VERSION, tmp_path_factory.mktemp("bound"), "package")
    result = CliRunner().invoke(main, ["apply", str(package), PID], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    load_sglang(package)
    from sglang.srt.managers import schedule_batch
    from sglang.srt.model_executor import forward_batch_info

    assert forward_batch_info.__file__.startswith(str(package))
    return SimpleNamespace(schedule_batch=schedule_batch, forward_batch_info=forward_batch_info)


def decode_batch(module, seq_lens_cpu=None):
    """A spec-v2 decode ScheduleBatch as get_model_worker_batch reads it (a stand-in answering
    None for the fields not set): three requests whose allocations prepare_for_decode raised to
    40, 1030 and 250."""
    reqs = [
        WorkerBatch(rid=str(i), kv_allocated_len=n, sampling_params=WorkerBatch())
        for i, n in enumerate((40, 1030, 250))
    ]
    return WorkerBatch(
        forward_mode=module.ForwardMode.DECODE,
        reqs=reqs,
        seq_lens=torch.tensor([31, 1021, 241]),
        seq_lens_cpu=seq_lens_cpu,
        seq_lens_sum=None,
        extend_lens=None,
        sampling_info=WorkerBatch(),
        multimodal_inputs=[None, None, None],
        return_logprob=False,
        has_grammar=False,
    )


def test_the_worker_batch_carries_the_requests_allocations(sglang):
    sb = sglang.schedule_batch
    worker = sb.ScheduleBatch.get_model_worker_batch(decode_batch(sb))
    assert worker.seq_lens_host_bound == (1030, 1320)
    with_mirror = sb.ScheduleBatch.get_model_worker_batch(decode_batch(sb, torch.tensor([31, 1021, 241])))
    assert with_mirror.seq_lens_host_bound is None  # the mirror: the exact values, no bound


def worker_batch(module, bound):
    return WorkerBatch(
        forward_mode=module.ForwardMode.DECODE,
        seq_lens=torch.tensor([31, 1021, 241]),
        input_ids=torch.arange(3),
        seq_lens_host_bound=bound,
        reqs=[],
    )


def test_init_new_hands_it_on_and_the_check_refuses_a_bound_below_the_device(sglang, monkeypatch):
    fbi = sglang.forward_batch_info
    from sglang.srt._patchkit.runtime import CHECK_SWITCH, SeqLensBound

    monkeypatch.setattr(fbi, "enable_num_token_non_padded", lambda *args: False)
    bound = SeqLensBound(1030, 1320)
    assert fbi.ForwardBatch.init_new(worker_batch(fbi, bound), runner()).seq_lens_host_bound == bound
    assert fbi.ForwardBatch.init_new(worker_batch(fbi, None), runner()).seq_lens_host_bound is None
    monkeypatch.setenv(CHECK_SWITCH, "1")
    assert fbi.ForwardBatch.init_new(worker_batch(fbi, bound), runner()).seq_lens_host_bound == bound
    with pytest.raises(RuntimeError, match="device max 1021 > 1000"):
        fbi.ForwardBatch.init_new(worker_batch(fbi, SeqLensBound(1000, 1320)), runner())
