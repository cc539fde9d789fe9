"""Snippet tests of tests/trees/test_needs_cpu_seq_lens.py (no release read; the quick loop runs them)."""

from __future__ import annotations

import textwrap

import pytest

from patchkit import registry
from patchkit.codemods import needs_cpu_seq_lens_deferred_sum as deferred
from patchkit.codemods import needs_cpu_seq_lens_flags as flags
from patchkit.codemods import needs_cpu_seq_lens_guards as guards
from patchkit.codemods import needs_cpu_seq_lens_sync as sync
from patchkit.codemods.common.base import State
from patchkit.testing import apply, assert_codemod, assert_state, code, detect

PID = "needs-cpu-seq-lens"


def block(src: str, indent: int) -> str:
    """A snippet of a method body, at ``indent`` spaces."""
    return textwrap.indent(code(src), " " * indent)


def test_flags_are_declared_after_the_docstring_or_first():
    out = apply(
        flags.TritonMultiStepDraftOptsOut,
        '''
        class TritonMultiStepDraftBackend:
            """Wrap multiple triton attention backends."""

            def __init__(self, model_runner, topk, speculative_num_steps):
                self.topk = topk
        ''',
    )
    assert out == code(
        '''
        class TritonMultiStepDraftBackend:
            """Wrap multiple triton attention backends."""

            # CUDA-graph replay rebuilds metadata from preallocated kv_indptr/kv_indices
            # buffers; it never reads seq_lens_cpu / seq_lens_sum.
            needs_cpu_seq_lens: bool = False

            def __init__(self, model_runner, topk, speculative_num_steps):
                self.topk = topk
        '''
    )
    out = apply(
        flags.TritonBackendOptsOut,
        "class TritonAttnBackend(AttentionBackend):\n    def __init__(self):\n        pass\n",
    )
    assert out.startswith("class TritonAttnBackend(AttentionBackend):\n    # CUDA-graph replay")
    assert "    needs_cpu_seq_lens: bool = False\n\n    def __init__" in out
    out = apply(
        flags.BaseBackendFlag, 'class AttentionBackend(ABC):\n    """Base."""\n\n    def f(self):\n        pass\n'
    )
    assert "    needs_cpu_seq_lens: bool = True\n" in out


def test_upstream_flag_anywhere_in_the_class_is_done():
    src = """
    class AttentionBackend(ABC):
        def init_forward_metadata(self, forward_batch):
            raise NotImplementedError()

        # Opt out only when this backend never reads seq_lens_cpu / seq_lens_sum.
        needs_cpu_seq_lens: bool = True
    """
    assert_state(flags.BaseBackendFlag, src, State.DONE)


WORKER = """
class EAGLEWorkerV2(BaseSpecWorker):
    def __init__(self, target_worker):
        self._target_worker = target_worker

    @property
    def target_worker(self):
        return self._target_worker

    @property
    def draft_worker(self):
        return self._draft_worker

    def clear_cache_pool(self):
        pass
"""


def test_worker_exposes_its_backends_after_the_draft_worker_property():
    out = apply(sync.ExposeSpecV2AttnBackends, WORKER)
    assert out.index("def draft_worker") < out.index("def spec_v2_attn_backends") < out.index("def clear_cache_pool")
    assert "self._draft_worker.draft_runner.attn_backend," in out
    namespace: dict = {"BaseSpecWorker": object}
    exec(compile(out, "worker", "exec"), namespace)
    assert isinstance(namespace["EAGLEWorkerV2"].spec_v2_attn_backends, property)


SCHEDULER = """
class Scheduler:
    def init_overlap(self):
        self.device_module = torch.get_device_module(self.device)

        if not self.enable_overlap:
            self.future_map = None
            return

        self.future_map = FutureMap(
            self.max_running_requests,
            self.device,
            self.spec_algorithm,
        )
        self.batch_record_buf = [None] * 2
"""


def test_scheduler_decides_before_building_the_future_map():
    out = apply(sync.DecideInInitOverlap, SCHEDULER)
    assert out.startswith("from sglang.srt._patchkit.runtime import configure_needs_cpu_seq_lens\n")
    assert (
        block(
            """
                    self.future_map = None
                    return

                # patchkit (sglang #26128): decide once whether spec-v2 decode needs the CPU
                # mirror of seq_lens; the code that owns the seq_lens D2H sync reads it.
                configure_needs_cpu_seq_lens(self.server_args, self.draft_worker, self.tp_worker)

                self.future_map = FutureMap(
        """,
            8,
        )
        in out
    )


