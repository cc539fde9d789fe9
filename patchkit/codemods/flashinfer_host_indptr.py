"""Issue 71: FlashInfer (MHA) plans the spec-v2 step from host indptrs.

FlashInfer's ``plan()`` copies its indptrs to the host (``.to("cpu")``) and the
verify's tree mask is packed with a ``.item()``: given device tensors, each
waits for the stream. 0.5.10 .. 0.5.12.post1's FlashInfer backend
(``srt/layers/attention/flashinfer_backend.py``) handed it device tensors in
every spec-v2 step, though FlashInfer keeps the CPU seq_lens mirror and every
array is known on the host from it:

* the target verify, eager and CUDA-graph replay (``EagerVerifyHostPlan``,
  ``VerifyReplayHostPlan``);
* the eager ``DRAFT_EXTEND_V2`` (``EagerDraftExtendHostPlan``), whose ragged
  branch also read the prefix sum with ``.sum().item()`` (``RaggedSumFromHostPlan``);
* the multi-step draft decode: the whole indptr copied with ``.cpu()`` each
  step (``DraftIndptrFromMirror``) and, eager, the stock decode plan's copies
  (``DraftDecodePlanFromHost``).

The prefill indices updater takes the host arrays (``host_plan``, default
None: ``PrefillUpdaterTakesHostPlan``) and its wrappers plan from them
(``PrefillPlanFromHost``). The runtime (``backends.flashinfer_host_indptr``)
builds each host array equal to the device one, CUDA-graph padding included,
or returns None: the stock plan then runs as before.

Releases: 0.5.4.post3 .. 0.5.12.post1 (same shapes). 0.5.13+: not carried
(capture and replay share one body there); 0.5.23 has upstream's opt-ins,
off by default, which this patch does not match (docs/research/flashinfer-spec-v2.md).
"""

from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import ClassCodemod, Finding, MethodCodemod
from patchkit.codemods.common.shared import code_of
from patchkit.layout import import_path

PATCH = "flashinfer-host-indptr"
BACKEND = "FlashInferAttnBackend"
PREFILL = "FlashInferIndicesUpdaterPrefill"
HELPERS = import_path("backends.flashinfer_host_indptr")
NOT_CARRIED = (
    "not carried onto 0.5.13+: FlashInfer's capture and replay share one body there "
    "(init_forward_metadata_replay_cuda_graph is gone); 0.5.23 has upstream's opt-ins "
    "SGLANG_OPT_FLASHINFER_VERIFY_HOST_PLAN / SGLANG_OPT_FLASHINFER_DRAFT_HOST_INDPTR"
)
PREFILL_UPDATE = m.Call(func=m.Attribute(value=primitives.attr("indices_updater_prefill"), attr=m.Name("update")))


def _comment(stmt: cst.SimpleStatementLine, text: str) -> cst.SimpleStatementLine:
    """``stmt`` with ``# text`` lines above it (after its own leading lines)."""
    lines = [cst.EmptyLine(comment=cst.Comment(f"# {line}")) for line in text.splitlines()]
    return stmt.with_changes(leading_lines=[*stmt.leading_lines, *lines])


def _params(fn: cst.FunctionDef) -> list[str]:
    return [p.name.value for p in (*fn.params.params, *fn.params.kwonly_params)]


def _hands_host_plan(call: cst.Call) -> bool:
    return primitives.keyword_argument(call, "host_plan") is not None


class _HostPlanAtUpdate(MethodCodemod):
    """An ``indices_updater_prefill.update(...)`` call of the backend handed
    ``host_plan=host_plan``, computed just above it by HELPER(ARGS)."""

    CLASS = BACKEND
    HELPER = ""
    ARGS = ""
    NEEDS: tuple[str, ...] = ()  # parameters of the method the helper's arguments read
    WHY = ""
    COMMENT = ""

    def site(self, fn: cst.FunctionDef) -> Optional[tuple[cst.IndentedBlock, cst.Call]]:
        raise NotImplementedError

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        site = self.site(fn)
        if site is None or not set(self.NEEDS) <= set(_params(fn)):
            return self.missing_in(fn, f"no {self.WHERE} calling indices_updater_prefill.update once", "it")
        if _hands_host_plan(site[1]):
            return Finding.done(self.anchor)
        return Finding.todo(self.anchor, self.WHY)

    WHERE = ""

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        self.require_import(HELPERS, self.HELPER)
        block, call = cst.ensure_type(self.site(fn), tuple)
        comment = "".join(f"# {line}\n" for line in self.COMMENT.format(patch=PATCH).splitlines())
        source = f"{comment}host_plan = {self.HELPER}({self.ARGS})\n"
        edited = primitives.set_keyword_argument(call, "host_plan", "host_plan")
        return primitives.replace_node(fn, block, primitives.insert_above_holder(block, call, source, edited))


