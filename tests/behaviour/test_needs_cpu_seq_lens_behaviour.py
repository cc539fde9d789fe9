"""needs-cpu-seq-lens on a patched real tree, imported on CPU: the decision,
the flags, and the GPU-only path (no CPU seq_lens mirror) through the patched
sglang code, with real sglang objects where they build on CPU and minimal
stand-ins where a step needs a GPU kernel.

One tree per process (see tests/sglang_cpu_env.py): this module patches and
imports $PATCHKIT_BEHAVIOUR_VERSION (default 0.5.12.post1);
``test_other_releases`` runs this module again in a subprocess for 0.5.10,
0.5.11 and 0.5.9, the other shapes of the patched code.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.behaviour

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("transformers")

from click.testing import CliRunner  # noqa: E402
from forward_batch_inputs import runner as cpu_runner  # noqa: E402

from patchkit.cli import main  # noqa: E402
from patchkit.fetch import copy_tree  # noqa: E402

PID = "needs-cpu-seq-lens"
VERSION = os.environ.get("PATCHKIT_BEHAVIOUR_VERSION", "0.5.12.post1")
OTHER_RELEASES = ["0.5.10", "0.5.11", "0.5.9"]  # 0.5.9: the last release before 0.5.10 (issue 43)


@pytest.fixture(scope="module")
def sglang(tmp_path_factory, load_sglang):
    """The patched tree, imported: ``sglang`` of a fresh copy of VERSION."""
    package = copy_tree(VERSION, tmp_path_factory.mktemp("patched"), "package")
    result = CliRunner().invoke(main, ["apply", str(package), PID], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return load_sglang(package)


@pytest.fixture
def rt(sglang):
    """The runtime the patched tree imports: its own vendored copy."""
    import sglang.srt._patchkit.runtime as runtime

    assert runtime.__file__.startswith(str(Path(sglang.__file__).parent))
    return runtime


@pytest.fixture
def decision(rt):
    """Set the process-wide decision; restored afterwards."""
    yield rt.set_needs_cpu_seq_lens
    rt.set_needs_cpu_seq_lens(True)


# -- the flags and the decision -------------------------------------------------------------------


def test_flags_on_the_classes(sglang):
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend, TritonMultiStepDraftBackend
    from sglang.srt.layers.attention.trtllm_mha_backend import TRTLLMHAAttnBackend

    assert AttentionBackend.needs_cpu_seq_lens is True
    assert TritonAttnBackend.needs_cpu_seq_lens is False
    assert TritonMultiStepDraftBackend.needs_cpu_seq_lens is False
    assert not issubclass(TritonMultiStepDraftBackend, AttentionBackend)  # hence its own flag
    assert TRTLLMHAAttnBackend.needs_cpu_seq_lens is True  # inherited default


def backends_of(sglang, *classes):
    """Real backend instances without running their GPU-bound __init__."""
    return [None if c is None else c.__new__(c) for c in classes]


def test_decision_truth_table_with_real_backends_and_server_args(sglang, rt):
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend, TritonMultiStepDraftBackend
    from sglang.srt.layers.attention.trtllm_mha_backend import TRTLLMHAAttnBackend
    from sglang.srt.server_args import ServerArgs

    fields = ServerArgs.__dataclass_fields__
    assert "enable_two_batch_overlap" in fields
    if "disable_piecewise_cuda_graph" in fields:  # 0.5.10+: PCG on by default
        assert fields["disable_piecewise_cuda_graph"].default is False
        pcg_off, pcg_on = {"disable_piecewise_cuda_graph": True}, {"disable_piecewise_cuda_graph": False}
    else:  # 0.5.4 .. 0.5.9: off unless asked for
        assert fields["enable_piecewise_cuda_graph"].default is False
        pcg_off, pcg_on = {"enable_piecewise_cuda_graph": False}, {"enable_piecewise_cuda_graph": True}

    def args(**kw):
        base = {name: f.default for name, f in fields.items() if f.default is not f.default_factory}
        base.update({"enable_two_batch_overlap": False, **pcg_off, **kw})
        return SimpleNamespace(**base)

    triton = backends_of(sglang, TritonAttnBackend, TritonMultiStepDraftBackend, None, TritonAttnBackend)
    assert rt.decide_needs_cpu_seq_lens(args(), triton) is False
    assert rt.decide_needs_cpu_seq_lens(args(enable_two_batch_overlap=True), triton) is True
    assert rt.decide_needs_cpu_seq_lens(args(**pcg_on), triton) is True
    mixed = backends_of(sglang, TRTLLMHAAttnBackend, TritonMultiStepDraftBackend, None)
    assert rt.decide_needs_cpu_seq_lens(args(), mixed) is True
    assert rt.decide_needs_cpu_seq_lens(args(), [*triton, SimpleNamespace()]) is True


def test_worker_lists_its_backends(sglang):
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    target, draft, extend, runner = (object() for _ in range(4))
    worker = EAGLEWorkerV2.__new__(EAGLEWorkerV2)
    worker._target_worker = SimpleNamespace(model_runner=SimpleNamespace(attn_backend=target))
    worker._draft_worker = SimpleNamespace(
        draft_attn_backend=draft, draft_extend_attn_backend=extend, draft_runner=SimpleNamespace(attn_backend=runner)
    )
    assert worker.spec_v2_attn_backends == (target, draft, extend, runner)


def test_scheduler_overlap_init_takes_the_decision(sglang, rt, decision, monkeypatch):
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend, TritonMultiStepDraftBackend
    from sglang.srt.managers import scheduler as scheduler_module
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    built = []
    monkeypatch.setattr(
        scheduler_module, "FutureMap", lambda *a, **kw: built.append(rt.needs_cpu_seq_lens()) or "future-map"
    )
    if hasattr(scheduler_module, "use_mlx"):
        monkeypatch.setattr(scheduler_module, "use_mlx", lambda: False)
    triton, draft = backends_of(sglang, TritonAttnBackend, TritonMultiStepDraftBackend)
    fake = SimpleNamespace(
        device="cpu",
        forward_stream=torch.cpu.Stream(),
        enable_overlap=True,
        server_args=SimpleNamespace(enable_two_batch_overlap=False, disable_piecewise_cuda_graph=True),
        draft_worker=SimpleNamespace(spec_v2_attn_backends=(triton, draft, None, triton)),
        tp_worker=SimpleNamespace(model_runner=SimpleNamespace(attn_backend=triton, model_is_mrope=False)),
        max_running_requests=8,
        chunked_prefill_size=64,
        model_config=SimpleNamespace(context_len=128),
        spec_algorithm=SpeculativeAlgorithm.EAGLE,
    )
    decision(True)
    Scheduler.init_overlap(fake)
    assert fake.future_map == "future-map"
    assert built == [False]  # decided before the FutureMap is built
    assert rt.needs_cpu_seq_lens() is False

    fake.server_args.disable_piecewise_cuda_graph = False  # PCG on: keep the mirror
    Scheduler.init_overlap(fake)
    assert rt.needs_cpu_seq_lens() is True

    fake.enable_overlap = False  # no overlap, no spec v2: nothing decided
    decision(False)
    Scheduler.init_overlap(fake)
    assert fake.future_map is None and rt.needs_cpu_seq_lens() is False


# -- prepare_for_decode: the gated sync -------------------------------------------------------------------


class Req(SimpleNamespace):
    def finished(self):
        return self.done


def make_req(rid, seqlen, done=False):
    return Req(
        rid=rid,
        done=done,
        seqlen=seqlen,
        kv_allocated_len=seqlen,
        kv_committed_len=seqlen,
        decode_batch_idx=0,
        output_ids=[1],
        origin_input_ids=[1] * (seqlen - 1),
        return_logprob=False,
        stream=False,
        grammar=None,
        lora_id=None,
        dllm_block_offset=0,
    )


class NoOpSampling(SimpleNamespace):
    def filter_batch(self, *args):
        pass

    def merge_batch(self, other):
        pass


def schedule_batch(sglang, lens, mirror=True, **extra):
    """A real ScheduleBatch in spec-v2 decode (EAGLE, overlap on), on CPU."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.eagle_info import EagleDraftInput
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    seq_lens = torch.tensor(lens, dtype=torch.int64)
    bs = len(lens)
    # The last verified tokens: `verified_id` before 0.5.12, `bonus_tokens` since.
    last = "bonus_tokens" if "bonus_tokens" in EagleDraftInput.__dataclass_fields__ else "verified_id"
    draft_input = EagleDraftInput(
        topk_p=torch.ones((bs, 1)),
        topk_index=torch.zeros((bs, 1), dtype=torch.int64),
        hidden_states=torch.zeros((bs, 8)),
        **{last: torch.arange(bs)},
    )
    batch = ScheduleBatch(
        reqs=[make_req(i, n) for i, n in enumerate(lens)],
        device="cpu",
        forward_mode=ForwardMode.DECODE,
        enable_overlap=True,
        spec_algorithm=SpeculativeAlgorithm.EAGLE,
        spec_info=draft_input,
        tree_cache=SimpleNamespace(supports_swa=lambda: False),
        model_config=SimpleNamespace(is_encoder_decoder=False),
        sampling_info=NoOpSampling(penalizer_orchestrator=SimpleNamespace(is_required=False), grammars=None),
        req_pool_indices=torch.arange(len(lens), dtype=torch.int64),
        seq_lens=seq_lens,
        orig_seq_lens=seq_lens.clone(),
        seq_lens_cpu=seq_lens.clone() if mirror else None,
        seq_lens_sum=int(sum(lens)) if mirror else None,
        **extra,
    )
    assert batch.is_spec_v2
    return batch