def test_scheduler_upstream_decision_is_done_and_no_future_map_is_missing():
    upstream = """
    class Scheduler:
        def init_overlap(self):
            attn_backends = getattr(self.draft_worker, "spec_v2_attn_backends", ())
            needs_cpu_seq_lens = decide_needs_cpu_seq_lens(attn_backends)
            self.future_map = self.spec_algorithm.create_future_map(self.device, needs_cpu_seq_lens=needs_cpu_seq_lens)
    """
    assert_state(sync.DecideInInitOverlap, upstream, State.DONE)
    finding = detect(sync.DecideInInitOverlap, "class Scheduler:\n    def init_overlap(self):\n        pass\n")
    assert finding.state is State.MISSING and "future_map" in finding.detail


DECODE = """
class EagleDraftInputV2Mixin:
    def prepare_for_decode(self: EagleDraftInput, batch: ScheduleBatch):
        batch.maybe_wait_verify_done()
        assign_req_to_token_pool_func(batch.req_pool_indices, bs)

        # FIXME(lsyin): make this sync optional
        batch.seq_lens_cpu = batch.seq_lens.cpu()
        batch.seq_lens_sum = batch.seq_lens_cpu.sum().item()
"""


def test_decode_sync_is_gated_by_the_decision():
    out = apply(sync.GateDecodeSync, DECODE)
    assert out.startswith("from sglang.srt._patchkit.runtime import needs_cpu_seq_lens\n")
    assert (
        block(
            """
                # FIXME(lsyin): make this sync optional
                if not needs_cpu_seq_lens():
                    # patchkit (sglang #26128): no attention backend reads the CPU mirror;
                    # the GPU seq_lens are already advanced, skip the D2H copy and sum.
                    batch.seq_lens_cpu = None
                    batch.seq_lens_sum = None
                else:
                    batch.seq_lens_cpu = batch.seq_lens.cpu()
                    batch.seq_lens_sum = batch.seq_lens_cpu.sum().item()
        """,
            8,
        )
        in out
    )


def test_decode_sync_elsewhere_or_nested():
    moved = """
    class EagleDraftInputV2Mixin:
        def prepare_for_decode(self, batch):
            batch.maybe_evict_swa()
    """
    assert_state(sync.GateDecodeSync, moved, State.SUPERSEDED)
    # A fork's own version of the sync: in a block, another spelling of the copy: gated where it is.
    assert_codemod(
        sync.GateDecodeSync,
        """
        class EagleDraftInputV2Mixin:
            def prepare_for_decode(self, batch):
                if batch.reqs:
                    # vendor: sync only when there is work
                    batch.seq_lens_cpu = batch.seq_lens.to("cpu", non_blocking=False)
                    batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
                    log_step(batch)
        """,
        """
        from sglang.srt._patchkit.runtime import needs_cpu_seq_lens
        class EagleDraftInputV2Mixin:
            def prepare_for_decode(self, batch):
                if batch.reqs:
                    # vendor: sync only when there is work
                    if not needs_cpu_seq_lens():
                        # patchkit (sglang #26128): no attention backend reads the CPU mirror;
                        # the GPU seq_lens are already advanced, skip the D2H copy and sum.
                        batch.seq_lens_cpu = None
                        batch.seq_lens_sum = None
                    else:
                        batch.seq_lens_cpu = batch.seq_lens.to("cpu", non_blocking=False)
                        batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
                    log_step(batch)
        """,
    )


@pytest.mark.parametrize("helper", ["materialize_seq_lens_cpu", "_vendor_fill_cpu_mirror"])
def test_decode_sync_a_fork_already_dropped(helper):
    fork = f"""
    class EagleDraftInputV2Mixin:
        def prepare_for_decode(self, batch):
            batch.maybe_wait_verify_done()
            # vendor: {helper}() fills the mirror on demand
            batch.seq_lens_cpu = None
            batch.seq_lens_sum = None
    """
    assert_state(
        sync.GateDecodeSync,
        fork,
        State.SUPERSEDED,
        detail="this tree avoids the seq_lens sync itself at line 5 (`batch.seq_lens_cpu = None`);",
    )


