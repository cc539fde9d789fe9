"""sglang #29414 (+ 0.5.20's condition, + #33973 past upstream): DeepSeek sparse
attention (NSA / DSA) opts out of the spec-v2 seq_lens D2H sync.

The backend is ``NativeSparseAttnBackend`` in ``layers/attention/nsa_backend.py``
up to 0.5.12.post1 and ``DeepseekSparseAttnBackend`` in ``dsa_backend.py``
from 0.5.13 (``nsa_backend.py`` and ``nsa/*.py`` are re-export shims there
until 0.5.20, ``nsa_backend.py`` is gone from 0.5.21): each change below has
a codemod for each name (``Nsa*`` / ``Dsa*``), and a codemod that meets a shim
says so (superseded) instead of missing its class.

What the backend read from the CPU mirror on the decode, verify and draft
paths, it now takes without it:

* the eager ``init_forward_metadata``'s page-table width:
  ``int(forward_batch.seq_lens_cpu.max().item() + draft_token_num)`` after an
  ``assert`` of the mirror (0.5.7 .. 0.5.14); upstream's opt-out (0.5.15+)
  falls back to ``int(forward_batch.seq_lens.max().item())``, a device read
  whose wait differs between DP-attention ranks (sglang #33973). Both become
  ``host_max_seq_len(<mirror>, self.max_context_len, forward_batch)`` (the
  mirror's max, else the batch's host bound, else the static bound).
* the draft-extend branch (0.5.14's own ``DRAFT_EXTEND_V2`` branch too) asserted
  ``extend_prefix_lens_cpu`` it never reads (the GPU-only draft extend, of
  needs-cpu-seq-lens or upstream's on 0.5.13 / 0.5.14, leaves it unset; 0.5.15+
  refills it from the device first: left as upstream wrote it).
* CUDA-graph replay and the multi-step precompute: the mirror's max sized
  the gather; without it, the preallocated table's width (backends.dsa
  ``graph_max_len``; upstream 0.5.15's ``_graph_page_table_width``).
* the indexer's empty-batch test read ``len(forward_batch.seq_lens_cpu)``
  after asserting it; 0.5.15 tests ``forward_batch.seq_lens.numel()``.
* 0.5.7 .. 0.5.9 only: the verify / draft-extend lengths were expanded on the
  host from ``seq_lens_cpu.tolist()``; ``expand.py`` writes 0.5.10's device
  expansion (backends.dsa ``seqlens_expand``) in their place.
* 0.5.10+: target verify copied its query lengths ``[D] * bs`` from the host
  (``torch.tensor(<list>, device=...)``, a blocking copy each step); ``verify.py``
  fills them on the device (``torch.full``: 0.5.15's replay, past upstream eager).
"""

from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import Finding, MethodCodemod
from patchkit.codemods.common.dsa import SpecV2Gate
from patchkit.codemods.common.primitives import ANY, attr, save
from patchkit.codemods.common.shared import FLAG, MIRROR_READS, ClassFlag, code_of, max_item, none_comparison
from patchkit.codemods.dsa_no_mirror.common import ASSERTS_MIRROR, DSA, DSA_MULTI, MIRROR, NSA, NSA_MULTI, ShimAware
from patchkit.codemods.dsa_no_mirror.expand import (
    DsaEagerExpandsOnDevice,
    DsaReplayExpandsOnDevice,
    NsaEagerExpandsOnDevice,
    NsaReplayExpandsOnDevice,
)
from patchkit.codemods.dsa_no_mirror.tables import (
    DsaPrecomputeDecodeWithoutMirror,
    DsaPrecomputeSliceWithoutMirror,
    DsaReplayWithoutMirror,
    IndexerEmptyBatchFromShape,
    NsaPrecomputeDecodeWithoutMirror,
    NsaPrecomputeSliceWithoutMirror,
    NsaReplayWithoutMirror,
)
from patchkit.codemods.dsa_no_mirror.verify import (
    DsaReplayVerifyLengthsOnDevice,
    DsaVerifyLengthsOnDevice,
    NsaReplayVerifyLengthsOnDevice,
    NsaVerifyLengthsOnDevice,
)