@pytest.fixture
def cpu_decode_kernels(sglang, monkeypatch):
    """CPU stand-ins for the two GPU steps of prepare_for_decode: KV slot
    allocation and the Triton req_to_token writer."""
    from sglang.srt.speculative import eagle_info_v2, spec_utils

    written = []
    monkeypatch.setattr(eagle_info_v2, "get_alloc_len_per_decode", lambda: 4)
    monkeypatch.setattr(eagle_info_v2, "alloc_token_slots", lambda tree_cache, n: torch.arange(n))
    monkeypatch.setattr(spec_utils, "assign_req_to_token_pool_func", lambda *args: written.append(args))
    return written


@pytest.mark.parametrize("keep", [True, False])
def test_prepare_for_decode_gates_the_mirror(sglang, decision, cpu_decode_kernels, keep):
    from sglang.srt.speculative.eagle_info_v2 import EagleDraftInputV2Mixin

    batch = schedule_batch(sglang, [5, 9, 3])
    batch.token_to_kv_pool_allocator = SimpleNamespace(page_size=1)
    batch.req_to_token_pool = SimpleNamespace(req_to_token=torch.zeros((4, 64), dtype=torch.int32))
    batch.seq_lens = torch.tensor([6, 10, 4])  # advanced by the last verify (GPU value)
    decision(keep)
    EagleDraftInputV2Mixin.prepare_for_decode(batch.spec_info, batch)
    assert len(cpu_decode_kernels) == 1  # KV slots still assigned on the device
    assert [r.kv_allocated_len for r in batch.reqs] == [13, 17, 11]
    assert batch.seq_lens.tolist() == [6, 10, 4]  # GPU seq_lens untouched
    if keep:
        assert batch.seq_lens_cpu.tolist() == [6, 10, 4] and batch.seq_lens_sum == 20
    else:
        assert batch.seq_lens_cpu is None and batch.seq_lens_sum is None


