"""verify-wait-on-stream, run: the patched ``ScheduleBatch`` of 0.5.12.post1, imported on
CPU (0.5.4 .. 0.5.12.post1 share the method). Each path that waited for the previous verify
(``filter_batch``, ``merge_batch``, through ``maybe_wait_verify_done``) now asks
a CUDA event to make the stream wait (``Event.wait``) and never blocks the host
on it; on ROCm, and for an event that is not CUDA's, it waits on the host as the
release did (the runtime's ``wait_event_on_stream``, run from the patched tree)."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

pytestmark = pytest.mark.behaviour

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("transformers")

from patchkit.cli import main  # noqa: E402
from patchkit.fetch import copy_tree  # noqa: E402

MODULE = "sglang.srt.managers.schedule_batch"


@pytest.fixture(scope="module", params=["0.5.12.post1"])
def schedule_batch(request, tmp_path_factory, load_sglang):
    package = copy_tree(request.param, tmp_path_factory.mktemp("vw"), "package")
    result = CliRunner().invoke(main, ["apply", str(package), "verify-wait-on-stream"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    load_sglang(package)
    module = importlib.import_module(MODULE)
    assert module.__file__.startswith(str(package))
    return module


class FakeCudaEvent(torch.cuda.Event):
    """A ``torch.cuda.Event`` that records how it was waited for (no CUDA here)."""

    def __new__(cls):
        return object.__new__(cls)

    def __init__(self):
        self.calls = []

    def wait(self, stream=None):
        self.calls.append("wait")

    def synchronize(self):
        self.calls.append("synchronize")


def batch_waiting_for(module, event, n_reqs=0):
    batch = module.ScheduleBatch.__new__(module.ScheduleBatch)
    batch.spec_algorithm = SimpleNamespace(is_none=lambda: False)
    batch.enable_overlap = True
    batch.spec_info = SimpleNamespace(verify_done=event)
    batch.reqs = [SimpleNamespace(finished=lambda: False) for _ in range(n_reqs)]
    return batch


@pytest.fixture
def spec_v2(monkeypatch, schedule_batch):
    """``is_spec_v2`` as the scheduler sees it under overlap spec v2 (a property
    reading the server args in these releases)."""
    monkeypatch.setattr(schedule_batch.ScheduleBatch, "is_spec_v2", property(lambda self: True))


def test_the_filter_asks_the_stream_to_wait_not_the_host(schedule_batch, spec_v2, monkeypatch):
    monkeypatch.setattr(torch.version, "hip", None)
    event = FakeCudaEvent()
    batch = batch_waiting_for(schedule_batch, event, n_reqs=2)
    batch.filter_batch()  # nothing to filter: returns after the wait
    batch.maybe_wait_verify_done()
    assert event.calls == ["wait", "wait"]


def test_rocm_and_a_non_cuda_event_still_wait_on_the_host(schedule_batch, spec_v2, monkeypatch):
    monkeypatch.setattr(torch.version, "hip", "6.3")
    rocm = FakeCudaEvent()
    batch_waiting_for(schedule_batch, rocm).maybe_wait_verify_done()
    assert rocm.calls == ["synchronize"]

    monkeypatch.setattr(torch.version, "hip", None)
    other = SimpleNamespace(calls=[])
    other.synchronize = lambda: other.calls.append("synchronize")
    batch_waiting_for(schedule_batch, other).maybe_wait_verify_done()
    assert other.calls == ["synchronize"]
