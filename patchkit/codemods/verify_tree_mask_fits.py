"""The spec-v2 draft workers hand the preallocated verify tree mask only to a batch it fits (the bound of sglang #33127).

fa3-spec-v2, flashmla-spec-v2 and trtllm-mla-spec-v2 preallocate the
FULL_MASK verify tree mask at CUDA-graph capture, sized for the captured
``max_bs``, and return it from ``get_verify_buffers_to_fill_after_draft``.
The draft worker called that hook for every batch and handed the buffer to
``build_tree_kernel_efficient``, which writes ``D * sum(seq_lens) + bs * D**2``
cells without a bounds check: an eager batch above ``cuda_graph_max_bs`` with
long contexts wrote past the buffer's end. Right after the hook, the worker
now keeps the buffer only for a batch it fits
(``backends.verify_tree_mask.verify_tree_mask_for_batch``: bs within the
recorded max_bs and the buffer covering the batch's worst case); for any
other batch it is None and the tree-mask build allocates one for the batch,
as pristine sglang did for every batch: from ``seq_lens_sum`` with the CPU
mirror, else from needs-cpu-seq-lens' bound ``bs * max_context_len``
(``tree_mask_seq_lens_sum``; 0.5.13 .. 0.5.15 the same bound natively). The
multi-layer EAGLE worker keeps the mirror in 0.5.10 .. 0.5.12.post1 (it lists
no spec-v2 backends), so its ``seq_lens_sum`` is there.

Call sites: ``EagleDraftWorker.draft`` (eagle_worker_v2.py) and
``MultiLayerEagleDraftWorker.draft`` (multi_layer_eagle_worker_v2.py),
0.5.10 .. 0.5.15. From 0.5.16 the tree-mask build moved out of both
(``eagle_worker_common.build_eagle_verify_input``) and 0.5.17 checks
``VerifyMask.fits(bs)`` there: superseded. The three patches list these
codemods; whichever is applied first edits the worker, the others find it
done.
"""

from __future__ import annotations

from typing import ClassVar, Optional

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import Finding, MethodCodemod
from patchkit.codemods.common.primitives import attr, call
from patchkit.codemods.common.shared import code_of
from patchkit.layout import import_path

HELPERS = import_path("backends.verify_tree_mask")
HELPER = "verify_tree_mask_for_batch"
GET_BUFFERS = "get_verify_buffers_to_fill_after_draft"
TREE_KERNEL = "build_tree_kernel_efficient"
#: ``build_tree_kernel_efficient(bonus, parents, top_scores, draft_tokens, seq_lens,
#: seq_lens_sum, topk, spec_steps, num_verify_tokens, ...)``: where the two it needs are.
SEQ_LENS_ARG, NUM_VERIFY_ARG, MODE_ARG = (4, "seq_lens"), (8, "num_verify_tokens"), (9, "tree_mask_mode")
MODE_HELPER = "tree_mask_mode_for"

#: ``<buf>, <pos> = <backend>.get_verify_buffers_to_fill_after_draft()``
HOOK_ASSIGN = m.Assign(
    targets=[m.AssignTarget(target=m.Tuple(elements=[m.Element(value=m.Name()), m.ZeroOrMore()]))],
    value=m.Call(func=attr(GET_BUFFERS)),
)


def _buffer(hook: cst.Assign) -> str:
    """``buf`` of ``buf, ... = <backend>.get_...()`` (as HOOK_ASSIGN matched)."""
    return cst.ensure_type(cst.ensure_type(hook.targets[0].target, cst.Tuple).elements[0].value, cst.Name).value


def _backend(hook: cst.Assign) -> str:
    """``<backend>`` of ``buf, ... = <backend>.get_...()`` (as HOOK_ASSIGN matched)."""
    return code_of(cst.ensure_type(cst.ensure_type(hook.value, cst.Call).func, cst.Attribute).value)


def _arg(node: cst.Call, where: tuple[int, str]) -> Optional[cst.BaseExpression]:
    index, keyword = where
    for arg in node.args:
        if arg.keyword is not None and arg.keyword.value == keyword:
            return arg.value
    positional = [a for a in node.args if a.keyword is None and not a.star]
    return positional[index].value if len(positional) > index else None