# -- what runs next with no mirror ---------------------------------------------------------------------------


class DeviceSeqLens(torch.Tensor):
    """``seq_lens`` standing in for a device tensor on CPU: each read to the host
    (``item``, ``tolist``, ``cpu``, ``int``) is recorded in ``host_reads``, and
    every tensor computed from it (index, sum, ``+ 1``) is one too."""

    host_reads: list = []

    def item(self):
        DeviceSeqLens.host_reads.append("item")
        return super().item()

    def tolist(self):
        DeviceSeqLens.host_reads.append("tolist")
        return super().tolist()

    def cpu(self, *args, **kwargs):
        DeviceSeqLens.host_reads.append("cpu")
        return super().cpu(*args, **kwargs).as_subclass(torch.Tensor)

    def __int__(self):
        DeviceSeqLens.host_reads.append("int")
        return super().__int__()


@pytest.fixture
def on_device():
    """``on_device(batch)`` makes its seq_lens a :class:`DeviceSeqLens`; returns
    the list of host reads made from it since."""
    reads = DeviceSeqLens.host_reads = []

    def wrap(batch):
        batch.seq_lens = batch.seq_lens.as_subclass(DeviceSeqLens)
        return reads

    return wrap


def values(tensor) -> list:
    """A tensor's values, read here (not by the code under test)."""
    return tensor.as_subclass(torch.Tensor).tolist()