# FutureMap.resolve_seq_lens_cpu as it was between the FutureMap rewrite and #26128.
FUTURE_MAP = """
class FutureMap:
    def resolve_seq_lens_cpu(self, batch: ScheduleBatch) -> None:
        fi = batch.spec_info.future_indices if batch.spec_info is not None else None
        if fi is None:
            return
        if self.publish_ready is not None:
            self.publish_ready.wait()
        batch.seq_lens = self.new_seq_lens_buf[fi]

        if self.fwd_prepare_d2h_stream is None or self.publish_ready is None:
            batch.seq_lens_cpu = batch.seq_lens.cpu()  # bootstrap / non-CUDA
            batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
            return

        self.fwd_prepare_d2h_stream.synchronize()
        batch.seq_lens_cpu = self.new_seq_lens_cpu_pinned[batch.req_pool_indices_cpu]
        batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
"""


def test_future_map_sync_is_gated_when_the_tree_has_it():
    out = apply(sync.GateFutureMapSync, FUTURE_MAP)
    assert (
        block(
            """
                batch.seq_lens = self.new_seq_lens_buf[fi]

                # patchkit (sglang #26128): no attention backend reads the CPU mirror;
                # the GPU seq_lens are already advanced, skip the D2H copy and sum.
                if not needs_cpu_seq_lens():
                    batch.seq_lens_cpu = None
                    batch.seq_lens_sum = None
                    return

                if self.fwd_prepare_d2h_stream is None or self.publish_ready is None:
        """,
            8,
        )
        in out
    )
    # The old circular-buffer FutureMap (0.5.10 .. 0.5.12.post1) has no such method.
    old = "class FutureMap:\n    def resolve_future(self, model_worker_batch):\n        pass\n"
    assert_state(sync.GateFutureMapSync, old, State.SUPERSEDED)
    upstream = FUTURE_MAP.replace(
        "        batch.seq_lens = self.new_seq_lens_buf[fi]\n",
        "        batch.seq_lens = self.new_seq_lens_buf[fi]\n        if not self.needs_cpu_seq_lens:\n            return\n",
    )
    assert_state(sync.GateFutureMapSync, upstream, State.DONE)


SCHEDULE_BATCH = """
class ScheduleBatch:
    def filter_batch(self, keep_indices=None):
        self.seq_lens = self.seq_lens[keep_indices_device]
        self.seq_lens_cpu = self.seq_lens_cpu[keep_indices]
        self.seq_lens_sum = self.seq_lens.sum().item()

    def merge_batch(self, other: "ScheduleBatch"):
        self.seq_lens = torch.cat([self.seq_lens, other.seq_lens])
        self.seq_lens_cpu = torch.cat([self.seq_lens_cpu, other.seq_lens_cpu])
        self.seq_lens_sum += other.seq_lens_sum
"""


def test_filter_and_merge_batch():
    out = apply(guards.GuardFilterBatch, SCHEDULE_BATCH)
    assert "        self.seq_lens_cpu = index_or_none(self.seq_lens_cpu, keep_indices)\n" in out
    assert "        self.seq_lens_sum = self.seq_lens.sum().item()\n" in out  # a sync, not a crash: left
    out = apply(guards.GuardMergeBatch, out)
    assert out.startswith("from sglang.srt._patchkit.runtime import cat_or_none, index_or_none\n")
    assert "        self.seq_lens_cpu = cat_or_none(self.seq_lens_cpu, other.seq_lens_cpu)\n" in out
    # The sums are the deferral's (DeferFilterBatchSum, DeferMergeBatchSum), not a guard's.
    assert "        self.seq_lens_sum += other.seq_lens_sum\n" in out
    assert "        self.seq_lens = torch.cat([self.seq_lens, other.seq_lens])\n" in out


def test_upstream_guards_in_schedule_batch_are_done():
    upstream = """
    class ScheduleBatch:
        def filter_batch(self, keep_indices=None):
            if self.seq_lens_cpu is not None:
                self.seq_lens_cpu = self.seq_lens_cpu[keep_indices]
            self.seq_lens_sum = None

        def merge_batch(self, other):
            if self.seq_lens_cpu is None or other.seq_lens_cpu is None:
                self.seq_lens_cpu = None
            else:
                self.seq_lens_cpu = torch.cat([self.seq_lens_cpu, other.seq_lens_cpu])
            self.seq_lens_sum = None
    """
    assert_state(guards.GuardFilterBatch, upstream, State.DONE)
    assert_state(guards.GuardMergeBatch, upstream, State.DONE)


