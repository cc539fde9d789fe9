"""sglang #27689 (0.5.18): FlashInfer MLA plans the spec-v2 verify and draft extend from host arrays.

``BatchMLAPagedAttentionWrapper.plan`` copies ``qo_indptr``, ``kv_indptr``
and ``kv_len_arr`` to the host (three ``.to("cpu")``): given device tensors,
each copy waits for the stream. 0.5.10 .. 0.5.12.post1 handed it device
tensors in two per-step places of spec v2, both with the arrays known on
the host:

* the target verify's CUDA-graph replay (``init_forward_metadata_replay_cuda_graph``,
  target-verify branch): ``draft_token_num`` query rows per request and K
  lengths ``seq_lens + draft_token_num``, from the CPU mirror
  (``backends.flashinfer_mla.verify_host_plan``). The verify wrapper's plan
  becomes ``fast_mla_prefill_plan`` once capture planned it, as the decode
  wrappers' became ``fast_mla_decode_plan`` long ago.
* the eager draft extend (``DRAFT_EXTEND_V2``, the final branch of
  ``init_forward_metadata``): the host extend lengths and the mirror
  (``draft_extend_host_plan``; upstream takes ``num_tokens_per_req``, which
  0.5.10 .. 0.5.12.post1 set to ``speculative_num_steps + 1`` rather than the
  extend's width: the host lengths are the batch's own).

The prefill indices updater's ``update`` and ``call_begin_forward`` take the
three host arrays (keyword, default None) and plan from them when given.
Without the mirror every helper returns None and the plan is the stock one.

Past upstream (2026-11-28g: 9 waits a step on an H200 past the captured
sizes), in ``init_forward_metadata``: the eager target verify hands the same
updater host arrays (``eager_verify_host_plan``), the eager spec-v2 draft
decode hands the decode updater a wrapper whose ``plan()`` takes host arrays
(``draft_decode_planned``). 0.5.18+ (its ``self.fast_plan_*_cpu`` buffers
there) plans both from the device still: not carried, the patch stays
native. A fork without one of these sites keeps that plan as it is.

Releases: 0.5.10 .. 0.5.12.post1 (one file, identical). 0.5.18+: native
(upstream's shape: pinned ``fast_plan_*_cpu`` buffers, its own
``fast_mla_prefill_plan``). 0.5.13 .. 0.5.17: not carried (one capture and
replay body, ``_apply_cuda_graph_metadata``), said in one line.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import Finding, MethodCodemod
from patchkit.codemods.common.shared import code_of
from patchkit.layout import import_path

BACKEND = "FlashInferMLAAttnBackend"
UPDATER = "FlashInferMLAIndicesUpdaterPrefill"
HELPERS = import_path("backends.flashinfer_mla")
PATCH = "flashinfer-mla-host-plan"
HOST_ARRAYS = ("qo_indptr_cpu", "kv_indptr_cpu", "kv_len_arr_cpu")
SHARED_BODY = "_apply_cuda_graph_metadata"  # 0.5.13+
NOT_CARRIED = (
    "not carried onto 0.5.13 .. 0.5.17: their FlashInfer MLA capture and replay share one body "
    f"({SHARED_BODY}) this patch does not rewrite; 0.5.18+ has the change upstream (sglang #27689)"
)

PREFILL_UPDATE = m.Call(
    func=m.Attribute(
        value=m.Attribute(value=m.Name("self"), attr=m.Name("indices_updater_prefill")), attr=m.Name("update")
    )
)
#: ``W.plan = partial(fast_mla_prefill_plan, W)``: ours and upstream's (0.5.18+).
FAST_PLAN_INSTALLED = m.Assign(
    targets=[m.AssignTarget(target=m.Attribute(attr=m.Name("plan")))],
    value=m.Call(func=m.Name("partial"), args=[m.Arg(m.Name("fast_mla_prefill_plan")), m.ZeroOrMore()]),
)
MLA_WRAPPER = m.Assign(
    targets=[m.AssignTarget(target=m.Name())], value=m.Call(func=m.Name("BatchMLAPagedAttentionWrapper"))
)


def _passes_host_arrays(call: cst.Call) -> bool:
    return primitives.keyword_argument(call, "kv_indptr_cpu") is not None


def _with_host_arrays(call: cst.Call, value: str = "{}") -> cst.Call:
    for name in HOST_ARRAYS:
        call = primitives.set_keyword_argument(call, name, value.format(name))
    return call


def _verify_branch(fn: cst.FunctionDef) -> Optional[cst.If]:
    return primitives.mode_branch(fn, "is_target_verify")


def _updates_in(block: cst.CSTNode) -> list[cst.Call]:
    return primitives.find_all_of(cst.Call, block, PREFILL_UPDATE)


class VerifyCaptureInstallsFastPlan(MethodCodemod):
    DESCRIPTION = (
        f"{BACKEND}.init_forward_metadata_capture_cuda_graph: the target-verify wrapper's plan becomes "
        "fast_mla_prefill_plan once capture planned it (replays plan from host arrays, no .to('cpu') waits)"
    )
    CLASS = BACKEND
    METHOD = "init_forward_metadata_capture_cuda_graph"
    RENAMED = ("init_forward_metadata_out_graph",)  # 0.5.13+

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        if primitives.contains(fn, FAST_PLAN_INSTALLED):
            return Finding.done(self.anchor_of(fn))
        if fn.name.value != self.METHOD:
            return Finding.superseded(self.anchor_of(fn), NOT_CARRIED, moots_patch=True)
        branch = _verify_branch(fn)
        if branch is None or len(primitives.find_all(branch.body, MLA_WRAPPER)) != 1:
            return self.missing_in(
                fn, "no target-verify branch building one BatchMLAPagedAttentionWrapper", "the verify wrapper to replan"
            )
        return Finding.todo(self.anchor, "the verify wrapper's replays run plan(), three blocking .to('cpu') each")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        self.require_import("functools", "partial")
        self.require_import(HELPERS, "fast_mla_prefill_plan")
        branch = cst.ensure_type(_verify_branch(fn), cst.If)
        (assign,) = primitives.find_all_of(cst.Assign, branch.body, MLA_WRAPPER)
        wrapper = cst.ensure_type(assign.targets[0].target, cst.Name).value
        new = primitives.parse_statements_with_comments(f"""
            # patchkit {PATCH} (sglang #27689): its replays plan from host arrays,
            # without plan()'s three .to("cpu") waits (planned above: module built).
            {wrapper}.plan = partial(fast_mla_prefill_plan, {wrapper})
        """)
        block = cst.ensure_type(branch.body, cst.IndentedBlock)
        edited = block.with_changes(body=[*primitives.block_statements(block), *new])
        return primitives.replace_node(fn, block, edited)


class VerifyReplayHostPlan(MethodCodemod):
    DESCRIPTION = (
        f"{BACKEND}.init_forward_metadata_replay_cuda_graph: the target verify hands the prefill updater its "
        "plan arrays built on the host from the CPU mirror (verify_host_plan)"
    )
    CLASS = BACKEND
    METHOD = "init_forward_metadata_replay_cuda_graph"
    RENAMED = (SHARED_BODY,)  # 0.5.13+

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        branch = _verify_branch(fn)
        calls = _updates_in(branch.body) if branch is not None else []
        if len(calls) == 1 and _passes_host_arrays(calls[0]):
            return Finding.done(self.anchor_of(fn))
        if fn.name.value != self.METHOD:
            return Finding.superseded(self.anchor_of(fn), NOT_CARRIED)
        if len(calls) != 1:
            return self.missing_in(
                fn, "no target-verify branch with one indices_updater_prefill.update call", "that call"
            )
        return Finding.todo(self.anchor, "the verify plan is fed device arrays (three D2H waits per replay)")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        self.require_import(HELPERS, "verify_host_plan")
        branch = cst.ensure_type(_verify_branch(fn), cst.If)
        (call,) = _updates_in(branch.body)
        block = cst.ensure_type(branch.body, cst.IndentedBlock)
        source = f"""
            # patchkit {PATCH} (sglang #27689): the plan's arrays on the host, from
            # the CPU mirror (None without it: the stock plan from the device).
            {", ".join(HOST_ARRAYS)} = verify_host_plan(
                seq_lens_cpu, bs, getattr(spec_info, "draft_token_num", None)
            )
        """
        return primitives.replace_node(
            fn, block, primitives.insert_above_holder(block, call, source, _with_host_arrays(call))
        )


def _extend_blocks(fn: cst.FunctionDef) -> list[tuple[cst.IndentedBlock, cst.Call]]:
    """The blocks of ``fn`` that decide ``use_ragged`` and hand it to the prefill updater (the extend branch)."""
    decides = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=m.Name("use_ragged"))])])
    found: list[tuple[cst.IndentedBlock, cst.Call]] = []
    for block in primitives.find_all_of(cst.IndentedBlock, fn, m.IndentedBlock()):
        body = primitives.block_statements(block)
        if not any(m.matches(stmt, decides) for stmt in body):
            continue
        calls = [c for stmt in body for c in _updates_in(stmt) if primitives.keyword_argument(c, "use_ragged")]
        found.extend((block, c) for c in calls)
    return found


class EagerDraftExtendHostPlan(MethodCodemod):
    DESCRIPTION = (
        f"{BACKEND}.init_forward_metadata: an eager DRAFT_EXTEND_V2 hands the prefill updater its plan arrays "
        "built on the host from the mirror and the host extend lengths (draft_extend_host_plan)"
    )
    CLASS = BACKEND
    METHOD = "init_forward_metadata"

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        sites = _extend_blocks(fn)
        if len(sites) != 1:
            return self.missing_in(
                fn, "no extend branch deciding use_ragged and calling indices_updater_prefill.update once", "it"
            )
        if _passes_host_arrays(sites[0][1]):
            return Finding.done(self.anchor)
        return Finding.todo(self.anchor, "the eager draft extend's plan is fed device arrays (three D2H waits)")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        self.require_import(HELPERS, "draft_extend_host_plan")
        ((block, call),) = _extend_blocks(fn)
        source = f"""
            # patchkit {PATCH} (sglang #27689): an eager DRAFT_EXTEND_V2 plans from
            # host arrays (the mirror, the host extend lengths); None otherwise.
            {", ".join(HOST_ARRAYS)} = draft_extend_host_plan(forward_batch, use_ragged)
        """
        return primitives.replace_node(
            fn, block, primitives.insert_above_holder(block, call, source, _with_host_arrays(call))
        )


HOST_PARAMS = ", ".join(f"{n}: Optional[torch.Tensor] = None" for n in HOST_ARRAYS)


def _with_host_params(fn: cst.FunctionDef) -> cst.FunctionDef:
    """``fn`` with the three host arrays as its last parameters (default None), in its own layout."""
    return primitives.append_parameters(fn, HOST_PARAMS)


def _takes_host_arrays(fn: cst.FunctionDef) -> bool:
    names = {p.name.value for p in (*fn.params.params, *fn.params.kwonly_params)}
    return set(HOST_ARRAYS) <= names


class _UpdaterMethod(MethodCodemod):
    CLASS = UPDATER

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        if _takes_host_arrays(fn):
            return Finding.done(self.anchor)
        if not primitives.has_plain_parameters(fn):
            return self.missing_in(fn, "keyword-only or star parameters", "plain parameters to add three after")
        site = self.site(fn)
        if site is None:
            return self.missing_in(fn, self.SITE_MISSING, self.SITE_NEEDED)
        return Finding.todo(self.anchor, self.WHY)

    SITE_MISSING = ""
    SITE_NEEDED = ""
    WHY = ""

    def site(self, fn: cst.FunctionDef) -> Optional[object]:
        raise NotImplementedError


CALL_BEGIN = m.Call(func=m.Attribute(value=m.Name("self"), attr=m.Name("call_begin_forward")))


class PrefillUpdaterTakesHostPlan(_UpdaterMethod):
    DESCRIPTION = f"{UPDATER}.update takes the plan's host arrays (default None) and hands them on"
    METHOD = "update"
    SITE_MISSING = "no single self.call_begin_forward(...) call"
    SITE_NEEDED = "it to hand the host arrays on"
    WHY = "no way to hand the prefill plan host arrays"

    def site(self, fn: cst.FunctionDef) -> Optional[object]:
        calls = primitives.find_all_of(cst.Call, fn, CALL_BEGIN)
        return calls[0] if len(calls) == 1 else None

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        call = cst.ensure_type(self.site(fn), cst.Call)
        return _with_host_params(primitives.replace_node(fn, call, _with_host_arrays(call, "{0}")))


PLAN_CALL = m.Call(
    func=m.Attribute(attr=m.Name("plan")), args=[m.Arg(m.Name("qo_indptr")), m.Arg(m.Name("kv_indptr")), m.ZeroOrMore()]
)
KV_LEN_ARR = m.Assign(targets=[m.AssignTarget(target=m.Name("kv_len_arr"))])


def _plan_site(fn: cst.FunctionDef) -> Optional[tuple[cst.Call, cst.Assign]]:
    """The paged plan call and the ``kv_len_arr`` it is handed, each the only one of ``fn``."""
    plans = primitives.find_all_of(cst.Call, fn, PLAN_CALL)
    lens = primitives.find_all_of(cst.Assign, fn, KV_LEN_ARR)
    return (plans[0], lens[0]) if len(plans) == 1 and len(lens) == 1 else None


class PrefillPlanFromHost(_UpdaterMethod):
    DESCRIPTION = (
        f"{UPDATER}.call_begin_forward takes the plan's host arrays (default None) and hands them to the "
        "paged MLA wrapper's plan() instead of the device ones (no .to('cpu') waits there)"
    )
    METHOD = "call_begin_forward"
    SITE_MISSING = "no kv_len_arr = ... and X.plan(qo_indptr, kv_indptr, ...) pair"
    SITE_NEEDED = "them to plan from the host arrays"
    WHY = "the paged MLA plan copies qo_indptr, kv_indptr and kv_len_arr to the host"

    def site(self, fn: cst.FunctionDef) -> Optional[object]:
        return _plan_site(fn)

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        site = _plan_site(fn)
        assert site is not None  # detect found it
        plan, lens = site
        args = list(plan.args)
        for i, name in enumerate(("qo_indptr", "kv_indptr")):
            host = primitives.parse_expression(f"{name} if {name}_cpu is None else {name}_cpu")
            args[i] = args[i].with_changes(value=host)
        value = primitives.parse_expression(f"{code_of(lens.value)} if kv_len_arr_cpu is None else kv_len_arr_cpu")
        fn = primitives.replace_node(fn, plan, plan.with_changes(args=args))
        fn = primitives.replace_node(fn, lens, lens.with_changes(value=value))
        return _with_host_params(fn)


#: 0.5.18+'s own host-plan buffers: upstream's init_forward_metadata, which these two do not rewrite.
UPSTREAM_HOST_BUFFERS = m.Attribute(value=m.Name("self"), attr=m.Name("fast_plan_qo_indptr_cpu"))
NOT_CARRIED_EAGER = (
    "0.5.18+ plans its eager {} from the device still; patchkit carries that onto 0.5.10 .. 0.5.12.post1"
)
DECODE_UPDATE = m.Call(
    func=m.Attribute(
        value=m.Attribute(value=m.Name("self"), attr=m.Name("indices_updater_decode")), attr=m.Name("update")
    )
)


class _EagerSite(MethodCodemod):
    """One site of ``init_forward_metadata`` past upstream: superseded on 0.5.18+ (left as
    upstream has it) and where a fork has no such site (that plan stays as it is)."""

    CLASS = BACKEND
    METHOD = "init_forward_metadata"
    WHAT = ""

    def site(self, fn: cst.FunctionDef) -> Optional[tuple[cst.IndentedBlock, cst.Call]]:
        raise NotImplementedError

    def is_done(self, call: cst.Call) -> bool:
        raise NotImplementedError

    def found(self, fn: cst.FunctionDef) -> tuple[cst.IndentedBlock, cst.Call]:
        """The site, in a method detect found it in."""
        return cst.ensure_type(self.site(fn), tuple)

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        if primitives.contains(fn, UPSTREAM_HOST_BUFFERS):
            return Finding.superseded(self.anchor_of(fn), NOT_CARRIED_EAGER.format(self.WHAT))
        found = self.site(fn)
        if found is None:
            return Finding.superseded(self.anchor_of(fn), f"no eager {self.WHAT} site of the release's shape here")
        if self.is_done(found[1]):
            return Finding.done(self.anchor)
        return Finding.todo(self.anchor, f"the eager {self.WHAT}'s plan is fed device arrays (three D2H waits)")


class EagerVerifyHostPlan(_EagerSite):
    DESCRIPTION = (
        f"{BACKEND}.init_forward_metadata: an eager target verify (past the captured sizes) hands the prefill "
        "updater its plan arrays built on the host from the mirror (eager_verify_host_plan)"
    )
    WHAT = "target verify"

    def site(self, fn: cst.FunctionDef) -> Optional[tuple[cst.IndentedBlock, cst.Call]]:
        return primitives.sole_call_in(_verify_branch(fn), PREFILL_UPDATE)

    def is_done(self, call: cst.Call) -> bool:
        return _passes_host_arrays(call)

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        self.require_import(HELPERS, "eager_verify_host_plan")
        block, call = self.found(fn)
        source = f"""
            # patchkit {PATCH}: an eager verify plans from the mirror's host arrays
            # too (None without it: the stock plan); upstream copies them to the host.
            {", ".join(HOST_ARRAYS)} = eager_verify_host_plan(forward_batch)
        """
        return primitives.replace_node(
            fn, block, primitives.insert_above_holder(block, call, source, _with_host_arrays(call))
        )


class EagerDraftDecodeHostPlan(_EagerSite):
    DESCRIPTION = (
        f"{BACKEND}.init_forward_metadata: an eager spec-v2 draft decode hands the decode updater a wrapper "
        "whose plan() takes host arrays built from the mirror (draft_decode_planned)"
    )
    WHAT = "draft decode"

    def site(self, fn: cst.FunctionDef) -> Optional[tuple[cst.IndentedBlock, cst.Call]]:
        # A call handing over spec_info (a fork's) plans the draft's own arrays, not the mirror's.
        found = primitives.sole_call_in(primitives.mode_branch(fn, "is_decode_or_idle"), DECODE_UPDATE)
        positional = [a for a in found[1].args if a.keyword is None and not a.star] if found else []
        if found is None or primitives.keyword_argument(found[1], "spec_info") or len(positional) > 5:
            return None
        return found if primitives.keyword_argument(found[1], "decode_wrapper") else None

    def is_done(self, call: cst.Call) -> bool:
        arg = primitives.keyword_argument(call, "decode_wrapper")
        return arg is not None and m.matches(arg.value, m.Call(func=m.Name("draft_decode_planned")))

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        self.require_import(HELPERS, "draft_decode_planned")
        call = self.found(fn)[1]
        arg = cst.ensure_type(primitives.keyword_argument(call, "decode_wrapper"), cst.Arg)
        value = f"draft_decode_planned({code_of(arg.value)}, forward_batch)"
        return primitives.replace_node(fn, call, primitives.set_keyword_argument(call, "decode_wrapper", value))