# #25818: filter_batch, merge_batch and the non-spec prepare_for_decode leave
# seq_lens_sum None; get_model_worker_batch computes it from the host mirror.


@pytest.mark.parametrize("mirror", [True, False])
def test_filter_batch_reads_nothing_from_the_device(sglang, on_device, mirror):
    batch = schedule_batch(sglang, [5, 9, 3], mirror=mirror)
    host_reads = on_device(batch)
    batch.reqs[1].done = True
    batch.filter_batch()
    assert [r.rid for r in batch.reqs] == [0, 2]
    assert values(batch.seq_lens) == [5, 3]
    assert batch.seq_lens_sum is None  # deferred
    worker_batch = batch.get_model_worker_batch()
    assert host_reads == []  # the pristine tree: ["item"] (self.seq_lens.sum().item())
    if mirror:
        assert batch.seq_lens_cpu.tolist() == [5, 3]
        assert worker_batch.seq_lens_sum == batch.seq_lens_sum == 8  # the integer the device sum gave
        assert type(worker_batch.seq_lens_sum) is int
    else:
        assert batch.seq_lens_cpu is None and worker_batch.seq_lens_sum is None


def test_forward_batch_gets_the_filled_sum(sglang, monkeypatch):
    from sglang.srt.model_executor import forward_batch_info
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    monkeypatch.setattr(forward_batch_info, "enable_num_token_non_padded", lambda *args: False)
    batch = schedule_batch(sglang, [5, 9, 3])
    batch.reqs[0].done = True
    batch.filter_batch()
    batch.spec_info = None  # a plain decode forward
    batch.input_ids = torch.tensor([1, 2])  # 0.5.9's init_new counts them unconditionally
    runner = SimpleNamespace(**vars(cpu_runner()), spec_algorithm=batch.spec_algorithm)
    forward_batch = ForwardBatch.init_new(batch.get_model_worker_batch(), runner)
    assert forward_batch.seq_lens_sum == 12 and forward_batch.seq_lens_cpu.tolist() == [9, 3]


def test_merge_batch_defers_the_sum(sglang, on_device):
    running = schedule_batch(sglang, [5, 9], mirror=False)
    prefill = schedule_batch(sglang, [4])
    running.merge_batch(prefill)
    assert running.seq_lens.tolist() == [5, 9, 4]
    assert running.seq_lens_cpu is None and running.seq_lens_sum is None
    assert running.get_model_worker_batch().seq_lens_sum is None
    both = schedule_batch(sglang, [5, 9])
    host_reads = on_device(both)
    both.merge_batch(schedule_batch(sglang, [4]))
    assert both.seq_lens_cpu.tolist() == [5, 9, 4] and both.seq_lens_sum is None
    assert both.get_model_worker_batch().seq_lens_sum == 18
    assert host_reads == []