def _update_in_branch(fn: cst.FunctionDef, mode: str) -> Optional[tuple[cst.IndentedBlock, cst.Call]]:
    return primitives.sole_call_in(primitives.mode_branch(fn, mode), PREFILL_UPDATE)


class EagerVerifyHostPlan(_HostPlanAtUpdate):
    DESCRIPTION = (
        f"{BACKEND}.init_forward_metadata: the eager target verify hands the prefill updater its plan "
        "arrays built on the host from the CPU mirror (verify_host_plan)"
    )
    METHOD = "init_forward_metadata"
    HELPER = "verify_host_plan"
    ARGS = "self, forward_batch.spec_info, forward_batch.seq_lens_cpu, forward_batch.batch_size, forward_batch.seq_lens_sum"
    NEEDS = ("forward_batch",)
    WHERE = "target-verify branch"
    WHY = "the eager verify's plan copies qo/kv indptrs to the host and packs its mask with .item()"
    COMMENT = "patchkit {patch} (issue 71): the verify plan's arrays on the host, from\nthe CPU mirror (None: the stock plan from the device arrays)."

    def site(self, fn: cst.FunctionDef) -> Optional[tuple[cst.IndentedBlock, cst.Call]]:
        return _update_in_branch(fn, "is_target_verify")


class VerifyReplayHostPlan(_HostPlanAtUpdate):
    DESCRIPTION = (
        f"{BACKEND}.init_forward_metadata_replay_cuda_graph: the target verify's replay hands the prefill "
        "updater its plan arrays built on the host from the padded CPU mirror (verify_host_plan)"
    )
    METHOD = "init_forward_metadata_replay_cuda_graph"
    HELPER = "verify_host_plan"
    ARGS = "self, spec_info, seq_lens_cpu, bs, seq_lens_sum"
    NEEDS = ("spec_info", "seq_lens_cpu", "bs", "seq_lens_sum")
    WHERE = "target-verify branch"
    WHY = "every verify replay's plan copies qo/kv indptrs to the host and packs its mask with .item()"
    COMMENT = EagerVerifyHostPlan.COMMENT

    def detect_absent(self, cls: cst.ClassDef) -> Finding:
        return Finding.superseded(self.anchor, NOT_CARRIED, moots_patch=True)

    def site(self, fn: cst.FunctionDef) -> Optional[tuple[cst.IndentedBlock, cst.Call]]:
        return _update_in_branch(fn, "is_target_verify")


class EagerDraftExtendHostPlan(_HostPlanAtUpdate):
    DESCRIPTION = (
        f"{BACKEND}.init_forward_metadata: an eager DRAFT_EXTEND_V2 hands the prefill updater its plan "
        "arrays built on the host from the mirror and the host prefix lengths (draft_extend_host_plan)"
    )
    METHOD = "init_forward_metadata"
    HELPER = "draft_extend_host_plan"
    ARGS = "self, forward_batch, use_ragged"
    NEEDS = ("forward_batch",)
    WHERE = "extend branch deciding use_ragged and"
    WHY = "the eager draft extend reads a prefix sum with .item() and its plans copy the indptrs to the host"
    COMMENT = "patchkit {patch} (issue 71): an eager DRAFT_EXTEND_V2 plans from host\narrays (the mirror, the host prefix lengths); None for any other extend."

    def site(self, fn: cst.FunctionDef) -> Optional[tuple[cst.IndentedBlock, cst.Call]]:
        decides = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=m.Name("use_ragged"))])])
        found = []
        for block in primitives.find_all_of(cst.IndentedBlock, fn, m.IndentedBlock()):
            body = primitives.block_statements(block)
            if not any(primitives.contains(stmt, decides) for stmt in body):
                continue
            lines = [stmt for stmt in body if isinstance(stmt, cst.SimpleStatementLine)]  # its own calls, not nested
            calls = [c for stmt in lines for c in primitives.find_all_of(cst.Call, stmt, PREFILL_UPDATE)]
            found += [(block, c) for c in calls if primitives.keyword_argument(c, "use_ragged")]
        return found[0] if len(found) == 1 else None


UPDATES = ("update", "update_single_wrapper", "update_sliding_window", "update_cross_attention")
CALL_BEGIN = m.Call(func=m.Attribute(value=m.Name("self"), attr=m.Name("call_begin_forward")))


