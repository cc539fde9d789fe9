"""sglang #26128 + #26738, part 3: every consumer of the CPU mirror copes with None.

When the decision says no backend needs it, spec-v2 decode leaves ``seq_lens_cpu`` /
``seq_lens_sum`` None. Each read of them on the spec-v2 decode, draft, draft-extend and verify paths
becomes a call to a None-aware helper of ``patchkit.runtime`` that computes exactly the old value
when the mirror is there, and a GPU-only value or a static upper bound when it is not.

Every site is the same kind of edit: one ``Guard`` (a matcher for the read, optionally limited to the inside
of an enclosing node, and the expression that replaces it), applied with ``primitives.rewrite_expressions``. A
codemod is one method and its guards (``method_guards.MethodGuards``, here ``MirrorGuards``). It is done when none of
its reads is left unguarded and a helper call (ours), the method's upstream guard (0.5.13+) or a fork's own
None tests (any form: ``primitives.NoneGuards``) are there.

The sites, found by reading 0.5.10 .. 0.5.12.post1 (``docs/research/needs-cpu-seq-lens.md``), are
the classes below, in the order a decode step reaches them.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import host_copies, primitives
from patchkit.codemods.common.base import Finding, State
from patchkit.codemods.common.method_guards import Guard
from patchkit.codemods.common.metrics_guards import MIRROR_TOTAL, MetricsGuards, ReporterGuards
from patchkit.codemods.common.primitives import ANY, attr, call, none_test, save
from patchkit.codemods.common.shared import MirrorGuards

# `A + B` where A is the mirror: None-aware addition (an AugAssign becomes an Assign).
ADD_TEMPLATE = "add_or_none(LEFT, RIGHT)"


def add_guard(left: primitives.Expr) -> Guard:
    # `left + pad`, `pad + left`, `torch.add(...)`: the None-able value stays LEFT (primitives.added).
    return Guard(primitives.added(left), ADD_TEMPLATE, "add_or_none")


def aug_add_guard(target: primitives.Field[m.BaseAssignTargetExpressionMatchType]) -> Guard:
    site = m.AugAssign(target=save(target, "T"), operator=m.AddAssign(), value=save(ANY, "V"))
    return Guard(site, "T = add_or_none(T, V)", "add_or_none")


# -- managers/schedule_batch.py: ScheduleBatch ---------------------------------------------------------


class GuardFilterBatch(MirrorGuards):
    DESCRIPTION = "ScheduleBatch.filter_batch: seq_lens_cpu[keep_indices] -> index_or_none(...)"
    CLASS = "ScheduleBatch"
    METHOD = "filter_batch"
    GUARDS = (
        Guard(
            m.Subscript(
                value=save(attr("seq_lens_cpu"), "MIRROR"),
                slice=[m.SubscriptElement(slice=m.Index(value=save(ANY, "INDEX")))],
            ),
            "index_or_none(MIRROR, INDEX)",
            "index_or_none",
        ),
    )
    UPSTREAM = none_test(attr("seq_lens_cpu"))


class GuardMergeBatch(MirrorGuards):
    DESCRIPTION = "ScheduleBatch.merge_batch: torch.cat of the mirrors -> cat_or_none"
    CLASS = "ScheduleBatch"
    METHOD = "merge_batch"
    # `seq_lens_sum += other.seq_lens_sum` is not guarded here: the patch defers
    # that sum (needs_cpu_seq_lens_deferred_sum.DeferMergeBatchSum).
    GUARDS = (
        Guard(
            call(
                "torch.cat",
                m.Arg(
                    value=m.List(
                        elements=[
                            m.Element(value=save(attr("seq_lens_cpu"), "A")),
                            m.Element(value=save(attr("seq_lens_cpu"), "B")),
                        ]
                    )
                ),
            ),
            "cat_or_none(A, B)",
            "cat_or_none",
        ),
    )
    UPSTREAM = none_test(attr("seq_lens_cpu"))


# -- model_executor/forward_batch_info.py: ForwardBatch ----------------------------------------------------

EXTEND_LENS = "extend_seq_lens|extend_prefix_lens"


class GuardInitNewExtendLens(MirrorGuards):
    DESCRIPTION = (
        "ForwardBatch.init_new (extend branch, where DRAFT_EXTEND_V2 lands): extend lens may be "
        "device tensors (GPU-only draft extend): isinstance accepts them, torch.as_tensor keeps "
        "them on the device, their *_cpu host lists stay None"
    )
    CLASS = "ForwardBatch"
    METHOD = "init_new"
    GUARDS = (
        Guard(
            call("isinstance", m.Arg(value=save(attr(EXTEND_LENS), "LENS")), m.Arg(value=m.Name("list"))),
            "isinstance(LENS, (list, torch.Tensor))",
        ),
        Guard(
            m.Attribute(value=m.Name("torch"), attr=m.Name("tensor")),
            "torch.as_tensor",
            within=call("torch.tensor", m.Arg(value=attr(EXTEND_LENS)), m.ZeroOrMore()),
        ),
        Guard(
            save(attr(EXTEND_LENS), "LENS"),
            "host_list_or_none(LENS)",
            "host_list_or_none",
            within=m.Assign(
                targets=[m.AssignTarget(target=attr("extend_seq_lens_cpu|extend_prefix_lens_cpu"))],
                value=attr(EXTEND_LENS),
            ),
        ),
    )
    UPSTREAM_MARKER = m.If(test=call("isinstance", m.Arg(), m.Arg(value=m.Name("list"))))
    # A fork pinning its own copy (issue 69): `.pin_memory()` of the device lengths would raise.
    REPLACES_VENDOR = (
        (
            r"\.?pin_memory",
            "the fork's pinned copy of the extend lengths becomes pinned_tensor(LENS, ..., pin_for=D): a host "
            "list pinned as the fork did, the GPU-only draft extend's device lengths kept (.pin_memory() raises)",
        ),
    )

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        for copy in primitives.find_all_of(cst.Call, fn, OWN_PINNED_COPY):
            pin = cst.ensure_type(cst.ensure_type(copy.func, cst.Attribute).value, cst.Call)  # BUILD(...).pin_memory()
            build = cst.ensure_type(cst.ensure_type(pin.func, cst.Attribute).value, cst.Call)
            device = host_copies.copy_device(copy)
            if device is None:  # no device named: left to the postcondition, which refuses
                continue
            pinned = host_copies.pinned_build(build, device)
            fn = primitives.replace_node(fn, copy, copy.with_changes(func=copy.func.with_changes(value=pinned)))
            self.require_import(host_copies.HELPERS, host_copies.PINNED_TENSOR)
        return super().transform_method(fn)


#: A fork's own pinned copy (0.5.7, 0.5.12.post1 forks): ``torch.tensor(LENS, ...).pin_memory().to(D, ...)``.
OWN_PINNED_COPY = primitives.method_call(
    "to", m.Call(func=attr("pin_memory", call("torch.tensor", m.Arg(value=attr(EXTEND_LENS)), m.ZeroOrMore())), args=[])
)


class GuardPadInputs(MirrorGuards):
    DESCRIPTION = "ForwardBatch._pad_inputs_to_size (DP attention padding): seq_lens_sum + pad -> add_or_none"
    CLASS = "ForwardBatch"
    METHOD = "_pad_inputs_to_size"
    # 0.5.4 .. 0.5.5.post3: the padding is inline in prepare_mlp_sync_batch
    RENAMED = ("prepare_mlp_sync_batch",)
    GUARDS = (add_guard(attr("seq_lens_sum")),)
    UPSTREAM = none_test(attr("seq_lens_sum"))


# -- model_executor/cuda_graph_runner.py and the draft-extend graph runner ----------------------------------


class GuardGraphReplay(MirrorGuards):
    DESCRIPTION = "CudaGraphRunner.replay_prepare (verify graph): padded seq_lens_sum -> add_or_none"
    CLASS = "CudaGraphRunner"
    METHOD = "replay_prepare"
    GUARDS = (add_guard(attr("seq_lens_sum")),)
    # 0.5.13: `seq_lens_sum=(None if forward_batch.seq_lens_sum is None else ...)`
    UPSTREAM_MARKER = m.IfExp(test=m.Comparison(left=attr("seq_lens_sum")))
    UPSTREAM_FUNCTION = "build_replay_fb_view"


class GuardDraftExtendGraphReplay(MirrorGuards):
    DESCRIPTION = "EAGLEDraftExtendCudaGraphRunner.replay: padded seq_lens_sum -> add_or_none"
    CLASS = "EAGLEDraftExtendCudaGraphRunner"
    METHOD = "replay"
    RENAMED = ("execute",)  # 0.5.14+
    GUARDS = (add_guard(attr("seq_lens_sum")),)
    UPSTREAM_MARKER = none_test(m.Name("seq_lens_sum"))
    # A fork's runner with upstream's guard and a padded sum of its own beside it: that
    # read is the vendor's, in the shape the release's runner has; guarded there too.
    REPLACES_VENDOR = (
        (
            r"seq_lens_sum",
            "the vendor's padded sum of the mirror, in the shape the release's runner has, becomes "
            "add_or_none (the same value with the mirror, None without it); the vendor's statement stays",
        ),
    )

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        finding = super().detect_in_method(fn)
        if finding.state is State.DONE and primitives.contains(fn, self.UPSTREAM_MARKER):
            left = [read for guard in self.GUARDS for read in self._unguarded(fn, guard)]
            if left:
                return Finding.todo(
                    self.anchor_of(fn),
                    f"{len(left)} read(s) of {self.READS} beside upstream's guard, "
                    f"in the shape the release's runner has (first at {self.where(left[0])})",
                )
            ours = primitives.find_all(fn, primitives.call("add_or_none"))
            if ours:  # said in status's notes: the vendor's code is kept, and guarded
                return Finding.done(
                    self.anchor_of(fn),
                    f"the vendor's own padded sum at {self.where(ours[0])} is kept, "
                    "guarded by add_or_none beside upstream's guard",
                    by_tree=True,
                )
        return finding


# -- speculative/eagle_worker_v2.py: EagleDraftWorker.draft ------------------------------------------------

TREE_KERNEL = "build_tree_kernel_efficient"


class GuardDraftTreeMask(MirrorGuards):
    DESCRIPTION = (
        f"EagleDraftWorker.draft: {TREE_KERNEL}'s seq_lens_sum -> tree_mask_seq_lens_sum "
        "(no mirror: 0 with a preallocated tree mask, else bs * max_context_len)"
    )
    CLASS = "EagleDraftWorker"
    METHOD = "draft"
    GUARDS = (
        Guard(
            save(attr("seq_lens_sum", save(ANY, "BATCH")), "SUM"),
            "tree_mask_seq_lens_sum(SUM, BUF, BATCH.seq_lens, BACKEND, BATCH)",
            "tree_mask_seq_lens_sum",
            within=call(TREE_KERNEL, m.ZeroOrMore(), m.Arg(value=attr("seq_lens_sum")), m.ZeroOrMore()),
            # `tree_mask_buf, position_buf = <backend>.get_verify_buffers_to_fill_after_draft()`
            context=m.Assign(
                targets=[
                    m.AssignTarget(target=m.Tuple(elements=[m.Element(value=save(m.Name(), "BUF")), m.ZeroOrMore()]))
                ],
                value=m.Call(func=attr("get_verify_buffers_to_fill_after_draft", save(ANY, "BACKEND"))),
            ),
        ),
    )
    UPSTREAM_MARKER = none_test(m.Name("seq_lens_sum"))
    FOLLOW_DECORATORS = True  # a fork's @draft_wrapper builds the tree mask (issue 69)
    READS_WHOLE = "a decorator of draft it follows may be any function of the module (a fork's @draft_wrapper)"
    MOVED_OUT = (
        call("build_eagle_verify_input"),
        "the tree-mask build moved to eagle_worker_common.build_eagle_verify_input (upstream, 0.5.16+)",
    )


# -- speculative/eagle_info_v2.py: the draft extend after verify ----------------------------------------


class GuardDraftExtendPrep(MirrorGuards):
    DESCRIPTION = (
        "EagleDraftInputV2Mixin.prepare_for_extend_to_fill_draft_kvcache: GPU-only draft extend "
        "(mirror and sum advance only when present; prefix lens from the device seq_lens, no copy; "
        "extend_seq_lens stays the host list [num_draft_tokens] * bs, so extend_seq_lens_cpu is supplied)"
    )
    CLASS = "EagleDraftInputV2Mixin"
    METHOD = "prepare_for_extend_to_fill_draft_kvcache"
    GUARDS = (
        add_guard(attr("seq_lens_cpu")),
        aug_add_guard(attr("seq_lens_sum")),
        Guard(
            m.Call(func=attr("tolist", save(m.Name(), "MIRROR"))),
            "draft_extend_prefix_lens(MIRROR, BATCH.seq_lens, NUM_DRAFT)",
            "draft_extend_prefix_lens",
            within=m.Assign(targets=[m.AssignTarget(target=attr("extend_prefix_lens"))]),
            # `batch.seq_lens = batch.seq_lens + num_draft_tokens`
            context=m.Assign(
                targets=[m.AssignTarget(target=attr("seq_lens", save(m.Name(), "BATCH")))],
                value=m.BinaryOperation(left=attr("seq_lens"), operator=m.Add(), right=save(ANY, "NUM_DRAFT")),
            ),
        ),
    )
    UPSTREAM_MARKER = m.Name("gpu_only")
    WHY_ABSENT = "the draft-extend preparation moved out of eagle_info_v2 (upstream, 0.5.14+)"


# -- layers/attention/triton_backend.py (#26738: upper bounds instead of the mirror) ----------------------

SEQ_LENS_SUM_BOUND = "seq_lens_sum_or_bound(SUM, BATCH.batch_size, self.max_context_len, BATCH)"


class GuardTritonMetadata(MirrorGuards):
    DESCRIPTION = (
        "TritonAttnBackend.init_forward_metadata: kv_indices sized by an upper bound without the mirror; "
        "extend branch (draft extend): prefix sum and max extend len fall back when the host lists are None"
    )
    CLASS = "TritonAttnBackend"
    METHOD = "init_forward_metadata"
    GUARDS = (
        Guard(
            save(attr("seq_lens_sum", save(ANY, "BATCH")), "SUM"),
            SEQ_LENS_SUM_BOUND,
            "seq_lens_sum_or_bound",
            # The size as a vendor spells it too: `int(forward_batch.seq_lens_sum)`.
            within=call(
                "torch.empty", m.Arg(value=primitives.spelled(attr("seq_lens_sum"), slices=False)), m.ZeroOrMore()
            ),
        ),
        Guard(
            call("sum", m.Arg(value=save(attr("extend_prefix_lens_cpu", save(ANY, "BATCH")), "LENS"))),
            "prefix_lens_sum_or_bound(LENS, BATCH.batch_size, self.max_context_len, BATCH)",
            "prefix_lens_sum_or_bound",
        ),
        Guard(
            call("max", m.Arg(value=save(attr("extend_seq_lens_cpu", save(ANY, "BATCH")), "LENS"))),
            "max_of_extend_lens(LENS, BATCH.extend_seq_lens)",
            "max_of_extend_lens",
        ),
    )
    UPSTREAM = none_test(attr("seq_lens_sum|extend_prefix_lens_cpu|extend_seq_lens_cpu"))


class GuardTritonDraftTemplate(MirrorGuards):
    DESCRIPTION = "TritonMultiStepDraftBackend.common_template: kv_indices slice bounded by bs * max_context_len without the mirror"
    CLASS = "TritonMultiStepDraftBackend"
    METHOD = "common_template"
    GUARDS = (
        Guard(
            save(attr("seq_lens_sum", save(ANY, "BATCH")), "SUM"),
            SEQ_LENS_SUM_BOUND,
            "seq_lens_sum_or_bound",
            within=m.Assign(value=attr("seq_lens_sum")),
        ),
    )
    UPSTREAM_MARKER = none_test(m.Name("seq_lens_sum"))


# -- observability/scheduler_metrics_mixin.py: decode metrics ------------------------------------------


class GuardDecodePerfMetrics(MetricsGuards):
    DESCRIPTION = "SchedulerMetricsMixin._estimate_decode_perf: seq_lens_cpu.sum() -> decode_total_seq_lens (sum of req.seqlen without the mirror)"
    CLASS = "SchedulerMetricsMixin"
    METHOD = "_estimate_decode_perf"
    GUARDS = (Guard(MIRROR_TOTAL, "decode_total_seq_lens(BATCH)", "decode_total_seq_lens"),)


class GuardDecodeStats(MetricsGuards):
    DESCRIPTION = "SchedulerMetricsMixin.report_decode_stats: decode_sum_seq_lens = seq_lens_cpu.sum().item() -> decode_total_seq_lens"
    CLASS = "SchedulerMetricsMixin"
    METHOD = "report_decode_stats"
    GUARDS = (Guard(MIRROR_TOTAL, "decode_total_seq_lens(BATCH)", "decode_total_seq_lens"),)


class GuardScheduledRequestMetrics(MetricsGuards):
    DESCRIPTION = "SchedulerMetricsMixin._build_scheduled_request_metrics: for sl in seq_lens_cpu -> decode_seq_lens"
    CLASS = "SchedulerMetricsMixin"
    METHOD = "_build_scheduled_request_metrics"
    GUARDS = (
        Guard(
            attr("seq_lens_cpu", save(ANY, "BATCH")),
            "decode_seq_lens(BATCH)",
            "decode_seq_lens",
            within=m.For(iter=attr("seq_lens_cpu")),
        ),
    )
    WHY_ABSENT = "no forward-pass request metrics in this release (added in 0.5.12)"


class GuardLogDecodeStats(MetricsGuards):
    DESCRIPTION = (
        "SchedulerMetricsMixin.log_decode_stats (the decode metrics before 0.5.10, as forks that moved the mixin "
        "to observability/ early carry them): decode_sum_seq_lens = seq_lens_cpu.sum().item() -> decode_total_seq_lens"
    )
    CLASS = "SchedulerMetricsMixin"
    METHOD = "log_decode_stats"
    GUARDS = (Guard(MIRROR_TOTAL, "decode_total_seq_lens(BATCH)", "decode_total_seq_lens"),)
    WHY_ABSENT = "the decode metrics are report_decode_stats from 0.5.10 (log_decode_stats before)"


# -- managers/scheduler_components/metrics_reporter.py: the decode metrics from 0.5.13 ---------------------------------
# Forks taken from upstream between 0.5.12 and 0.5.13 have the reporter before
# sglang #26128 made its decode sums sync-free: the same reads as the mixin's.


class GuardReporterDecodePerf(ReporterGuards):
    DESCRIPTION = "SchedulerMetricsReporter._estimate_decode_perf: seq_lens_cpu.sum() -> decode_total_seq_lens"
    METHOD = "_estimate_decode_perf"
    GUARDS = GuardDecodePerfMetrics.GUARDS


class GuardReporterDecodeStats(ReporterGuards):
    DESCRIPTION = "SchedulerMetricsReporter.report_decode_stats: seq_lens_cpu.sum().item() -> decode_total_seq_lens"
    METHOD = "report_decode_stats"
    GUARDS = GuardDecodeStats.GUARDS


class GuardReporterScheduledRequestMetrics(ReporterGuards):
    DESCRIPTION = "SchedulerMetricsReporter._build_scheduled_request_metrics: for sl in seq_lens_cpu -> decode_seq_lens"
    METHOD = "_build_scheduled_request_metrics"
    GUARDS = GuardScheduledRequestMetrics.GUARDS