class WorkerHandsOverAFittingTreeMask(MethodCodemod):
    """After the hook's assignment, ``BUF = verify_tree_mask_for_batch(BUF,
    BACKEND, SEQ_LENS, NUM_DRAFT_TOKENS)``, the last two as the tree kernel's
    call passes them."""

    METHOD = "draft"
    WHY_ABSENT = "no draft method (the spec-v2 draft step moved)"
    #: A release or fork where the tree-mask hook is not patchkit's to guard (see the TRT-LLM MLA variant).
    NOT_OURS_FROM_SCHEDULE_BATCH: ClassVar[bool] = False

    def _hook(self, fn: cst.FunctionDef) -> Optional[cst.Assign]:
        found = primitives.find_all_of(cst.Assign, fn, HOOK_ASSIGN)
        return found[0] if found else None

    def _guarded(self, fn: cst.FunctionDef, buf: str) -> bool:
        return primitives.contains(
            fn, m.Assign(targets=[m.AssignTarget(target=m.Name(buf))], value=m.Call(func=m.Name(HELPER)))
        )

    def _kernel_args(self, fn: cst.FunctionDef):
        for kernel in primitives.find_all_of(cst.Call, fn, call(TREE_KERNEL)):
            seq_lens, num_verify = _arg(kernel, SEQ_LENS_ARG), _arg(kernel, NUM_VERIFY_ARG)
            if seq_lens is not None and num_verify is not None:
                return seq_lens, num_verify
        return None

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        hook = self._hook(fn)
        if hook is None:
            return Finding.superseded(
                self.anchor,
                f"no {GET_BUFFERS}() call here: the tree mask is built elsewhere "
                "(upstream 0.5.16+: eagle_worker_common.build_eagle_verify_input; 0.5.17+ checks VerifyMask.fits)",
            )
        buf = _buffer(hook)
        if self._guarded(fn, buf):
            return Finding.done(self.anchor)
        if self.NOT_OURS_FROM_SCHEDULE_BATCH and self._takes_schedule_batch(fn):
            return Finding.superseded(
                self.anchor,
                "the draft takes a ScheduleBatch (0.5.13+), where TRT-LLM MLA's tree-mask hook is upstream's",
            )
        if self._kernel_args(fn) is None:
            return self.missing_in(
                fn,
                f"no {TREE_KERNEL}(...) call with seq_lens and num_verify_tokens",
                "them to bound the tree mask it is handed",
            )
        return Finding.todo(self.anchor, f"{buf} is the preallocated mask for every batch size")

    @staticmethod
    def _takes_schedule_batch(fn: cst.FunctionDef) -> bool:
        params = fn.params.params
        return len(params) > 1 and m.matches(
            params[1], m.Param(annotation=m.Annotation(annotation=m.Name("ScheduleBatch")))
        )

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        hook = self._hook(fn)
        assert hook is not None  # detect found it
        buf, backend = _buffer(hook), _backend(hook)
        seq_lens, num_verify = (code_of(node) for node in self._kernel_args(fn))
        source = f"""
            # The preallocated mask holds the captured max_bs requests: only a batch it
            # fits gets it (an eager batch above that size would write past its end);
            # for any other, None and the tree-mask build allocates one for the batch.
            {buf} = {HELPER}(
                {buf},
                {backend},
                {seq_lens},
                {num_verify},
            )
        """
        self.require_import(HELPERS, HELPER)
        index = primitives.find_statement_index(fn, HOOK_ASSIGN)
        assert index is not None  # detect found it
        body = primitives.block_statements(fn.body)
        body[index + 1 : index + 1] = primitives.parse_statements_with_comments(source)
        return fn.with_changes(body=fn.body.with_changes(body=body))


class DraftHandsOverAFittingTreeMask(WorkerHandsOverAFittingTreeMask):
    DESCRIPTION = (
        f"EagleDraftWorker.draft: the target backend's preallocated tree mask goes to {TREE_KERNEL} "
        f"only for a batch it fits ({HELPER}), else None (allocated per batch)"
    )
    CLASS = "EagleDraftWorker"


