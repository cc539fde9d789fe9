"""Triton's spec-v2 verify without a host wait and within its mask (issue 53).

Two changes to ``TritonAttnBackend`` (the codemods below, in this order in the
file: first the mask, then the eager verify's ``kv_indices``):

The verify tree mask, bounded like the others (0.5.17's ``VerifyMask.fits``).

Pristine ``TritonAttnBackend.init_cuda_graph_state`` allocates its
capture-time verify mask (``cuda_graph_custom_mask``, uint8,
``max_num_tokens * max_context_len``) and hands it out from
``get_verify_buffers_to_fill_after_draft`` for every batch. The tree kernel
writes ``D * sum(seq_lens) + bs * D**2`` cells into it unchecked: an eager
batch above ``cuda_graph_max_bs`` wrote past its end (and at ``max_bs`` a
row of ``seq_len + D`` cells near the context length did too). The
spec-v2 draft workers' guard (``verify_tree_mask_fits``,
``backends.verify_tree_mask.verify_tree_mask_for_batch``) already keeps the
mask for batches it fits, but only for a backend that records the
``max_bs`` it was sized for; Triton recorded none, so it stayed unguarded.

As upstream 0.5.17 (``maybe_create_verify_mask``: FULL_MASK,
``max_bs * D * (C + D)`` cells, ``VerifyMask.fits(bs)``), the mask gets
``C + D`` cells a verify token and the backend records
``verify_tree_mask_max_bs = max_bs`` beside it; the workers then hand it
only to a batch it fits, any other batch gets a mask of its own (pristine's
per-batch allocation). 0.5.17+: upstream's ``verify_mask`` property
(done: the same bound, native).
"""

from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import Finding, MethodCodemod
from patchkit.codemods.common.primitives import attr
from patchkit.codemods.common.shared import code_of
from patchkit.layout import import_path

MASK, MAX_BS = "cuda_graph_custom_mask", "verify_tree_mask_max_bs"
ALLOCATES_MASK = m.Assign(targets=[m.AssignTarget(target=attr(MASK, m.Name("self")))], value=m.Call())
#: pristine's size: ``max_num_tokens * self.max_context_len`` (parenthesised or not)
CONTEXT = attr("max_context_len", m.Name("self"))
OLD_SIZE = m.BinaryOperation(operator=m.Multiply(), right=CONTEXT)
RECORDS = m.Assign(targets=[m.AssignTarget(target=attr(MAX_BS, m.Name("self")))])


def _allocation(fn: cst.FunctionDef) -> Optional[cst.SimpleStatementLine]:
    """The line ``self.cuda_graph_custom_mask = torch.zeros(SIZE, ...)``."""
    lines = primitives.find_all_of(cst.SimpleStatementLine, fn, m.SimpleStatementLine(body=[ALLOCATES_MASK]))
    return lines[0] if len(lines) == 1 else None


def _call(line: cst.SimpleStatementLine) -> cst.Call:
    """``torch.zeros(SIZE, ...)`` of the allocation line (as ALLOCATES_MASK matched)."""
    return cst.ensure_type(cst.ensure_type(line.body[0], cst.Assign).value, cst.Call)


def _size(line: cst.SimpleStatementLine) -> Optional[cst.BaseExpression]:
    args = _call(line).args
    return args[0].value if args and args[0].keyword is None else None


class TritonRecordsTreeMaskMaxBs(MethodCodemod):
    DESCRIPTION = (
        "TritonAttnBackend.init_cuda_graph_state: the verify tree mask holds max_num_tokens * (max_context_len + D) "
        "cells and records the captured max_bs (verify_tree_mask_max_bs), so the spec-v2 workers hand it only to a "
        "batch it fits (sglang 0.5.17's VerifyMask.fits)"
    )
    CLASS = "TritonAttnBackend"
    METHOD = "init_cuda_graph_state"
    METHODS_READ = ("verify_mask",)

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        self._verify_mask = primitives.find_method(cls, "verify_mask") is not None
        return super().detect_in_class(cls)

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        line = _allocation(fn)
        if line is None and self._verify_mask:
            return Finding.done(self.anchor, "upstream's VerifyMask (0.5.17+): sized C + D a token, fits(bs) checked")
        if line is None:
            return self.missing_in(fn, f"no single `self.{MASK} = torch.zeros(...)`", "the mask's allocation to bound")
        if primitives.contains(fn, RECORDS):
            return Finding.done(self.anchor)
        size = _size(line)
        if size is None or not m.matches(primitives.peel(size).value, OLD_SIZE):
            return self.missing_in(
                fn,
                f"the mask is sized `{code_of(size) if size is not None else '?'}`",
                "pristine's `max_num_tokens * self.max_context_len` to widen by the draft tokens",
                line,
            )
        return Finding.todo(self.anchor, f"self.{MAX_BS} not recorded: the workers hand the mask to every batch")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        line = _allocation(fn)
        size = None if line is None else _size(line)
        assert line is not None and size is not None  # detect found them
        inner = cst.ensure_type(primitives.peel(size).value, cst.BinaryOperation)  # OLD_SIZE, as detect found
        wider = primitives.parse_expression(
            f"({code_of(inner.left)} * (self.max_context_len + (self.num_draft_tokens or 0)))"
        )
        call = _call(line)
        new_line = line.with_changes(
            body=[
                line.body[0].with_changes(
                    value=call.with_changes(args=[call.args[0].with_changes(value=wider), *call.args[1:]])
                )
            ]
        )
        record = primitives.parse_statements_with_comments(f"""
            # C + D cells a verify token (a row is seq_len + D), and the batch size it
            # holds: the spec-v2 workers hand it only to a batch it fits (sglang 0.5.17).
            self.{MAX_BS} = max_bs
        """)
        block = next(
            b
            for b in primitives.find_all_of(cst.IndentedBlock, fn, m.IndentedBlock())
            if any(s is line for s in b.body)
        )
        body: list[cst.BaseStatement] = []
        for stmt in block.body:
            body += [new_line, *record] if stmt is line else [stmt]
        return primitives.replace_node(fn, block, block.with_changes(body=body))


# -- the eager target verify's kv_indices, sized from the host (0.5.13) -----------------------

IS_TARGET_VERIFY = m.If(test=m.Call(func=attr("is_target_verify")))
KV_INDICES = m.Assign(
    targets=[m.AssignTarget(target=m.Name("kv_indices"))], value=m.Call(func=primitives.dotted("torch.empty"))
)
LAST_INDPTR = m.Subscript(
    value=m.Name("kv_indptr"),
    slice=[m.SubscriptElement(slice=m.Index(value=m.UnaryOperation(operator=m.Minus(), expression=m.Integer("1"))))],
)
SUM_HELPER = "seq_lens_sum_or_bound"


def _verify_kv_indices(fn: cst.FunctionDef) -> list[cst.Assign]:
    """``kv_indices = torch.empty(SIZE, ...)`` in the target-verify branch (not its elif chain)."""
    out: list[cst.Assign] = []
    for branch in primitives.find_all_of(cst.If, fn, IS_TARGET_VERIFY):
        out += primitives.find_all_of(cst.Assign, branch.body, KV_INDICES)
    return out


class TritonVerifyKvIndicesFromHost(MethodCodemod):
    """The eager target verify sized ``kv_indices`` with
    ``torch.empty(kv_indptr[-1], ...)``: a device value read on the host,
    once every eager verify step (a batch above ``cuda_graph_max_bs``).
    0.5.13 sizes it from the host ``seq_lens_sum``, or its bound
    ``bs * max_context_len`` without the mirror (the kernel writes each row
    at its ``kv_indptr`` offset: a larger buffer is safe): the patched tree
    calls needs-cpu-seq-lens' runtime ``seq_lens_sum_or_bound``."""

    DESCRIPTION = (
        "TritonAttnBackend.init_forward_metadata: the target verify's kv_indices sized from the host seq_lens_sum "
        "(or bs * max_context_len without it, as 0.5.13), not torch.empty(kv_indptr[-1]) (a host wait every eager step)"
    )
    CLASS = "TritonAttnBackend"
    METHOD = "init_forward_metadata"

    def _sites(self, fn: cst.FunctionDef) -> list[cst.Assign]:
        return [
            a
            for a in _verify_kv_indices(fn)
            if isinstance(a.value, cst.Call) and a.value.args and m.matches(a.value.args[0].value, LAST_INDPTR)
        ]

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        if self._sites(fn):
            return Finding.todo(
                self.anchor, "the target verify's kv_indices are sized by kv_indptr[-1], read from the device"
            )
        if any(primitives.contains(a, primitives.call(SUM_HELPER)) for a in _verify_kv_indices(fn)):
            return Finding.done(self.anchor)
        # Upstream's own host size (0.5.13+: seq_lens_sum, else its bound), a fork's, or no such branch:
        # not a half-patched tree, nothing to add.
        return Finding.superseded(self.anchor, "the target verify's kv_indices are not sized from the device here")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        for site in self._sites(fn):
            branch = next(
                b
                for b in primitives.find_all_of(cst.If, fn, IS_TARGET_VERIFY)
                if primitives.contains(b.body, primitives.is_node(site))
            )
            bs = "bs" if primitives.contains(branch.body, primitives.assigns_name("bs")) else "forward_batch.batch_size"
            size = primitives.parse_expression(
                f"{SUM_HELPER}(forward_batch.seq_lens_sum, {bs}, self.max_context_len, forward_batch)"
            )
            call = cst.ensure_type(site.value, cst.Call)  # as _sites kept
            fn = primitives.replace_node(fn, call.args[0], call.args[0].with_changes(value=size))
        self.require_import(import_path("runtime"), SUM_HELPER)
        return fn
