"""patchkit's own (issue 67): a host-side bound on the decode batch's lengths,
handed from the scheduler to the attention backends, in place of ``max_context_len``.

Without the CPU mirror (needs-cpu-seq-lens), the eager consumers sized their
page-table gathers and kv-index buffers from the static ``max_context_len``
(131072 at the Llama shapes), which made eager batches slower than pristine.
The scheduler knows a tight bound without a device read: each request's
``kv_allocated_len`` (runtime ``host_bound``). This patch carries it:

* ``ModelWorkerBatch`` and ``ForwardBatch`` get a field ``seq_lens_host_bound``
  (None by default: a batch built elsewhere, a CUDA-graph capture, keeps the
  static bound);
* ``ScheduleBatch.get_model_worker_batch`` fills it from the batch's requests
  when it hands over no mirror (``seq_lens_host_bound(self.reqs, mirror)``);
* ``ForwardBatch.init_new`` hands it on (``checked_host_bound``: the GPU runs'
  debug check).

The consumers' helpers (``host_max_seq_len``, ``seq_lens_sum_or_bound``,
``prefix_lens_sum_or_bound``, ``tree_mask_seq_lens_sum``) already take the batch
(the backend patches pass it); without this patch they find no bound on it.

* DONE: the field is declared, filled, handed on.
* NOT APPLICABLE: requests keep no host allocation (``Req.kv_allocated_len``,
  before 0.5.6.post2), or ``get_model_worker_batch`` was folded into
  ``ForwardBatch.init_new`` (0.5.13+: the backend code there is upstream's).
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import ClassCheck, ClassCodemod, Finding, MethodCodemod
from patchkit.codemods.common.shared import RUNTIME, code_of

FIELD = "seq_lens_host_bound"
TYPE = "SeqLensBound"
FIELD_SOURCE = f"{FIELD}: Optional[{TYPE}] = None  # patchkit (issue 67): host-side bound, no mirror"
FILL = "seq_lens_host_bound"  # runtime: the bound of the requests, or None with a mirror
CHECK = "checked_host_bound"  # runtime: hands the bound on (the debug check reads the device)

#: ``X(..., seq_lens_cpu=M, ...)``: the mirror handed over, captured.
HANDS_MIRROR = m.Call(args=[m.ZeroOrMore(), m.Arg(keyword=m.Name("seq_lens_cpu")), m.ZeroOrMore()])
#: ``...(..., seq_lens_host_bound=..., ...)``.
HANDS_BOUND = m.Call(args=[m.ZeroOrMore(), m.Arg(keyword=m.Name(FIELD)), m.ZeroOrMore()])
#: ``ret = cls(...)``: the ForwardBatch ``init_new`` builds.
BUILDS_FORWARD_BATCH = m.Call(
    func=m.Name("cls"), args=[m.ZeroOrMore(), m.Arg(keyword=m.Name("seq_lens")), m.ZeroOrMore()]
)
WORKER_BATCH = m.Call(func=m.Name("ModelWorkerBatch"))


class _AddField(ClassCodemod):
    """Declares the field on ``CLASS`` (a dataclass), after its last field."""

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        anchor = f"{self.CLASS}.{FIELD}"
        if primitives.find_class_attribute(cls, FIELD) is not None:
            return Finding.done(anchor)
        return Finding.todo(anchor, "no host bound field")

    def transform_class(self, cls: cst.ClassDef) -> cst.ClassDef:
        self.require_import(RUNTIME, TYPE)
        return primitives.add_dataclass_field(cls, FIELD_SOURCE)


class AddWorkerBatchField(_AddField):
    DESCRIPTION = "ModelWorkerBatch: a field seq_lens_host_bound (the host-side bound of the lengths, None by default)"
    CLASS = "ModelWorkerBatch"


class AddForwardBatchField(_AddField):
    DESCRIPTION = "ForwardBatch: a field seq_lens_host_bound (the host-side bound of the lengths, None by default)"
    CLASS = "ForwardBatch"


class RequestsKeepHostAllocation(ClassCheck):
    DESCRIPTION = "Req keeps its KV allocation on the host (kv_allocated_len, 0.5.6.post2+; checked, not changed)"
    CLASS = "Req"
    METHODS_READ, WORDS_READ = (), ("kv_allocated_len",)  # the methods that name it (__init__)

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        init = primitives.find_method(cls, "__init__")
        if init is not None and primitives.contains(init, primitives.assigns_attr("kv_allocated_len")):
            return Finding.superseded("Req.kv_allocated_len", "requests keep their KV allocation on the host")
        return Finding.superseded(
            "Req.kv_allocated_len",
            "requests keep no KV allocation on the host here (Req.kv_allocated_len, 0.5.6.post2+): "
            "no host bound to hand on, the backends keep the static max_context_len",
            moots_patch=True,
        )


class FillWorkerBatchBound(MethodCodemod):
    DESCRIPTION = (
        "ScheduleBatch.get_model_worker_batch: the ModelWorkerBatch carries seq_lens_host_bound, the requests' "
        "KV allocations (max, sum) when it hands over no CPU mirror"
    )
    CLASS = "ScheduleBatch"
    METHOD = "get_model_worker_batch"

    def detect_absent(self, cls: cst.ClassDef) -> Finding:
        return Finding.superseded(
            self.anchor,
            "get_model_worker_batch was folded into ForwardBatch.init_new (0.5.13+): the backends there are "
            "upstream's, which take the static bound",
            moots_patch=True,
        )

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        builds = primitives.find_all(fn, WORKER_BATCH)
        if not builds:
            return self.missing_in(fn, "no ModelWorkerBatch(...) built here", "the construction to hand the bound to")
        build = cst.ensure_type(builds[0], cst.Call)
        if m.matches(build, HANDS_BOUND):
            return Finding.done(self.anchor)
        if not m.matches(build, HANDS_MIRROR):
            return self.missing_in(
                fn, "the ModelWorkerBatch gets no seq_lens_cpu=", "the mirror it hands over (None without one)", build
            )
        return Finding.todo(self.anchor, "the ModelWorkerBatch carries no host bound")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        self.require_import(RUNTIME, FILL)

        def fill(node: cst.CSTNode, _found: object) -> cst.CSTNode:
            call = cst.ensure_type(node, cst.Call)
            mirror = code_of(cst.ensure_type(primitives.keyword_argument(call, "seq_lens_cpu"), cst.Arg).value)
            return primitives.set_keyword_argument(call, FIELD, f"{FILL}(self.reqs, {mirror})")

        return primitives.replace_expressions(fn, WORKER_BATCH, fill)


class HandOnBound(MethodCodemod):
    DESCRIPTION = "ForwardBatch.init_new: the ForwardBatch takes the ModelWorkerBatch's seq_lens_host_bound"
    CLASS = "ForwardBatch"
    METHOD = "init_new"

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        builds = primitives.find_all(fn, BUILDS_FORWARD_BATCH)
        if not builds:
            return self.missing_in(fn, "no cls(..., seq_lens=...) built here", "the ForwardBatch construction")
        if m.matches(builds[0], HANDS_BOUND):
            return Finding.done(self.anchor)
        return Finding.todo(self.anchor, "the ForwardBatch takes no host bound")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        self.require_import(RUNTIME, CHECK)
        return primitives.replace_expressions(
            fn,
            BUILDS_FORWARD_BATCH,
            lambda node, _: primitives.set_keyword_argument(
                cst.ensure_type(node, cst.Call), FIELD, f"{CHECK}(batch.{FIELD}, batch.seq_lens)"
            ),
        )