__all__ = [  # the codemods patches/dsa-no-mirror.toml names (tables.py's, expand.py's and verify.py's re-exported)
    "DsaDraftExtendNeedsNoPrefixList",
    "DsaEagerExpandsOnDevice",
    "DsaEagerMaxFromHostBound",
    "DsaHasSpecV2Path",
    "DsaMultiStepOptsOut",
    "DsaOptsOut",
    "DsaPrecomputeDecodeWithoutMirror",
    "DsaPrecomputeSliceWithoutMirror",
    "DsaReplayExpandsOnDevice",
    "DsaReplayVerifyLengthsOnDevice",
    "DsaReplayWithoutMirror",
    "DsaVerifyLengthsOnDevice",
    "IndexerEmptyBatchFromShape",
    "NsaDraftExtendNeedsNoPrefixList",
    "NsaEagerExpandsOnDevice",
    "NsaEagerMaxFromHostBound",
    "NsaHasSpecV2Path",
    "NsaMultiStepOptsOut",
    "NsaOptsOut",
    "NsaPrecomputeDecodeWithoutMirror",
    "NsaPrecomputeSliceWithoutMirror",
    "NsaReplayExpandsOnDevice",
    "NsaReplayVerifyLengthsOnDevice",
    "NsaReplayWithoutMirror",
    "NsaVerifyLengthsOnDevice",
]


# -- the opt-out flags -------------------------------------------------------------------------


class NsaOptsOut(ShimAware, ClassFlag):
    """``needs_cpu_seq_lens: bool = False`` (sglang #29414). 0.5.20's refinement,
    ``self.needs_cpu_seq_lens = self.dsa_index_kpool > 1`` in ``__init__``, is
    kept where a tree has it (pooled index keys need the mirror): releases
    before 0.5.20 have no pooled indexer, so the class-wide False is that
    condition there."""

    DESCRIPTION = f"{NSA}.{FLAG} = False: decode, verify and draft metadata are built without the CPU mirror"
    CLASS = NSA
    WHY = (
        "Decode / verify / draft metadata are built without the CPU mirror (the\n"
        "replay at the preallocated table's width, the eager path from a host bound);\n"
        "opt out of the spec-v2 seq_lens D2H sync (sglang #29414)."
    )


class DsaOptsOut(NsaOptsOut):
    DESCRIPTION = NsaOptsOut.DESCRIPTION.replace(NSA, DSA)
    CLASS = DSA


class NsaMultiStepOptsOut(ShimAware, ClassFlag):
    DESCRIPTION = f"{NSA_MULTI}.{FLAG} = False: per-step draft decode replays without the CPU mirror"
    CLASS = NSA_MULTI
    WHY = (
        "Per-step draft decode replays from the preallocated tables; opt out so\n"
        "decide_needs_cpu_seq_lens' OR over the backends stays False."
    )


class DsaMultiStepOptsOut(NsaMultiStepOptsOut):
    DESCRIPTION = NsaMultiStepOptsOut.DESCRIPTION.replace(NSA_MULTI, DSA_MULTI)
    CLASS = DSA_MULTI


# -- the eager page-table width ------------------------------------------------------------------

MAX = "max_seqlen_k"
_SETS_MAX = m.Assign(targets=[m.AssignTarget(target=m.Name(MAX))])
_MIRROR_MAX = m.Call(
    func=m.Name("int"),
    args=[m.Arg(m.BinaryOperation(left=max_item(MIRROR), operator=m.Add(), right=save(ANY, "EXTRA")))],
)
_DEVICE_MAX = max_item(attr("seq_lens", m.Name("forward_batch")))
_HOST_MAX = primitives.call("host_max_seq_len")


def _plain_max(fn: cst.FunctionDef) -> list[cst.SimpleStatementLine]:
    """``max_seqlen_k = int(<mirror max> + EXTRA)`` lines outside a None test (0.5.7 .. 0.5.14)."""
    return primitives.find_all_of(
        cst.SimpleStatementLine,
        fn.body,
        m.SimpleStatementLine(body=[m.Assign(targets=_SETS_MAX.targets, value=_MIRROR_MAX)]),
    )


def _upstream_fallback(fn: cst.FunctionDef) -> list[cst.If]:
    """0.5.15+: ``if <mirror> is not None: max_seqlen_k = int(<mirror max> + X)
    else: max_seqlen_k = int(forward_batch.seq_lens.max().item()) + X``."""
    return [
        node
        for node in primitives.find_all_of(cst.If, fn, m.If(test=none_comparison(MIRROR, m.IsNot()), orelse=m.Else()))
        if node.orelse is not None
        and primitives.contains(node.body, _MIRROR_MAX)
        and primitives.contains(node.orelse, _DEVICE_MAX)
    ]