def test_an_unrelated_none_test_does_not_count_as_a_guard():
    src = """
    class ScheduleBatch:
        def filter_batch(self, keep_indices=None):
            if self.seq_lens_cpu is None:
                log("no mirror")
            self.seq_lens_cpu = self.seq_lens_cpu[keep_indices]
    """
    assert_state(guards.GuardFilterBatch, src, State.TODO)


def test_a_method_without_the_reads_is_missing():
    src = "class ScheduleBatch:\n    def filter_batch(self):\n        self.reqs = []\n"
    finding = detect(guards.GuardFilterBatch, src)
    assert finding.state is State.MISSING and finding.anchor == "ScheduleBatch.filter_batch"


DEFERRED = block(
    """
    # patchkit (sglang #25818): deferred; get_model_worker_batch computes the sum
    # from the host mirror (no device sync here).
    self.seq_lens_sum = None
    """,
    8,
)


def test_filter_merge_and_decode_defer_the_sum():
    src = """
    class ScheduleBatch:
        def prepare_for_decode(self):
            bs = len(self.reqs)
            if not self.spec_algorithm.is_none():
                return
            self.seq_lens_cpu.add_(1)
            # keep the sum
            self.seq_lens_sum += bs

        def filter_batch(self, keep_indices=None):
            self.seq_lens = self.seq_lens[keep_indices_device]
            self.seq_lens_sum = self.seq_lens.sum().item()
            self.output_ids = None

        def merge_batch(self, other):
            self.seq_lens_sum += other.seq_lens_sum
    """
    out = apply(deferred.DeferDecodeSum, src)
    out = apply(deferred.DeferFilterBatchSum, out)
    out = apply(deferred.DeferMergeBatchSum, out)
    assert "seq_lens_sum +=" not in out and ".item()" not in out
    assert out.count("        self.seq_lens_sum = None\n") == 3
    assert (
        "        self.seq_lens_cpu.add_(1)\n        # keep the sum\n" + DEFERRED in out
    )  # its comment kept above ours
    assert (
        "        self.seq_lens = self.seq_lens[keep_indices_device]\n" + DEFERRED + "        self.output_ids = None\n"
        in out
    )
    assert "    def merge_batch(self, other):\n" + DEFERRED in out


def test_deferral_after_the_merge_guard_and_upstream_shapes():
    # A merge already guarded (a fork's None-aware sum) still defers.
    guarded = """
    class ScheduleBatch:
        def merge_batch(self, other):
            self.seq_lens_sum = add_or_none(self.seq_lens_sum, other.seq_lens_sum)
    """
    assert DEFERRED in apply(deferred.DeferMergeBatchSum, guarded)
    upstream = """
    class ScheduleBatch:
        def prepare_for_decode(self):
            self.seq_lens_cpu.add_(1)
            # Sum is recomputed lazily by ForwardBatch.init_new.
            self.seq_lens_sum = None

        def filter_batch(self, keep_indices=None):
            self.seq_lens_sum = None

        def merge_batch(self, other):
            self.seq_lens_sum = None
    """
    for codemod in (deferred.DeferDecodeSum, deferred.DeferFilterBatchSum, deferred.DeferMergeBatchSum):
        assert_state(codemod, upstream, State.DONE)
    # A fork that keeps no sum in the method: nothing to defer.
    assert_state(
        deferred.DeferFilterBatchSum,
        "class ScheduleBatch:\n    def filter_batch(self):\n        self.reqs = []\n",
        State.SUPERSEDED,
    )
    # `x.seq_lens_sum = ...` on another object is not the batch's own sum.
    other = "class ScheduleBatch:\n    def merge_batch(self, other):\n        other.seq_lens_sum = 0\n        self.seq_lens_sum = None\n"
    assert_state(deferred.DeferMergeBatchSum, other, State.DONE)


WORKER_BATCH = """
class ScheduleBatch:
    def get_model_worker_batch(self, seq_lens_cpu_cache=None):
        seq_lens_cpu = (
            seq_lens_cpu_cache if seq_lens_cpu_cache is not None else self.seq_lens_cpu
        )

        return ModelWorkerBatch(
            seq_lens_cpu=seq_lens_cpu,
            seq_lens_sum=self.seq_lens_sum,
        )
"""