class PrefillUpdaterTakesHostPlan(ClassCodemod):
    DESCRIPTION = (
        f"{PREFILL}.update (and its single-wrapper, sliding-window, cross-attention forms) take host_plan "
        "(default None); the single-wrapper form hands it to call_begin_forward"
    )
    CLASS = PREFILL
    METHODS_READ = UPDATES

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        methods = [fn for name in UPDATES if (fn := primitives.find_method(cls, name)) is not None]
        single = primitives.find_method(cls, "update_single_wrapper")
        calls = primitives.find_all_of(cst.Call, single, CALL_BEGIN) if single is not None else []
        if single is None or len(calls) != 1:
            return Finding.missing(
                self.CLASS, f"{self.where(cls)}: no update_single_wrapper calling call_begin_forward once"
            )
        if all("host_plan" in _params(fn) for fn in methods) and _hands_host_plan(calls[0]):
            return Finding.done(self.CLASS)
        refused = next((fn for fn in methods if not primitives.has_plain_parameters(fn)), None)
        if refused is not None:
            return Finding.missing(
                self.CLASS, f"{self.where(refused)}: {refused.name.value} takes star or keyword-only parameters"
            )
        return Finding.todo(self.CLASS, "no way to hand the prefill plan host arrays")

    def transform_class(self, cls: cst.ClassDef) -> cst.ClassDef:
        for name in UPDATES:
            if primitives.find_method(cls, name) is not None:
                cls = primitives.replace_method(cls, name, self._edit)
        return cls

    @staticmethod
    def _edit(fn: cst.FunctionDef) -> cst.FunctionDef:
        if fn.name.value == "update_single_wrapper":
            (call,) = primitives.find_all_of(cst.Call, fn, CALL_BEGIN)
            fn = primitives.replace_node(fn, call, primitives.set_keyword_argument(call, "host_plan", "host_plan"))
        return fn if "host_plan" in _params(fn) else primitives.append_parameters(fn, "host_plan=None")


ITEM_SUM = m.Call(func=m.Attribute(value=m.Call(func=m.Attribute(attr=m.Name("sum"))), attr=m.Name("item")))


def _ragged_sum(fn: cst.FunctionDef) -> list[cst.Assign]:
    lens_sum = m.Assign(
        targets=[m.AssignTarget(target=m.Name())], value=ITEM_SUM | m.IfExp(body=m.Attribute(value=m.Name("host_plan")))
    )
    return primitives.find_all_of(cst.Assign, fn, lens_sum)


class RaggedSumFromHostPlan(MethodCodemod):
    DESCRIPTION = (
        f"{PREFILL}.update_single_wrapper: the ragged branch's paged_kernel_lens.sum().item() reads the "
        "host plan's sum when there is one"
    )
    CLASS = PREFILL
    METHOD = "update_single_wrapper"

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        found = _ragged_sum(fn)
        if len(found) != 1:
            return self.missing_in(fn, "no single X_sum = lens.sum().item()", "it to read the host sum")
        if isinstance(found[0].value, cst.IfExp):
            return Finding.done(self.anchor)
        return Finding.todo(self.anchor, "the ragged extend reads its prefix sum from the device (.item())")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        (assign,) = _ragged_sum(fn)
        value = f"host_plan.kv_len_sum if host_plan is not None else {code_of(assign.value)}"
        return primitives.replace_node(fn, assign, assign.with_changes(value=primitives.parse_expression(value)))


def _begin_forward(fn: cst.FunctionDef, receiver: str) -> list[cst.Call]:
    plain = m.Call(func=m.Attribute(value=m.Name(receiver), attr=m.Name("begin_forward")))
    return primitives.find_all_of(cst.Call, fn, plain)


def _planned_from_host(fn: cst.FunctionDef, helper: str) -> bool:
    return primitives.contains(fn, m.Call(func=m.Call(func=m.Name(helper))))


class PrefillPlanFromHost(MethodCodemod):
    DESCRIPTION = (
        f"{PREFILL}.call_begin_forward takes host_plan (default None) and its ragged and paged wrappers "
        "plan from it (ragged_plan_from_host, paged_plan_from_host: no .to('cpu') or .item() waits)"
    )
    CLASS = PREFILL
    METHOD = "call_begin_forward"
    WRAPPERS = (("ragged_plan_from_host", 1), ("paged_plan_from_host", 2))  # helper, parameter index

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        if "host_plan" in _params(fn) and all(_planned_from_host(fn, helper) for helper, _ in self.WRAPPERS):
            return Finding.done(self.anchor)
        names = [p.name.value for p in fn.params.params]
        if not primitives.has_plain_parameters(fn) or len(names) < 3:
            return self.missing_in(fn, "other parameters", "(self, wrapper_ragged, wrapper_paged, ...)")
        if any(len(_begin_forward(fn, names[i])) != 1 for _, i in self.WRAPPERS):
            return self.missing_in(fn, "not one begin_forward call on each wrapper", "them to plan from the host")
        return Finding.todo(self.anchor, "its plans copy the indptrs to the host")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        names = [p.name.value for p in fn.params.params]
        for helper, i in self.WRAPPERS:
            self.require_import(HELPERS, helper)
            (call,) = _begin_forward(fn, names[i])
            func = primitives.parse_expression(f"{helper}({names[i]}, host_plan)")
            fn = primitives.replace_node(fn, call, call.with_changes(func=func))
        return primitives.append_parameters(fn, "host_plan=None")


