"""sglang #26128 + #26738, part 3: every consumer of the CPU mirror copes with None.

When the decision says no backend needs it, spec-v2 decode leaves
``seq_lens_cpu`` / ``seq_lens_sum`` None. Each read of them on the spec-v2
decode, draft, draft-extend and verify paths becomes a call to a None-aware
helper of ``patchkit.runtime`` that computes exactly the old value when the
mirror is there, and a GPU-only value or a static upper bound when it is not.

Every site is the same kind of edit: one ``Guard`` (a matcher for the read,
optionally limited to the inside of an enclosing node, and the expression that
replaces it), applied with ``primitives.rewrite_expressions``. A codemod is one
method and its guards. It is done when none of its reads is left unguarded and
either a helper call (ours) or the method's upstream guard (0.5.13+) is there.

The sites, found by reading 0.5.10 .. 0.5.12.post1 (see
``docs/research/needs-cpu-seq-lens.md`` and the patch description), are listed
in the codemod classes below, in the order a decode step reaches them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

import libcst as cst
import libcst.matchers as m

from patchkit.codemods import primitives
from patchkit.codemods.base import ClassCodemod, Finding, State
from patchkit.vendoring import import_path

RUNTIME = import_path("runtime")


@dataclass(frozen=True)
class Guard:
    """Rewrite each ``site`` (inside a ``within`` node, when given) as
    ``template``, whose UPPERCASE names are the site's captures plus those of
    the method's first ``context`` match. ``helper`` is the patchkit.runtime
    function the template calls (imported by the patched file)."""

    site: m.BaseMatcherNode
    template: str
    helper: Optional[str] = None
    within: Optional[m.BaseMatcherNode] = None
    context: Optional[m.BaseMatcherNode] = None


# -- matcher vocabulary --------------------------------------------------------------------


def attr(name: str, receiver: m.BaseMatcherNode = m.DoNotCare()) -> m.Attribute:
    """``<receiver>.<name>``; ``name`` may be ``a|b`` for either."""
    names = [m.Name(n) for n in name.split("|")]
    one = names[0]
    for other in names[1:]:
        one = one | other
    return m.Attribute(value=receiver, attr=one)


def save(matcher: m.BaseMatcherNode, key: str) -> m.SaveMatchedNode:
    return m.SaveMatchedNode(matcher, key)


ANY = m.DoNotCare()


def call(func: str, *args: m.BaseMatcherNode) -> m.Call:
    """``func(args...)`` (``func`` dotted, e.g. ``torch.cat``); without args: any arguments."""
    parts = func.split(".")
    matcher: m.BaseMatcherNode = m.Name(parts[0])
    for part in parts[1:]:
        matcher = m.Attribute(value=matcher, attr=m.Name(part))
    if not args:
        return m.Call(func=matcher)
    return m.Call(func=matcher, args=list(args))


def plus(left: m.BaseMatcherNode) -> m.BinaryOperation:
    """``LEFT + RIGHT`` where the left operand matches ``left``."""
    return m.BinaryOperation(left=save(left, "LEFT"), operator=m.Add(), right=save(ANY, "RIGHT"))


def none_test(target: m.BaseMatcherNode) -> m.If:
    """``if <target> is None`` / ``is not None`` (alone or within and/or)."""
    comparison = m.Comparison(
        left=target,
        comparisons=[m.ComparisonTarget(operator=m.Is() | m.IsNot(), comparator=m.Name("None"))],
    )
    return m.If(test=comparison | m.BooleanOperation(left=comparison) | m.BooleanOperation(right=comparison))


# `A + B` where A is the mirror: None-aware addition (an AugAssign becomes an Assign).
ADD_TEMPLATE = "add_or_none(LEFT, RIGHT)"


def add_guard(left: m.BaseMatcherNode) -> Guard:
    return Guard(plus(left), ADD_TEMPLATE, "add_or_none")


def aug_add_guard(target: m.BaseMatcherNode) -> Guard:
    site = m.AugAssign(target=save(target, "T"), operator=m.AddAssign(), value=save(ANY, "V"))
    return Guard(site, "T = add_or_none(T, V)", "add_or_none")


# -- the codemod ------------------------------------------------------------------------------------


class MethodGuards(ClassCodemod):
    """The guards of one method. Subclasses set CLASS, METHOD, GUARDS and,
    where upstream guards the same reads its own way (0.5.13+), either
    UPSTREAM (a matcher for upstream's ``if``: reads inside one are guarded)
    or UPSTREAM_MARKER (a matcher for upstream's shape of the whole method,
    e.g. a None fallback on a local after the read: its presence means done).
    Where upstream reworked the code later:

    * RENAMED: later names of the method;
    * WHY_ABSENT: some releases lack the method (before it came, or after
      upstream moved it away): that part is superseded there, with this reason;
    * UPSTREAM_FUNCTION: a module function of the same file that upstream moved
      the read to (done when it has the UPSTREAM_MARKER);
    * MOVED_OUT: (matcher, reason): the method now delegates the read to code
      in another file (superseded when the method matches).
    """

    METHOD: ClassVar[str]
    GUARDS: ClassVar[tuple[Guard, ...]]
    UPSTREAM: ClassVar[Optional[m.BaseMatcherNode]] = None
    UPSTREAM_MARKER: ClassVar[Optional[m.BaseMatcherNode]] = None
    RENAMED: ClassVar[tuple[str, ...]] = ()
    WHY_ABSENT: ClassVar[str] = ""
    UPSTREAM_FUNCTION: ClassVar[str] = ""
    MOVED_OUT: ClassVar[Optional[tuple[m.BaseMatcherNode, str]]] = None

    @property
    def anchor(self) -> str:
        return f"{self.CLASS}.{self.METHOD}"

    def detect(self, module: cst.Module) -> Finding:
        finding = super().detect(module)
        if finding.state is State.MISSING and self.UPSTREAM_FUNCTION:
            moved = primitives.find_function(module, self.UPSTREAM_FUNCTION)
            if moved is not None and self.UPSTREAM_MARKER is not None and primitives.contains(moved, self.UPSTREAM_MARKER):
                return Finding.done(self.anchor, f"upstream's own guard, in {self.UPSTREAM_FUNCTION}()")
        return finding

    def _method(self, cls: cst.ClassDef) -> Optional[cst.FunctionDef]:
        return primitives.find_first_method(cls, (self.METHOD, *self.RENAMED))

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        fn = self._method(cls)
        if fn is None:
            if self.WHY_ABSENT:
                return Finding.superseded(self.anchor, self.WHY_ABSENT)
            return Finding.missing(self.anchor, "method not found")
        if self.UPSTREAM_MARKER is not None and primitives.contains(fn, self.UPSTREAM_MARKER):
            return Finding.done(self.anchor, "upstream's own guard")
        left = [g for g in self.GUARDS if self._unguarded(fn, g)]
        for guard in left:
            if guard.context is not None and not primitives.find_all(fn, guard.context):
                return Finding.missing(self.anchor, f"no statement matching {guard.context!r}")
        if left:
            count = sum(len(self._unguarded(fn, g)) for g in left)
            return Finding.todo(self.anchor, f"{count} unguarded read(s) of the CPU seq_lens mirror")
        if any(primitives.contains(fn, call(g.helper)) for g in self.GUARDS if g.helper):
            return Finding.done(self.anchor)
        if self.UPSTREAM is not None and primitives.contains(fn, self.UPSTREAM):
            return Finding.done(self.anchor, "upstream's own guard")
        if self.MOVED_OUT is not None and primitives.contains(fn, self.MOVED_OUT[0]):
            return Finding.superseded(self.anchor, self.MOVED_OUT[1])
        return Finding.missing(self.anchor, "the reads of seq_lens_cpu / seq_lens_sum this change guards are not there")

    def _unguarded(self, fn: cst.FunctionDef, guard: Guard) -> list[cst.CSTNode]:
        """The reads ``guard`` is for, less those upstream's guard (an ``if``
        matching UPSTREAM) already encloses."""
        found = primitives.find_all(fn, guard.site, guard.within)
        if found and self.UPSTREAM is not None:
            covered = {
                id(n) for outer in primitives.find_all(fn, self.UPSTREAM) for n in primitives.find_all(outer, guard.site, guard.within)
            }
            found = [n for n in found if id(n) not in covered]
        return found

    def transform_class(self, cls: cst.ClassDef) -> cst.ClassDef:
        return primitives.replace_method(cls, self._method(cls).name.value, self._guard)

    def _guard(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        # Guards with an unguarded read are applied to all their reads; one
        # inside an upstream-style guard is rewritten too, harmlessly (the
        # helper computes the same value there).
        for guard in self.GUARDS:
            if not self._unguarded(fn, guard):
                continue
            nodes = {}
            if guard.context is not None:
                nodes = m.extract(primitives.find_all(fn, guard.context)[0], guard.context)
            fn = primitives.rewrite_expressions(fn, guard.site, guard.template, within=guard.within, **nodes)
            if guard.helper:
                self.require_import(RUNTIME, guard.helper)
        return fn


# -- managers/schedule_batch.py: ScheduleBatch ---------------------------------------------------------


class GuardFilterBatch(MethodGuards):
    DESCRIPTION = "ScheduleBatch.filter_batch: seq_lens_cpu[keep_indices] -> index_or_none(...)"
    CLASS = "ScheduleBatch"
    METHOD = "filter_batch"
    GUARDS = (
        Guard(
            m.Subscript(value=save(attr("seq_lens_cpu"), "MIRROR"), slice=[m.SubscriptElement(slice=m.Index(value=save(ANY, "INDEX")))]),
            "index_or_none(MIRROR, INDEX)",
            "index_or_none",
        ),
    )
    UPSTREAM = none_test(attr("seq_lens_cpu"))


class GuardMergeBatch(MethodGuards):
    DESCRIPTION = "ScheduleBatch.merge_batch: torch.cat of the mirrors -> cat_or_none; seq_lens_sum += -> add_or_none"
    CLASS = "ScheduleBatch"
    METHOD = "merge_batch"
    GUARDS = (
        Guard(
            call("torch.cat", m.Arg(value=m.List(elements=[m.Element(value=save(attr("seq_lens_cpu"), "A")), m.Element(value=save(attr("seq_lens_cpu"), "B"))]))),
            "cat_or_none(A, B)",
            "cat_or_none",
        ),
        aug_add_guard(attr("seq_lens_sum")),
    )
    UPSTREAM = none_test(attr("seq_lens_cpu"))


# -- model_executor/forward_batch_info.py: ForwardBatch ----------------------------------------------------

EXTEND_LENS = "extend_seq_lens|extend_prefix_lens"


class GuardInitNewExtendLens(MethodGuards):
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
            within=m.Assign(targets=[m.AssignTarget(target=attr("extend_seq_lens_cpu|extend_prefix_lens_cpu"))], value=attr(EXTEND_LENS)),
        ),
    )
    UPSTREAM_MARKER = m.If(test=call("isinstance", m.Arg(), m.Arg(value=m.Name("list"))))


class GuardPadInputs(MethodGuards):
    DESCRIPTION = "ForwardBatch._pad_inputs_to_size (DP attention padding): seq_lens_sum + pad -> add_or_none"
    CLASS = "ForwardBatch"
    METHOD = "_pad_inputs_to_size"
    GUARDS = (add_guard(attr("seq_lens_sum")),)
    UPSTREAM = none_test(attr("seq_lens_sum"))


# -- model_executor/cuda_graph_runner.py and the draft-extend graph runner ----------------------------------


class GuardGraphReplay(MethodGuards):
    DESCRIPTION = "CudaGraphRunner.replay_prepare (verify graph): padded seq_lens_sum -> add_or_none"
    CLASS = "CudaGraphRunner"
    METHOD = "replay_prepare"
    GUARDS = (add_guard(attr("seq_lens_sum")),)
    # 0.5.13: `seq_lens_sum=(None if forward_batch.seq_lens_sum is None else ...)`
    UPSTREAM_MARKER = m.IfExp(test=m.Comparison(left=attr("seq_lens_sum")))
    UPSTREAM_FUNCTION = "build_replay_fb_view"


class GuardDraftExtendGraphReplay(MethodGuards):
    DESCRIPTION = "EAGLEDraftExtendCudaGraphRunner.replay: padded seq_lens_sum -> add_or_none"
    CLASS = "EAGLEDraftExtendCudaGraphRunner"
    METHOD = "replay"
    RENAMED = ("execute",)  # 0.5.14+
    GUARDS = (add_guard(attr("seq_lens_sum")),)
    UPSTREAM_MARKER = none_test(m.Name("seq_lens_sum"))


# -- speculative/eagle_worker_v2.py: EagleDraftWorker.draft ------------------------------------------------

TREE_KERNEL = "build_tree_kernel_efficient"


class GuardDraftTreeMask(MethodGuards):
    DESCRIPTION = (
        f"EagleDraftWorker.draft: {TREE_KERNEL}'s seq_lens_sum -> tree_mask_seq_lens_sum "
        "(no mirror: 0 with a preallocated tree mask, else bs * max_context_len)"
    )
    CLASS = "EagleDraftWorker"
    METHOD = "draft"
    GUARDS = (
        Guard(
            save(attr("seq_lens_sum", save(ANY, "BATCH")), "SUM"),
            "tree_mask_seq_lens_sum(SUM, BUF, BATCH.seq_lens, BACKEND)",
            "tree_mask_seq_lens_sum",
            within=call(TREE_KERNEL, m.ZeroOrMore(), m.Arg(value=attr("seq_lens_sum")), m.ZeroOrMore()),
            # `tree_mask_buf, position_buf = <backend>.get_verify_buffers_to_fill_after_draft()`
            context=m.Assign(
                targets=[m.AssignTarget(target=m.Tuple(elements=[m.Element(value=save(m.Name(), "BUF")), m.ZeroOrMore()]))],
                value=m.Call(func=attr("get_verify_buffers_to_fill_after_draft", save(ANY, "BACKEND"))),
            ),
        ),
    )
    UPSTREAM_MARKER = none_test(m.Name("seq_lens_sum"))
    MOVED_OUT = (
        call("build_eagle_verify_input"),
        "the tree-mask build moved to eagle_worker_common.build_eagle_verify_input (upstream, 0.5.16+)",
    )


# -- speculative/eagle_info_v2.py: the draft extend after verify ----------------------------------------


class GuardDraftExtendPrep(MethodGuards):
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

SEQ_LENS_SUM_BOUND = "seq_lens_sum_or_bound(SUM, BATCH.batch_size, self.max_context_len)"


class GuardTritonMetadata(MethodGuards):
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
            within=call("torch.empty", m.Arg(value=attr("seq_lens_sum")), m.ZeroOrMore()),
        ),
        Guard(
            call("sum", m.Arg(value=save(attr("extend_prefix_lens_cpu", save(ANY, "BATCH")), "LENS"))),
            "prefix_lens_sum_or_bound(LENS, BATCH.batch_size, self.max_context_len)",
            "prefix_lens_sum_or_bound",
        ),
        Guard(
            call("max", m.Arg(value=save(attr("extend_seq_lens_cpu", save(ANY, "BATCH")), "LENS"))),
            "max_of_extend_lens(LENS, BATCH.extend_seq_lens)",
            "max_of_extend_lens",
        ),
    )
    UPSTREAM = none_test(attr("seq_lens_sum|extend_prefix_lens_cpu|extend_seq_lens_cpu"))


class GuardTritonDraftTemplate(MethodGuards):
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

MIRROR_TOTAL = m.Call(func=attr("item", m.Call(func=attr("sum", attr("seq_lens_cpu", save(ANY, "BATCH"))))))


class GuardDecodePerfMetrics(MethodGuards):
    DESCRIPTION = "SchedulerMetricsMixin._estimate_decode_perf: seq_lens_cpu.sum() -> decode_total_seq_lens (sum of req.seqlen without the mirror)"
    CLASS = "SchedulerMetricsMixin"
    METHOD = "_estimate_decode_perf"
    GUARDS = (Guard(MIRROR_TOTAL, "decode_total_seq_lens(BATCH)", "decode_total_seq_lens"),)


class GuardDecodeStats(MethodGuards):
    DESCRIPTION = "SchedulerMetricsMixin.report_decode_stats: decode_sum_seq_lens -> decode_total_seq_lens"
    CLASS = "SchedulerMetricsMixin"
    METHOD = "report_decode_stats"
    GUARDS = (Guard(MIRROR_TOTAL, "decode_total_seq_lens(BATCH)", "decode_total_seq_lens"),)


class GuardScheduledRequestMetrics(MethodGuards):
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