def test_the_deferred_sum_is_filled_from_the_host_mirror():
    assert_codemod(
        deferred.FillDeferredSum,
        WORKER_BATCH,
        """
        class ScheduleBatch:
            def get_model_worker_batch(self, seq_lens_cpu_cache=None):
                seq_lens_cpu = (
                    seq_lens_cpu_cache if seq_lens_cpu_cache is not None else self.seq_lens_cpu
                )

                # patchkit (sglang #25818): filter_batch / merge_batch / prepare_for_decode
                # defer seq_lens_sum; compute it here from the host mirror (no device sync).
                if self.seq_lens_sum is None and seq_lens_cpu is not None:
                    self.seq_lens_sum = int(seq_lens_cpu.sum())

                return ModelWorkerBatch(
                    seq_lens_cpu=seq_lens_cpu,
                    seq_lens_sum=self.seq_lens_sum,
                )
        """,
    )


def test_filling_the_sum_needs_its_anchors_and_upstream_folded_it_away():
    no_mirror = "class ScheduleBatch:\n    def get_model_worker_batch(self):\n        return ModelWorkerBatch(seq_lens_sum=self.seq_lens_sum)\n"
    finding = detect(deferred.FillDeferredSum, no_mirror)
    assert finding.state is State.MISSING and "no local `seq_lens_cpu`" in finding.detail
    finding = detect(
        deferred.FillDeferredSum, "class ScheduleBatch:\n    def get_model_worker_batch(self):\n        return None\n"
    )
    assert finding.state is State.MISSING and "ModelWorkerBatch" in finding.detail
    # 0.5.13+: get_model_worker_batch was folded into ForwardBatch.init_new.
    assert_state(
        deferred.FillDeferredSum, "class ScheduleBatch:\n    def filter_batch(self):\n        pass\n", State.SUPERSEDED
    )


FORWARD_BATCH = """
class ForwardBatch:
    @classmethod
    def init_new(cls, batch: ModelWorkerBatch, model_runner: ModelRunner):
        ret = cls(seq_lens_sum=batch.seq_lens_sum, seq_lens_cpu=batch.seq_lens_cpu)
        if ret.forward_mode.is_decode() or ret.forward_mode.is_target_verify():
            ret.positions = clamp_position(batch.seq_lens)
        else:
            assert isinstance(batch.extend_seq_lens, list)
            assert isinstance(batch.extend_prefix_lens, list)
            ret.extend_seq_lens = torch.tensor(
                batch.extend_seq_lens, dtype=torch.int32
            ).to(device, non_blocking=True)
            ret.extend_prefix_lens = torch.tensor(
                batch.extend_prefix_lens, dtype=torch.int32
            ).to(device, non_blocking=True)
            ret.extend_prefix_lens_cpu = batch.extend_prefix_lens
            ret.extend_seq_lens_cpu = batch.extend_seq_lens
            ret.extend_logprob_start_lens_cpu = batch.extend_logprob_start_lens
        return ret

    def _pad_inputs_to_size(self, model_runner, num_tokens, bs):
        seq_len_fill_value = model_runner.attn_backend.get_cuda_graph_seq_len_fill_value()
        self.seq_lens_sum = self.seq_lens_sum + seq_len_fill_value * (
            bs - self.seq_lens.shape[0]
        )
        if self.seq_lens_cpu is not None:
            self.seq_lens_cpu = self._pad_tensor_to_size(self.seq_lens_cpu, bs)
"""


def test_init_new_takes_device_extend_lens():
    out = apply(guards.GuardInitNewExtendLens, FORWARD_BATCH)
    assert (
        block(
            """
                    assert isinstance(batch.extend_seq_lens, (list, torch.Tensor))
                    assert isinstance(batch.extend_prefix_lens, (list, torch.Tensor))
                    ret.extend_seq_lens = torch.as_tensor(
                        batch.extend_seq_lens, dtype=torch.int32
                    ).to(device, non_blocking=True)
                    ret.extend_prefix_lens = torch.as_tensor(
                        batch.extend_prefix_lens, dtype=torch.int32
                    ).to(device, non_blocking=True)
                    ret.extend_prefix_lens_cpu = host_list_or_none(batch.extend_prefix_lens)
                    ret.extend_seq_lens_cpu = host_list_or_none(batch.extend_seq_lens)
        """,
            12,
        )
        in out
    )
    # The decode/verify pass-through is untouched.
    assert "ret = cls(seq_lens_sum=batch.seq_lens_sum, seq_lens_cpu=batch.seq_lens_cpu)" in out


