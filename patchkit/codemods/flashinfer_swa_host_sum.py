"""sglang #32218 (0.5.20): the sliding-window verify's page-length sum from the CPU mirror.

``FlashInferIndicesUpdaterPrefill.update_sliding_window`` sizes the window
wrapper's kv indices with ``paged_kernel_lens.sum().item()``: a reduction on
the device read back to the host, so every spec-v2 target verify of a
sliding-window model on FlashInfer (its eager plan and its CUDA-graph
replay) waits for the stream there. When the caller gives no prefix and the
spec input carries no accepted-token counts (the target verify), the prefix
is the whole sequence and each window length is ``min(seq_len, window)``:
the sum of the CPU mirror clamped to the window, with no wait. Any other
batch (a draft extend, a prefill, no mirror) keeps the device sum.

Anchored by meaning: in ``update_sliding_window``, the ``if prefix_lens is
None:`` fill and the paged (non-ragged) window branch's ``.sum().item()``
right after its ``torch.minimum(...)`` lengths. The edit records whether the
fill took the whole sequence (``prefix_is_full_seq``, upstream's name) above
the fill and sums the mirror where it did. 0.5.14 .. 0.5.19 carry it; 0.5.20+
native; 0.5.10 .. 0.5.13 have no ``prefix_lens is None`` case: a verify of a
sliding-window model fails there before the sum (``seq_lens - None``), so the
patch is not applicable, in one line.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import Finding, MethodCodemod

PATCH = "flashinfer-swa-host-sum"
UPDATER = "FlashInferIndicesUpdaterPrefill"

PREFIX_FILL = m.If(
    test=m.Comparison(left=m.Name("prefix_lens"), comparisons=[m.ComparisonTarget(m.Is(), comparator=m.Name("None"))])
)
#: ``torch.clamp(seq_lens_cpu, ...)``: the mirror summed (ours and upstream's 0.5.20+).
MIRROR_CLAMPED = m.Call(
    func=m.Attribute(value=m.Name("torch"), attr=m.Name("clamp")), args=[m.Arg(m.Name("seq_lens_cpu")), m.ZeroOrMore()]
)
WINDOW_LENS = m.SimpleStatementLine(
    body=[
        m.Assign(
            targets=[m.AssignTarget(m.Name("paged_kernel_lens"))],
            value=m.Call(func=m.Attribute(value=m.Name("torch"), attr=m.Name("minimum"))),
        )
    ]
)
DEVICE_SUM = m.SimpleStatementLine(
    body=[
        m.Assign(
            targets=[m.AssignTarget(m.Name("paged_kernel_lens_sum"))],
            value=m.Call(
                func=m.Attribute(
                    value=m.Call(func=m.Attribute(value=m.Name("paged_kernel_lens"), attr=m.Name("sum"))),
                    attr=m.Name("item"),
                )
            ),
        )
    ]
)

FLAG_SOURCE = f"""
# patchkit {PATCH} (sglang #32218): no prefix given and no accepted-token
# counts (the target verify): the prefix filled below is the whole sequence.
prefix_is_full_seq = prefix_lens is None and getattr(spec_info, "num_accept_tokens", None) is None
"""

SUM_SOURCE = """
if prefix_is_full_seq and seq_lens_cpu is not None:
    # min(seq_lens, window) per request: the host mirror's sum, no stream wait.
    paged_kernel_lens_sum = int(torch.clamp(seq_lens_cpu, max=WINDOW).sum())
else:
    paged_kernel_lens_sum = paged_kernel_lens.sum().item()
"""


def _window_sum(fn: cst.FunctionDef) -> Optional[tuple[cst.IndentedBlock, int, str]]:
    """(the block, the index of its device sum, the window's spelling) of the
    paged window branch: a ``paged_kernel_lens = torch.minimum(...)`` followed
    by ``paged_kernel_lens_sum = paged_kernel_lens.sum().item()``."""
    hits: list[tuple[cst.IndentedBlock, int, Optional[str]]] = []
    for block in primitives.find_all_of(cst.IndentedBlock, fn, m.IndentedBlock()):
        body = primitives.block_statements(block)
        for i in range(len(body) - 1):
            if m.matches(body[i], WINDOW_LENS) and m.matches(body[i + 1], DEVICE_SUM):
                hits.append((block, i + 1, _window(body[i])))
    if len(hits) != 1:
        return None
    block, index, window = hits[0]
    return (block, index, window) if window is not None else None


def _window(stmt: cst.BaseStatement) -> Optional[str]:
    """The window's spelling in ``torch.minimum(seq_lens, WINDOW + seq_lens - prefix_lens)``."""
    assign = cst.ensure_type(cst.ensure_type(stmt, cst.SimpleStatementLine).body[0], cst.Assign)
    args = cst.ensure_type(assign.value, cst.Call).args
    if len(args) != 2:
        return None
    terms = args[1].value
    while isinstance(terms, cst.BinaryOperation):
        terms = terms.left
    if m.matches(terms, m.Name("sliding_window_size") | m.Attribute(attr=m.Name("sliding_window_size"))):
        return cst.Module([]).code_for_node(terms)
    return None


class VerifyWindowSumFromMirror(MethodCodemod):
    DESCRIPTION = (
        f"{UPDATER}.update_sliding_window: a target verify's window page-length sum from the CPU mirror "
        "(clamped to the window) instead of paged_kernel_lens.sum().item()"
    )
    CLASS = UPDATER
    METHOD = "update_sliding_window"

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        if primitives.contains(fn, MIRROR_CLAMPED):
            return Finding.done(self.anchor)
        if not primitives.contains(fn, PREFIX_FILL):
            return Finding.superseded(
                self.anchor,
                "no prefix_lens=None case before 0.5.14: a sliding-window verify fails before the sum",
                moots_patch=True,
            )
        if _window_sum(fn) is None:
            return self.missing_in(
                fn,
                "no paged window branch summing torch.minimum(seq_lens, WINDOW + ...) with .sum().item()",
                "that sum to read the mirror instead",
            )
        return Finding.todo(self.anchor, "paged_kernel_lens.sum().item() waits for the stream every verify")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        site = _window_sum(fn)
        assert site is not None  # detect found it
        block, index, window = site
        body = primitives.block_statements(block)
        new = primitives.parse_statement(SUM_SOURCE.replace("WINDOW", window))
        body[index] = new.with_changes(leading_lines=body[index].leading_lines)
        fn = primitives.replace_node(fn, block, block.with_changes(body=body))
        return primitives.insert_before(fn, PREFIX_FILL, FLAG_SOURCE)