class MultiLayerDraftHandsOverAFittingTreeMask(WorkerHandsOverAFittingTreeMask):
    DESCRIPTION = (
        f"MultiLayerEagleDraftWorker.draft: the target backend's preallocated tree mask goes to {TREE_KERNEL} "
        f"only for a batch it fits ({HELPER}), else None (allocated per batch)"
    )
    CLASS = "MultiLayerEagleDraftWorker"


# TRT-LLM MLA's mask hook is upstream's from 0.5.13 (native there; its own
# unbounded contract until 0.5.17): trtllm-mla-spec-v2 guards the workers of
# 0.5.10 .. 0.5.12.post1 only, whose draft takes a ModelWorkerBatch.


class DraftHandsOverAFittingTreeMaskUpTo0512(DraftHandsOverAFittingTreeMask):
    NOT_OURS_FROM_SCHEDULE_BATCH = True


class MultiLayerDraftHandsOverAFittingTreeMaskUpTo0512(MultiLayerDraftHandsOverAFittingTreeMask):
    NOT_OURS_FROM_SCHEDULE_BATCH = True


# -- the layout the kernel writes (sglang #32886, #32920) ------------------------------------


class WorkerAsksForTheBackendsLayout(WorkerHandsOverAFittingTreeMask):
    """The tree kernel's mode argument becomes ``tree_mask_mode_for(MODE,
    BACKEND)``: the worker's own layout where the target backend reads the
    mask, else the compact QLEN_ONLY one, which fills ``D * D`` cells a
    request instead of the whole context-wide mask every verify step (the
    backend records which, next to the mask it preallocates that size)."""

    def _mode(self, fn: cst.FunctionDef) -> Optional[cst.BaseExpression]:
        for kernel in primitives.find_all_of(cst.Call, fn, call(TREE_KERNEL)):
            mode = _arg(kernel, MODE_ARG)
            if mode is not None:
                return mode
        return None

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        hook = self._hook(fn)
        if hook is None or (self.NOT_OURS_FROM_SCHEDULE_BATCH and self._takes_schedule_batch(fn)):
            return super().detect_in_method(fn)
        mode = self._mode(fn)
        if mode is None:
            return self.missing_in(
                fn,
                f"no {TREE_KERNEL}(...) call with a tree_mask_mode argument",
                "it to ask for the layout the target backend reads",
            )
        if m.matches(mode, m.Call(func=m.Name(MODE_HELPER))):
            return Finding.done(self.anchor)
        return Finding.todo(
            self.anchor, f"{code_of(mode)}: the FULL_MASK layout even where the backend never reads the mask"
        )

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        hook, mode = self._hook(fn), self._mode(fn)
        assert hook is not None and mode is not None  # detect found them
        backend = _backend(hook)
        self.require_import(HELPERS, MODE_HELPER)
        wrapped = primitives.parse_expression(f"{MODE_HELPER}({code_of(mode)}, {backend})")
        replaced = fn.deep_replace(mode, wrapped)
        return cst.ensure_type(replaced, cst.FunctionDef)  # mode lies below fn


class DraftAsksForTheBackendsLayout(WorkerAsksForTheBackendsLayout):
    DESCRIPTION = (
        f"EagleDraftWorker.draft: {TREE_KERNEL} writes the layout the target backend reads ({MODE_HELPER}): "
        "QLEN_ONLY where verify never reads the mask, no context-wide fill each step"
    )
    CLASS = "EagleDraftWorker"


class MultiLayerDraftAsksForTheBackendsLayout(WorkerAsksForTheBackendsLayout):
    DESCRIPTION = (
        f"MultiLayerEagleDraftWorker.draft: {TREE_KERNEL} writes the layout the target backend reads ({MODE_HELPER}): "
        "QLEN_ONLY where verify never reads the mask, no context-wide fill each step"
    )
    CLASS = "MultiLayerEagleDraftWorker"


class DraftAsksForTheBackendsLayoutUpTo0512(DraftAsksForTheBackendsLayout):
    NOT_OURS_FROM_SCHEDULE_BATCH = True


class MultiLayerDraftAsksForTheBackendsLayoutUpTo0512(MultiLayerDraftAsksForTheBackendsLayout):
    NOT_OURS_FROM_SCHEDULE_BATCH = True