def test_pad_inputs_pads_the_sum_only_when_there():
    out = apply(guards.GuardPadInputs, FORWARD_BATCH)
    assert "self.seq_lens_sum = add_or_none(self.seq_lens_sum, seq_len_fill_value * (" in out


def test_upstream_init_new_and_pad_are_done():
    upstream = """
    class ForwardBatch:
        @classmethod
        def init_new(cls, batch, model_runner):
            if isinstance(extend_seq_lens, list):
                ret.extend_seq_lens = torch.tensor(extend_seq_lens, dtype=torch.int32)
            else:
                ret.extend_seq_lens = extend_seq_lens

        def _pad_inputs_to_size(self, model_runner, num_tokens, bs):
            if self.seq_lens_sum is not None:
                self.seq_lens_sum = self.seq_lens_sum + fill * (bs - self.seq_lens.shape[0])
    """
    assert_state(guards.GuardInitNewExtendLens, upstream, State.DONE)
    assert_state(guards.GuardPadInputs, upstream, State.DONE)


GRAPH_RUNNER = """
class CudaGraphRunner:
    def replay_prepare(self, forward_batch, pp_proxy_tensors=None):
        attn_backend.init_forward_metadata_replay_cuda_graph(
            bs,
            buffers.req_pool_indices[:bs],
            buffers.seq_lens[:bs],
            forward_batch.seq_lens_sum + (bs - raw_bs) * self.seq_len_fill_value,
            None,
            seq_lens_cpu=buffers.seq_lens_cpu[:bs],
        )
"""


def test_graph_runner_replay_pads_the_sum_only_when_there():
    out = apply(guards.GuardGraphReplay, GRAPH_RUNNER)
    assert "            add_or_none(forward_batch.seq_lens_sum, (bs - raw_bs) * self.seq_len_fill_value),\n" in out


def test_graph_runner_moved_upstream_is_done():
    upstream = """
    def build_replay_fb_view(forward_batch, bs, raw_bs, seq_len_fill_value):
        return ForwardBatch(
            seq_lens_sum=(None if forward_batch.seq_lens_sum is None else forward_batch.seq_lens_sum + (bs - raw_bs) * seq_len_fill_value),
        )


    class CudaGraphRunner:
        def replay_prepare(self, forward_batch, pp_proxy_tensors=None):
            view = build_replay_fb_view(forward_batch, bs, raw_bs, self.seq_len_fill_value)
    """
    finding = detect(guards.GuardGraphReplay, upstream)
    assert finding.state is State.DONE and "build_replay_fb_view" in finding.detail


DRAFT_EXTEND_RUNNER = """
class EAGLEDraftExtendCudaGraphRunner:
    def replay(self, forward_batch: ForwardBatch):
        self.draft_extend_attn_backend.init_forward_metadata_replay_cuda_graph(
            bs=bs,
            seq_lens_sum=forward_batch.seq_lens_sum
            + (bs - raw_bs) * self.seq_len_fill_value,
            encoder_lens=None,
        )
"""


def test_draft_extend_graph_replay_and_its_later_name():
    out = apply(guards.GuardDraftExtendGraphReplay, DRAFT_EXTEND_RUNNER)
    assert (
        "            seq_lens_sum=add_or_none(forward_batch.seq_lens_sum, (bs - raw_bs) * self.seq_len_fill_value),\n"
        in out
    )
    renamed = """
    class EAGLEDraftExtendCudaGraphRunner:
        def execute(self, forward_batch):
            seq_lens_sum = forward_batch.seq_lens_sum
            if seq_lens_sum is not None:
                seq_lens_sum = seq_lens_sum + (bs - raw_bs) * self.seq_len_fill_value
    """
    assert_state(guards.GuardDraftExtendGraphReplay, renamed, State.DONE)


DRAFT_WORKER = """
class EagleDraftWorker(BaseDraftWorker):
    def draft(self, model_worker_batch: ModelWorkerBatch):
        tree_mask_buf, position_buf = (
            self.target_worker.model_runner.attn_backend.get_verify_buffers_to_fill_after_draft()
        )

        (tree_mask, position, draft_tokens) = build_tree_kernel_efficient(
            draft_input.bonus_tokens,
            model_worker_batch.seq_lens,
            model_worker_batch.seq_lens_sum,
            self.topk,
            tree_mask_buf,
            position_buf,
        )
        return EagleVerifyInput(seq_lens_sum=None, seq_lens_cpu=None)
"""


def test_draft_tree_mask_size_without_the_mirror():
    out = apply(guards.GuardDraftTreeMask, DRAFT_WORKER)
    assert (
        "            tree_mask_seq_lens_sum(model_worker_batch.seq_lens_sum, tree_mask_buf, "
        "model_worker_batch.seq_lens, self.target_worker.model_runner.attn_backend, model_worker_batch),\n"
    ) in out
    # Only the kernel's argument: the verify input's keyword stays.
    assert "return EagleVerifyInput(seq_lens_sum=None, seq_lens_cpu=None)" in out


def test_draft_tree_mask_upstream_and_moved_out():
    upstream = """
    class EagleDraftWorker:
        def draft(self, batch):
            seq_lens_sum = batch.seq_lens_sum
            if seq_lens_sum is None:
                seq_lens_sum = 0
            build_tree_kernel_efficient(batch.seq_lens, seq_lens_sum)
    """
    assert_state(guards.GuardDraftTreeMask, upstream, State.DONE)
    moved = "class EagleDraftWorker:\n    def draft(self, batch):\n        return build_eagle_verify_input(batch)\n"
    assert_state(guards.GuardDraftTreeMask, moved, State.SUPERSEDED)


DRAFT_EXTEND_PREP = """
class EagleDraftInputV2Mixin:
    def prepare_for_extend_to_fill_draft_kvcache(self, batch, predict, num_draft_tokens, draft_model_runner, cuda_graph_runner):
        seq_lens_cpu_ = batch.seq_lens_cpu
        extend_num_tokens = len(batch.seq_lens) * num_draft_tokens

        batch.spec_info = self
        batch.input_ids = predict
        batch.seq_lens = batch.seq_lens + num_draft_tokens
        batch.seq_lens_cpu = batch.seq_lens_cpu + num_draft_tokens
        batch.seq_lens_sum += extend_num_tokens
        batch.extend_seq_lens = [num_draft_tokens for _ in range(len(batch.seq_lens))]
        batch.extend_prefix_lens = seq_lens_cpu_.tolist()
        batch.extend_num_tokens = extend_num_tokens
        forward_batch = ForwardBatch.init_new(batch, draft_model_runner)
        return forward_batch
"""


def test_draft_extend_preparation_gpu_only_path():
    out = apply(guards.GuardDraftExtendPrep, DRAFT_EXTEND_PREP)
    assert (
        block(
            """
                batch.seq_lens = batch.seq_lens + num_draft_tokens
                batch.seq_lens_cpu = add_or_none(batch.seq_lens_cpu, num_draft_tokens)
                batch.seq_lens_sum = add_or_none(batch.seq_lens_sum, extend_num_tokens)
                batch.extend_seq_lens = [num_draft_tokens for _ in range(len(batch.seq_lens))]
                batch.extend_prefix_lens = draft_extend_prefix_lens(seq_lens_cpu_, batch.seq_lens, num_draft_tokens)
        """,
            8,
        )
        in out
    )


def test_draft_extend_preparation_without_its_anchor_is_missing():
    src = DRAFT_EXTEND_PREP.replace("        batch.seq_lens = batch.seq_lens + num_draft_tokens\n", "")
    finding = detect(guards.GuardDraftExtendPrep, src)
    assert finding.state is State.MISSING


TRITON = """
class TritonAttnBackend(AttentionBackend):
    def init_forward_metadata(self, forward_batch: ForwardBatch):
        bs = forward_batch.batch_size
        if forward_batch.forward_mode.is_decode_or_idle():
            if spec_info is None:
                kv_indices = torch.empty(
                    forward_batch.seq_lens_sum, dtype=torch.int64, device=self.device
                )
        else:
            kv_indices = torch.empty(
                sum(forward_batch.extend_prefix_lens_cpu),
                dtype=torch.int64,
                device=self.device,
            )
            max_extend_len = max(forward_batch.extend_seq_lens_cpu)


class TritonMultiStepDraftBackend:
    def common_template(self, forward_batch, kv_indices_buffer, call_fn):
        num_seqs = forward_batch.batch_size
        bs = self.topk * num_seqs
        seq_lens_sum = forward_batch.seq_lens_sum
        for i in range(self.speculative_num_steps - 1):
            forward_batch.spec_info.kv_indices = kv_indices_buffer[i][: seq_lens_sum * self.topk + bs * (i + 1)]
"""