CPU_COPY = m.Assign(
    targets=[m.AssignTarget(target=m.Name())],
    value=m.Call(
        func=m.Attribute(value=m.Subscript(value=primitives.attr("kv_indptr", m.Name("self"))), attr=m.Name("cpu"))
    ),
)


class DraftIndptrFromMirror(MethodCodemod):
    DESCRIPTION = (
        "FlashInferMultiStepDraftBackend.common_template: the draft steps' kv_indptr built on the host from the "
        "mirror and the draft's positions (draft_host_indptr), padded rows included; the .cpu() copy only without"
    )
    CLASS = "FlashInferMultiStepDraftBackend"
    METHOD = "common_template"

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        if _calls(fn, "draft_host_indptr") or _calls(fn, "_build_draft_indptr_host"):  # ours, upstream's opt-in
            return Finding.done(self.anchor)
        lines = [s for s in primitives.block_statements(fn.body) if primitives.contains(s, CPU_COPY)]
        if len(lines) != 1 or not isinstance(lines[0], cst.SimpleStatementLine) or "forward_batch" not in _params(fn):
            return self.missing_in(fn, "no top-level X = self.kv_indptr[...].cpu()", "it to build X on the host")
        return Finding.todo(self.anchor, "every draft step copies the whole kv_indptr to the host (.cpu())")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        self.require_import(HELPERS, "draft_host_indptr")

        def edit(line: cst.SimpleStatementLine) -> cst.FlattenSentinel:
            name = code_of(cst.ensure_type(line.body[0], cst.Assign).targets[0].target)
            new = primitives.parse_statements_with_comments(f"""
                # patchkit {PATCH} (issue 71): built on the host from the mirror and the
                # draft's positions, as the kernel wrote it; the device copy only without them.
                {name} = draft_host_indptr(forward_batch, self.topk, self.speculative_num_steps)
                if {name} is None:
                    pass
            """)
            guard = cst.ensure_type(new[1], cst.If)
            stock = line.with_changes(leading_lines=[])
            new[1] = guard.with_changes(body=guard.body.with_changes(body=[stock]))
            new[0] = new[0].with_changes(leading_lines=[*line.leading_lines, *new[0].leading_lines])
            return cst.FlattenSentinel(new)

        return primitives.replace_statements(fn, m.SimpleStatementLine(body=[CPU_COPY]), edit)


def _calls(fn: cst.FunctionDef, name: str) -> bool:
    return primitives.contains(fn, m.Call(func=m.Name(name)))


class DraftDecodePlanFromHost(MethodCodemod):
    DESCRIPTION = (
        "FlashInferIndicesUpdaterDecode.call_begin_forward: the stock plan (eager draft steps) is fed the "
        "multi-step draft's host indptr and host last-page lengths (decode_plan_from_host)"
    )
    CLASS = "FlashInferIndicesUpdaterDecode"
    METHOD = "call_begin_forward"
    NAMES = ("global_override_indptr_cpu", "locally_override")

    def site(self, fn: cst.FunctionDef) -> list[cst.Call]:
        calls = primitives.find_all_of(cst.Call, fn, m.Call(func=m.Attribute(attr=m.Name("begin_forward"))))
        return [c for c in calls if primitives.keyword_argument(c, "global_override_indptr_cpu") is None]

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        if _planned_from_host(fn, "decode_plan_from_host"):
            return Finding.done(self.anchor)
        names = {n.value for n in primitives.find_all_of(cst.Name, fn, m.Name())}
        if len(self.site(fn)) != 1 or not set(self.NAMES) <= names:
            return self.missing_in(
                fn, "not one stock begin_forward call beside the fast-plan override", "it to plan from the override"
            )
        return Finding.todo(self.anchor, "an eager draft step's plan copies indptr and last-page lengths to the host")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        self.require_import(HELPERS, "decode_plan_from_host")
        (call,) = self.site(fn)
        receiver = code_of(cst.ensure_type(call.func, cst.Attribute).value)
        func = primitives.parse_expression(
            f"decode_plan_from_host({receiver}, None if locally_override else global_override_indptr_cpu)"
        )
        edited = call.with_changes(func=func)
        text = f"patchkit {PATCH} (issue 71): the multi-step draft's override is the\nhost copy of kv_indptr: plan from it."

        def edit(line: cst.SimpleStatementLine) -> cst.BaseStatement:
            return _comment(primitives.replace_node(line, call, edited), text)

        return primitives.replace_statements(
            fn, m.SimpleStatementLine(body=[m.Expr(value=primitives.is_node(call))]), edit
        )