def test_a_caller_cache_of_the_mirror_is_what_the_sum_is_taken_from(sglang):
    batch = schedule_batch(sglang, [5, 9])
    batch.seq_lens_sum = None
    cache = torch.tensor([6, 10])
    assert batch.get_model_worker_batch(cache).seq_lens_sum == 16
    # A sum already there is handed over as it is.
    kept = schedule_batch(sglang, [5, 9])
    assert kept.get_model_worker_batch(cache).seq_lens_sum == 14


def test_non_spec_decode_defers_the_sum(sglang, on_device, monkeypatch):
    from sglang.srt.managers import schedule_batch as schedule_batch_module
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    monkeypatch.setattr(
        schedule_batch_module, "alloc_for_decode", lambda batch, token_per_req: torch.arange(len(batch.reqs))
    )
    server_args = SimpleNamespace(enable_mamba_extra_buffer=lambda: False)
    monkeypatch.setattr(schedule_batch_module, "get_global_server_args", lambda: server_args)
    batch = schedule_batch(sglang, [5, 9, 3])
    batch.spec_algorithm, batch.spec_info = SpeculativeAlgorithm.NONE, None
    batch.output_ids = torch.tensor([7, 8, 9])
    host_reads = on_device(batch)
    batch.prepare_for_decode()
    assert values(batch.seq_lens) == [6, 10, 4] and batch.seq_lens_cpu.tolist() == [6, 10, 4]
    assert batch.seq_lens_sum is None
    assert batch.get_model_worker_batch().seq_lens_sum == 20  # 17 + bs, as `+= bs` gave
    assert host_reads == []


def test_mixed_output_lengths_decode_loop(sglang, decision, cpu_decode_kernels, on_device):
    """Requests leaving the batch at different steps (the traffic of issue 23):
    each step filters, prepares the spec-v2 decode and builds the worker batch.
    Without the mirror no step reads the device; with it, every worker batch
    gets the sum of the device lengths, as before."""
    from sglang.srt.speculative.eagle_info_v2 import EagleDraftInputV2Mixin

    for keep in (False, True):
        decision(keep)
        batch = schedule_batch(sglang, [5, 9, 3, 7], mirror=keep)
        batch.token_to_kv_pool_allocator = SimpleNamespace(page_size=1)
        batch.req_to_token_pool = SimpleNamespace(req_to_token=torch.zeros((4, 64), dtype=torch.int32))
        host_reads = on_device(batch)
        sums = []
        for step, leaving in enumerate([None, 2, None, 0, 3]):
            if leaving is not None:
                next(r for r in batch.reqs if r.rid == leaving).done = True
            batch.filter_batch()
            batch.seq_lens = batch.seq_lens + 2  # the verify advanced the device lengths (2 accepted)
            EagleDraftInputV2Mixin.prepare_for_decode(batch.spec_info, batch)
            sums.append(batch.get_model_worker_batch().seq_lens_sum)
            expected = sum(values(batch.seq_lens))
            assert sums[-1] == (expected if keep else None), (keep, step)
        assert [r.rid for r in batch.reqs] == [1]
        # The only host read left is the gated copy of the mirror, once per step.
        assert host_reads == (["cpu"] * 5 if keep else [])


def test_model_worker_batch_without_the_mirror(sglang):
    batch = schedule_batch(sglang, [5, 9], mirror=False)
    worker_batch = batch.get_model_worker_batch()
    assert worker_batch.seq_lens_cpu is None and worker_batch.seq_lens_sum is None
    assert worker_batch.seq_lens.tolist() == [5, 9]