class NsaEagerMaxFromHostBound(ShimAware, MethodCodemod):
    DESCRIPTION = (
        f"{NSA}.init_forward_metadata: {MAX} from host_max_seq_len (mirror, else the batch's host bound, else "
        "max_context_len): no mirror assert (0.5.7 .. 0.5.14), no seq_lens.max().item() fallback (0.5.15+, "
        "sglang #33973)"
    )
    CLASS = NSA
    METHOD = "init_forward_metadata"
    # A fork's copy of this code (a renamed backend): what goes is its assert and host max of the mirror.
    REPLACES_VENDOR = (
        (r"seq_lens_cpu|seq_lens\.max", "the fork's assert / max of the seq_lens mirror becomes host_max_seq_len"),
    )

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        if primitives.contains(
            fn,
            m.Assign(
                targets=_SETS_MAX.targets, value=m.MatchIfTrue(lambda value: primitives.contains(value, _HOST_MAX))
            ),
        ):
            return Finding.done(self.anchor)
        if _upstream_fallback(fn):
            return Finding.todo(
                self.anchor, f"without the mirror {MAX} waits on seq_lens.max().item() (rank-divergent: sglang #33973)"
            )
        lines = _plain_max(fn)
        if len(lines) == 1:
            return Finding.todo(self.anchor, f"{MAX} is read from the CPU mirror, which is asserted")
        return self.missing_in(
            fn,
            f"no `{MAX} = int(forward_batch.seq_lens_cpu.max().item() + ...)` at the method's level, nor upstream's "
            "`if forward_batch.seq_lens_cpu is not None: ... else: ...seq_lens.max().item()`",
            f"one of them to size the page table from a host bound ({MAX} = host_max_seq_len(...))",
        )

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        found = _upstream_fallback(fn) or _plain_max(fn)
        old = found[0]
        value = primitives.find_all_of(
            cst.Call, old if isinstance(old, cst.SimpleStatementLine) else old.body, _MIRROR_MAX
        )[0]
        extra = code_of(cst.ensure_type(value.args[0].value, cst.BinaryOperation).right)
        (line,) = primitives.parse_statements_with_comments(f"""
            # The CPU mirror's max when there; without it the batch's host bound or the
            # static bound, never the device lengths (a host wait that differs between
            # DP-attention ranks, sglang #33973). It only sizes the page-table gather.
            {MAX} = int(host_max_seq_len(forward_batch.seq_lens_cpu, self.max_context_len, forward_batch) + {extra})
        """)
        self.require_import(MIRROR_READS, "host_max_seq_len")
        fn = primitives.replace_node(
            fn, old, line.with_changes(leading_lines=[*old.leading_lines, *line.leading_lines])
        )
        if isinstance(old, cst.SimpleStatementLine) and primitives.find_all(fn.body, ASSERTS_MIRROR):
            fn = primitives.remove_statements(fn, ASSERTS_MIRROR)
        return fn


class DsaEagerMaxFromHostBound(NsaEagerMaxFromHostBound):
    DESCRIPTION = NsaEagerMaxFromHostBound.DESCRIPTION.replace(NSA, DSA)
    CLASS = DSA


# -- the draft extend's assert of a host list it never reads ---------------------------------------

_IS_DRAFT_EXTEND = m.Call(func=attr("is_draft_extend"))
_IS_DRAFT_EXTEND_V2 = m.Call(func=attr("is_draft_extend_v2"))  # 0.5.14+: a branch of its own
_PREFIX = attr("extend_prefix_lens_cpu", m.Name("forward_batch"))


def _prefix_set(fn: cst.FunctionDef) -> m.Comparison:
    """``<prefix list> is not None``: the batch's, or a local read from it."""
    names = [
        cst.ensure_type(target.target, cst.Name).value
        for node in primitives.find_all_of(cst.Assign, fn, m.Assign(value=_PREFIX))
        for target in node.targets
        if isinstance(target.target, cst.Name)
    ]
    subject: m.MatchIfTrue[cst.BaseExpression] = m.MatchIfTrue(
        lambda node: m.matches(node, _PREFIX) or (isinstance(node, cst.Name) and node.value in names)
    )
    return none_comparison(subject, m.IsNot())


def _refills(branch: cst.If) -> bool:
    """0.5.15+: the branch first fills the prefix list when it is unset (from the device:
    upstream's own read), so its assert holds."""
    return any(m.matches(s, m.If(test=none_comparison(_PREFIX, m.Is()))) for s in branch.body.body)


def _draft_extend_asserts(fn: cst.FunctionDef) -> tuple[list[cst.If], list[cst.SimpleStatementLine]]:
    """The draft-extend branches (0.5.7 .. 0.5.13's shared one, 0.5.14+'s DRAFT_EXTEND_V2 one)
    and the assert lines of the prefix list in those that do not refill it."""
    branches = primitives.find_all_of(cst.If, fn, m.If(test=_IS_DRAFT_EXTEND | _IS_DRAFT_EXTEND_V2))
    prefix_set = _prefix_set(fn)
    lines = [
        stmt
        for branch in branches
        if not _refills(branch)
        for stmt in branch.body.body
        if isinstance(stmt, cst.SimpleStatementLine)
        and m.matches(stmt, m.SimpleStatementLine(body=[m.Assert()]))
        and primitives.contains(stmt, prefix_set)
    ]
    return branches, lines


def _without_prefix_test(test: cst.BaseExpression, prefix_set: m.Comparison) -> Optional[cst.BaseExpression]:
    """``test`` without its ``<prefix list> is not None`` term; None when that is all of it."""
    if m.matches(test, prefix_set):
        return None
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        left, right = _without_prefix_test(test.left, prefix_set), _without_prefix_test(test.right, prefix_set)
        if left is None or right is None:
            keep = right if left is None else left
            if keep is None:  # `<list> is not None and <list> is not None`
                return None
            return keep.with_changes(lpar=test.lpar, rpar=test.rpar) if test.lpar else keep
        return test.with_changes(left=left, right=right)
    return test


class NsaDraftExtendNeedsNoPrefixList(ShimAware, MethodCodemod):
    DESCRIPTION = (
        f"{NSA}.init_forward_metadata: the draft-extend branch no longer asserts extend_prefix_lens_cpu, which it "
        "never reads (the GPU-only draft extend leaves it unset)"
    )
    CLASS = NSA
    METHOD = "init_forward_metadata"
    REPLACES_VENDOR = (
        (
            r"extend_prefix_lens_cpu|extend_seq_lens|IsNot|And",
            "the fork's draft-extend assert of extend_prefix_lens_cpu goes",
        ),
    )

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        branches, lines = _draft_extend_asserts(fn)
        if lines:
            return Finding.todo(self.anchor, "the draft extend asserts extend_prefix_lens_cpu")
        if not branches:
            return self.missing_in(
                fn, "no `elif forward_batch.forward_mode.is_draft_extend(...)` branch", "the draft-extend branch"
            )
        if any(_refills(branch) for branch in branches):
            return Finding.superseded(
                self.anchor,
                "upstream's own DRAFT_EXTEND_V2 branch fills the prefix list it asserts (0.5.15+): left as upstream "
                "wrote it",
            )
        return Finding.done(self.anchor)

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        prefix_set = _prefix_set(fn)
        lines = _draft_extend_asserts(fn)[1]
        for line in lines:
            test = _without_prefix_test(cst.ensure_type(line.body[0], cst.Assert).test, prefix_set)
            if test is not None:
                fn = primitives.replace_node(fn, line.body[0], line.body[0].with_changes(test=test))
        gone = [line for line in lines if m.matches(line.body[0], m.Assert(test=prefix_set))]
        if gone:
            fn = primitives.remove_statements(
                fn, m.SimpleStatementLine() & m.MatchIfTrue(lambda node: any(node is line for line in gone))
            )
        return fn


class DsaDraftExtendNeedsNoPrefixList(NsaDraftExtendNeedsNoPrefixList):
    DESCRIPTION = NsaDraftExtendNeedsNoPrefixList.DESCRIPTION.replace(NSA, DSA)
    CLASS = DSA


# -- the spec-v2 path this patch is for ---------------------------------------------------------------


class NsaHasSpecV2Path(SpecV2Gate):
    """0.5.4.post3 .. 0.5.6.post2 call ``is_draft_extend()`` without
    ``include_v2``: spec v2 never runs on NSA there (sglang #15307, 0.5.7), so
    the patch is not applicable (``common.dsa.SpecV2Gate`` says where else)."""

    DESCRIPTION = f"{NSA}.init_forward_metadata handles the spec-v2 draft extend (sglang #15307, 0.5.7+)"
    CLASS = NSA


class DsaHasSpecV2Path(NsaHasSpecV2Path):
    DESCRIPTION = NsaHasSpecV2Path.DESCRIPTION.replace(NSA, DSA)
    CLASS = DSA