def test_triton_metadata_upper_bounds():
    out = apply(guards.GuardTritonMetadata, TRITON)
    assert (
        "seq_lens_sum_or_bound(forward_batch.seq_lens_sum, forward_batch.batch_size, self.max_context_len, forward_batch), dtype=torch.int64"
        in out
    )
    assert (
        "                prefix_lens_sum_or_bound(forward_batch.extend_prefix_lens_cpu, forward_batch.batch_size, self.max_context_len, forward_batch),\n"
        in out
    )
    # The local keeps its name; the helper has another (no shadowing).
    assert (
        "            max_extend_len = max_of_extend_lens(forward_batch.extend_seq_lens_cpu, forward_batch.extend_seq_lens)\n"
        in out
    )
    out = apply(guards.GuardTritonDraftTemplate, out)
    assert (
        "        seq_lens_sum = seq_lens_sum_or_bound(forward_batch.seq_lens_sum, forward_batch.batch_size, self.max_context_len, forward_batch)\n"
        in out
    )


def test_triton_upstream_shapes_are_done():
    upstream = """
    class TritonAttnBackend(AttentionBackend):
        def init_forward_metadata(self, forward_batch):
            if forward_batch.extend_prefix_lens_cpu is not None:
                kv_indices_len = sum(forward_batch.extend_prefix_lens_cpu)
            else:
                kv_indices_len = bs * self.max_context_len
            if forward_batch.extend_seq_lens_cpu is not None:
                max_extend_len = max(forward_batch.extend_seq_lens_cpu)
            else:
                max_extend_len = int(forward_batch.extend_seq_lens.max())


    class TritonMultiStepDraftBackend:
        def common_template(self, forward_batch, kv_indices_buffer, call_fn):
            seq_lens_sum = forward_batch.seq_lens_sum
            if seq_lens_sum is None:
                seq_lens_sum = num_seqs * self.max_context_len
    """
    assert_state(guards.GuardTritonMetadata, upstream, State.DONE)
    assert_state(guards.GuardTritonDraftTemplate, upstream, State.DONE)


METRICS = """
class SchedulerMetricsMixin:
    def _build_scheduled_request_metrics(self, batch):
        decode_kv = WelfordAccumulator()
        if batch.forward_mode.is_decode():
            for sl in batch.seq_lens_cpu:
                decode_kv.add(int(sl))

    def _estimate_decode_perf(self, batch, tokens):
        total_context = float(batch.seq_lens_cpu.sum().item())
        return total_context

    def report_decode_stats(self, can_run_cuda_graph, running_batch=None):
        batch = running_batch or self.running_batch
        if self.current_scheduler_metrics_enabled:
            self.stats.decode_sum_seq_lens = batch.seq_lens_cpu.sum().item()
"""


def test_decode_metrics_without_device_sync():
    out = apply(guards.GuardDecodePerfMetrics, METRICS)
    assert "        total_context = float(decode_total_seq_lens(batch))\n" in out
    out = apply(guards.GuardDecodeStats, out)
    assert "            self.stats.decode_sum_seq_lens = decode_total_seq_lens(batch)\n" in out
    out = apply(guards.GuardScheduledRequestMetrics, out)
    assert "            for sl in decode_seq_lens(batch):\n                decode_kv.add(int(sl))\n" in out
    older = METRICS.replace("_build_scheduled_request_metrics", "_other")
    assert_state(guards.GuardScheduledRequestMetrics, older, State.SUPERSEDED)


def test_every_codemod_is_declared_once_with_a_description():
    patch = registry.by_id(PID)
    assert patch.upstream == ("sglang#26128", "sglang#26738", "sglang#25818") and patch.requires == ()
    declared = [c for t in patch.targets for c in t.codemods]
    assert len(declared) == len(set(declared))
    mine = {
        obj
        for module in (flags, sync, guards, deferred)
        for obj in vars(module).values()
        if isinstance(obj, type) and obj.__module__ == module.__name__ and getattr(obj, "DESCRIPTION", "")
    }
    assert mine == set(declared)
    for target in patch.targets:
        for codemod in target.codemods:
            assert codemod.DESCRIPTION