def test_decode_metrics_without_the_mirror(sglang):
    try:
        from sglang.srt.observability.scheduler_metrics_mixin import SchedulerMetricsMixin
    except ModuleNotFoundError:  # 0.5.9: the sum sits inside log_decode_stats (CPU tests: tests/trees/test_pre_0510.py)
        pytest.skip("no sglang.srt.observability before 0.5.10")

    batch = schedule_batch(sglang, [5, 9], mirror=False)
    batch.reqs[0].seqlen, batch.reqs[1].seqlen = 6, 10  # the lengths the requests know
    with_mirror = schedule_batch(sglang, [6, 10])
    scheduler = SimpleNamespace(
        **{
            f"_{name}": 1.0
            for name in (
                "linear_flops_per_token",
                "attn_dot_flops_coeff",
                "weight_read_bytes_per_token",
                "qkv_act_bytes_per_token",
                "decode_q_read_bytes_per_token",
                "kv_cache_bytes_per_token",
                "ffn_act_bytes_per_token",
            )
        }
    )
    estimate = SchedulerMetricsMixin._estimate_decode_perf
    assert estimate(scheduler, batch, 2) == estimate(scheduler, with_mirror, 2)  # same total, 16
    build = getattr(SchedulerMetricsMixin, "_build_scheduled_request_metrics", None)
    if build is not None:  # 0.5.12+
        metrics = build(scheduler, batch)
        assert (metrics.num_decode_requests, metrics.sum_decode_kv_tokens) == (2, 16)
        assert metrics == build(scheduler, with_mirror)


# -- the draft extend with no mirror ------------------------------------------------------------------------


def worker_batch_after_verify(sglang, lens, mirror):
    batch = schedule_batch(sglang, lens, mirror=mirror).get_model_worker_batch()
    batch.forward_mode = sglang.srt.model_executor.forward_batch_info.ForwardMode.DECODE
    return batch


@pytest.mark.parametrize("mirror", [True, False])
def test_draft_extend_preparation(sglang, mirror, monkeypatch):
    from sglang.srt.model_executor import forward_batch_info
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    monkeypatch.setattr(forward_batch_info, "enable_num_token_non_padded", lambda *args: False)
    num_draft = 3
    batch = worker_batch_after_verify(sglang, [5, 9], mirror)
    eager = []
    attn_backend = SimpleNamespace(init_forward_metadata=lambda fb: eager.append(fb))
    runner = SimpleNamespace(
        **{**vars(cpu_runner()), "attn_backend": attn_backend}, spec_algorithm=batch.spec_algorithm
    )
    draft_input = EagleDraftInput()
    predict = torch.arange(2 * num_draft)
    forward_batch = draft_input.prepare_for_extend_to_fill_draft_kvcache(batch, predict, num_draft, runner, None)

    assert forward_batch.forward_mode == ForwardMode.DRAFT_EXTEND_V2
    assert eager == [forward_batch]  # no graph runner: the backend's eager metadata init
    assert forward_batch.seq_lens.tolist() == [8, 12]
    assert forward_batch.extend_seq_lens.tolist() == [3, 3]
    assert forward_batch.extend_prefix_lens.tolist() == [5, 9]
    # #26738: the host extend lens are supplied on both paths, without a copy.
    assert forward_batch.extend_seq_lens_cpu == [num_draft] * 2
    assert forward_batch.positions.tolist() == [5, 6, 7, 9, 10, 11]
    if mirror:
        assert forward_batch.seq_lens_cpu.tolist() == [8, 12] and forward_batch.seq_lens_sum == 20
        assert forward_batch.extend_prefix_lens_cpu == [5, 9]
    else:
        assert forward_batch.seq_lens_cpu is None and forward_batch.seq_lens_sum is None
        assert forward_batch.extend_prefix_lens_cpu is None  # Triton takes its upper bound


# -- the other releases ---------------------------------------------------------------------------------------


@pytest.mark.skipif(VERSION != "0.5.12.post1", reason="runs from the default session only")
@pytest.mark.parametrize("version", OTHER_RELEASES)
def test_other_releases(version, tmp_path):
    env = {**os.environ, "PATCHKIT_BEHAVIOUR_VERSION": version}
    here = Path(__file__).resolve()
    proc = subprocess.run(
        # A basetemp of its own: pytest's default one would first sweep the
        # numbered folders that earlier runs left under /tmp (minutes where
        # they hold many trees; the run itself takes about 20 s).
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--basetemp",
            str(tmp_path / "basetemp"),
            str(here),
            "-k",
            "not test_other_releases",
        ],
        cwd=here.parent.parent.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout
