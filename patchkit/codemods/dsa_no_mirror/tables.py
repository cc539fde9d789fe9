"""Patch dsa-no-mirror's CUDA-graph tables: the replay metadata and the multi-step
precompute take the page-table width from the mirror or the preallocated table's
(backends.dsa ``graph_max_len``, as sglang 0.5.15's ``_graph_page_table_width``);
the indexer's empty-batch test reads a shape (0.5.15's)."""

from __future__ import annotations

from typing import ClassVar, Optional

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import Finding, MethodCodemod
from patchkit.codemods.common.method_guards import Guard
from patchkit.codemods.common.primitives import ANY, attr, save
from patchkit.codemods.common.shared import MirrorReadGuards, first_rows, max_item, none_comparison
from patchkit.codemods.dsa_no_mirror.common import (
    ASSERTS_MIRROR,
    DSA,
    DSA_HELPERS,
    DSA_PRECOMPUTE,
    INDEXER,
    MIRROR,
    NSA,
    NSA_PRECOMPUTE,
    ShimAware,
)

# -- CUDA-graph replay and the multi-step precompute ---------------------------------------------

_LOCAL_MIRROR = m.Name("seq_lens_cpu")
_PLUS_MAX = m.Call(
    func=m.Name("int"),
    args=[m.Arg(m.BinaryOperation(left=max_item(save(_LOCAL_MIRROR, "M")), operator=m.Add(), right=save(ANY, "X")))],
)


def _width_guards(table: str) -> tuple[Guard, ...]:
    """The local mirror's assert, batch slice and maxima, with ``table`` the
    preallocated page table the replay writes."""
    width = f"graph_max_len(M, {{}}, {table}, self.req_to_token)"
    return (
        Guard(m.Assert(test=none_comparison(save(_LOCAL_MIRROR, "M"), m.IsNot())), "assert M is None or len(M) >= bs"),
        Guard(first_rows(save(_LOCAL_MIRROR, "M"), "N"), "M[:N] if M is not None else None"),
        Guard(_PLUS_MAX, width.format("X"), "graph_max_len"),
        Guard(max_item(save(_LOCAL_MIRROR, "M")), width.format("0"), "graph_max_len"),
    )


class _WidthGuards(ShimAware, MirrorReadGuards):
    HELPER_MODULE = DSA_HELPERS
    REPLACES_VENDOR = (
        (r"seq_lens_cpu|int|torch|max|item", "the fork's read of the seq_lens mirror becomes its None-aware form"),
    )
    # 0.5.15+: upstream replays at the table's width and reads no mirror here.
    UPSTREAM_MARKER: ClassVar[Optional[m.BaseMatcherNode]] = m.Call(func=attr("_graph_page_table_width"))


class NsaReplayWithoutMirror(_WidthGuards):
    DESCRIPTION = (
        f"{NSA}.init_forward_metadata_replay_cuda_graph: seq_lens_cpu may be None (no assert); page-table width "
        "from the mirror or the preallocated table's (graph_max_len)"
    )
    CLASS = NSA
    METHOD = "init_forward_metadata_replay_cuda_graph"
    RENAMED = ("_apply_cuda_graph_metadata",)  # 0.5.13+
    GUARDS = _width_guards("metadata.page_table_1")


class DsaReplayWithoutMirror(NsaReplayWithoutMirror):
    DESCRIPTION = NsaReplayWithoutMirror.DESCRIPTION.replace(NSA, DSA)
    CLASS = DSA


class NsaPrecomputeSliceWithoutMirror(_WidthGuards):
    DESCRIPTION = f"{NSA_PRECOMPUTE}._precompute_replay_metadata: the batch slice of seq_lens_cpu only when it is there"
    CLASS = NSA_PRECOMPUTE
    METHOD = "_precompute_replay_metadata"
    GUARDS = _width_guards("self.decode_cuda_graph_metadata[bs].page_table_1")[1:2]
    UPSTREAM_MARKER = m.If(test=none_comparison(_LOCAL_MIRROR, m.IsNot()))  # 0.5.15+


class DsaPrecomputeSliceWithoutMirror(NsaPrecomputeSliceWithoutMirror):
    DESCRIPTION = NsaPrecomputeSliceWithoutMirror.DESCRIPTION.replace(NSA_PRECOMPUTE, DSA_PRECOMPUTE)
    CLASS = DSA_PRECOMPUTE


class NsaPrecomputeDecodeWithoutMirror(_WidthGuards):
    DESCRIPTION = (
        f"{NSA_PRECOMPUTE}._precompute_decode_mode: page-table width from the mirror or the preallocated "
        "table's (graph_max_len), as 0.5.15"
    )
    CLASS = NSA_PRECOMPUTE
    METHOD = "_precompute_decode_mode"
    GUARDS = _width_guards("self.decode_cuda_graph_metadata[bs].page_table_1")[2:]
    UPSTREAM_MARKER = attr("shape", attr("page_table_1"))  # 0.5.15+: `...[bs].page_table_1.shape[1]`


class DsaPrecomputeDecodeWithoutMirror(NsaPrecomputeDecodeWithoutMirror):
    DESCRIPTION = NsaPrecomputeDecodeWithoutMirror.DESCRIPTION.replace(NSA_PRECOMPUTE, DSA_PRECOMPUTE)
    CLASS = DSA_PRECOMPUTE


# -- the indexer's empty-batch test -----------------------------------------------------------------

_EMPTY_BY_MIRROR = m.Comparison(
    left=primitives.call("len", m.Arg(MIRROR)),
    comparisons=[m.ComparisonTarget(operator=m.Equal(), comparator=m.Integer("0"))],
)
_EMPTY_BY_DEVICE = m.Comparison(
    left=m.Call(func=attr("numel", attr("seq_lens", m.Name("forward_batch")))),
    comparisons=[m.ComparisonTarget(operator=m.Equal(), comparator=m.Integer("0"))],
)


class IndexerEmptyBatchFromShape(ShimAware, MethodCodemod):
    """Upstream 0.5.15's test, a shape read (no sync), in place of the mirror's length."""

    DESCRIPTION = (
        f"{INDEXER}.forward_cuda: the empty-batch test reads forward_batch.seq_lens.numel() (a shape), not "
        "len(forward_batch.seq_lens_cpu) after asserting the mirror (as 0.5.15)"
    )
    CLASS = INDEXER
    METHOD = "forward_cuda"
    REPLACES_VENDOR = ((r"seq_lens_cpu", "the fork's empty-batch test of the mirror reads seq_lens.numel()"),)

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        if primitives.contains(fn, _EMPTY_BY_DEVICE):
            return Finding.done(self.anchor)
        if primitives.contains(fn, _EMPTY_BY_MIRROR):
            return Finding.todo(self.anchor, "the empty-batch test reads the CPU mirror")
        return self.missing_in(
            fn,
            "no `len(forward_batch.seq_lens_cpu) == 0` empty-batch test",
            "that test to read it from forward_batch.seq_lens.numel() instead",
        )

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        test = primitives.parse_expression("forward_batch.seq_lens.numel() == 0")
        fn = primitives.replace_expressions(fn, _EMPTY_BY_MIRROR, lambda _node, _captures: test)
        if primitives.find_all(fn.body, ASSERTS_MIRROR):
            fn = primitives.remove_statements(fn, ASSERTS_MIRROR)
        return fn
