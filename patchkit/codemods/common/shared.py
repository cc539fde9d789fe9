"""The pieces patch modules share: the one floor between ``primitives`` /
``base`` and the patch modules.

The codemods layer as ``primitives`` (navigating and editing a CST; generic
matchers such as ``attr``, ``call``, ``save``, ``ANY``) and ``base`` (the
codemod contract), then this module, then one module per patch. A patch module
imports only those three, never another patch module: what two patches share
lives here, parameterised by class attributes (``CLASS``, ``HELPERS``,
``KIND`` ...), and each patch module defines its codemods as subclasses, so
their names (``module.Class``: patch files, state files, the transform cache)
stay those of the patch.

* matchers: ``code_of``, ``none_comparison``; ``MIRROR_READS``, the helper
  module of the backends' guards;
* ``MirrorGuards`` (needs-cpu-seq-lens' guards, helpers from the vendored
  ``patchkit.runtime``) and ``MirrorReadGuards`` (the backends' guards, helpers
  from ``backends.mirror_reads``), with the eager and CUDA-graph replay reads
  FA3 and TRT-LLM MHA share (``EagerMirrorReads``, ``ReplayMirrorReads``);
* ``ClassFlag``, the one flag codemod: ``needs_cpu_seq_lens`` declared on a
  class, each patch saying how (needs-cpu-seq-lens' declarations, TRT-LLM
  MLA's opt-outs); ``OptOutFlag`` the backends' opt-out (FA3, FlashMLA, TRT-LLM MHA);

The verify tree mask the FA3, FlashMLA and TRT-LLM MLA codemods share lives
on the same floor, in ``tree_mask``; the draft-extend graph runner's top-k
guards (trtllm-mha-draft-extend-v2, draft-extend-graph-no-topk) in
``draft_extend_topk``; the spec-v2 worker's draft-extend CUDA-graph check
(TRT-LLM MHA, FA3) in ``draft_extend_gate``.
"""

from __future__ import annotations

from typing import ClassVar, Optional

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import ClassCodemod, Finding, State
from patchkit.codemods.common.method_guards import Guard, MethodGuards
from patchkit.codemods.common.primitives import ANY, attr, call, save
from patchkit.layout import import_path

RUNTIME = import_path("runtime")
MIRROR_READS = import_path("backends.mirror_reads")


# -- matchers ---------------------------------------------------------------------------------


def code_of(node: cst.CSTNode) -> str:
    """The source of one node."""
    return cst.Module([]).code_for_node(node)


def none_comparison(target: primitives.Expr, operator: primitives.Field[m.BaseCompOpMatchType]) -> m.Comparison:
    """``<target> is None`` (operator ``m.Is()``) or ``is not None`` (``m.IsNot()``)."""
    return m.Comparison(left=target, comparisons=[m.ComparisonTarget(operator=operator, comparator=m.Name("None"))])


# -- the mirror guards (needs-cpu-seq-lens) -----------------------------------------------------


class MirrorGuards(MethodGuards):
    """The reads of the CPU seq_lens mirror in one method; helpers from the
    vendored patchkit.runtime. A None test of any mirror value guards a read
    of any of them: the sync owner sets them None together."""

    VALUES: ClassVar[tuple[str, ...]] = (
        "seq_lens_cpu",
        "seq_lens_sum",
        "extend_prefix_lens_cpu",
        "extend_seq_lens_cpu",
    )
    READS = "the CPU seq_lens mirror"
    HELPER_MODULE = RUNTIME


# -- the opt-out flag ---------------------------------------------------------------------------

FLAG = "needs_cpu_seq_lens"
SELF_FLAG = m.Attribute(value=m.Name("self"), attr=m.Name(FLAG))


class ClassFlag(ClassCodemod):
    """``needs_cpu_seq_lens: bool = VALUE`` declared on ``CLASS``: the one flag
    codemod. A patch's subclass says how (class attributes):

    * ``VALUE``: what is declared (True: the base class's default; False: an opt-out);
    * ``WHY``: comment lines above the attribute, without ``# ``;
    * ``KEEPS_TREE_VALUE``: a declaration the tree already has is done, whatever
      its value (the base class's default); else only False is, and any other
      value (or none) is refused, saying where;
    * ``INIT``: also an ``__init__`` assignment that sets anything else must
      say False (0.5.15's per-instance opt-out of the spec-v2 backends);
    * ``UPSTREAM_LAYOUT``: a blank line above the attribute wherever it lands,
      as upstream wrote TRT-LLM MLA's (else black's layout:
      ``primitives.space_class_attribute``).
    """

    VALUE: ClassVar[bool] = False
    WHY: ClassVar[str] = ""
    METHODS_READ = ("__init__",)  # a per-instance value
    KEEPS_TREE_VALUE: ClassVar[bool] = False
    INIT: ClassVar[bool] = False
    UPSTREAM_LAYOUT: ClassVar[bool] = False

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        anchor = f"{self.CLASS}.{FLAG}"
        found = primitives.find_class_attribute(cls, FLAG)
        own = self._vendor_opt_out(cls) if found is None else None
        if own is not None:
            return self.vendors_own(anchor, f"opts {self.CLASS} out of the CPU mirror (per instance)", own)
        if found is None:
            why = "" if self.KEEPS_TREE_VALUE else " (inherits True / treated as True)"
            return Finding.todo(anchor, "class attribute not declared" + why)
        if self.KEEPS_TREE_VALUE:
            return Finding.done(anchor)
        value = getattr(found, "value", None)
        if value is None:
            return self.located(
                Finding.missing(
                    anchor, f"{self.where(found)}: this tree declares {FLAG} without a value; refusing to override it"
                ),
                found,
            )
        if not m.matches(value, m.Name("False")):
            return self.located(
                Finding.missing(
                    anchor,
                    f"{self.where(found)}: this tree declares {FLAG} = {code_of(value)}; refusing to override it (the patch needs False)",
                ),
                found,
            )
        others = self._overriding_assignments(cls)
        if others:
            return self.located(Finding.todo(anchor, f"__init__ sets self.{FLAG} = {code_of(others[0].value)}"), found)
        return Finding.done(anchor)

    def _vendor_opt_out(self, cls: cst.ClassDef) -> Optional[cst.Assign]:
        """An opt-out the tree declares its own way: no class attribute, but
        ``__init__`` sets ``self.needs_cpu_seq_lens = False`` and nothing else
        (the decision reads the instance's value, as the audit does)."""
        init = primitives.find_method(cls, "__init__") if not self.KEEPS_TREE_VALUE and self.VALUE is False else None
        if init is None:
            return None
        assignments = primitives.find_all_of(cst.Assign, init, m.Assign(targets=[m.AssignTarget(target=SELF_FLAG)]))
        if assignments and all(m.matches(a.value, m.Name("False")) for a in assignments):
            return assignments[0]
        return None

    def _overriding_assignments(self, cls: cst.ClassDef) -> list[cst.Assign]:
        """0.5.15's per-instance value (dflash only) that shadows the class
        attribute. Upstream from 0.5.16 assigns False in __init__ and 0.5.21+
        refines it afterwards (KV-shard pools keep the mirror): with a False
        assignment there, the other ones are upstream's later rules, kept."""
        init = primitives.find_method(cls, "__init__") if self.INIT else None
        if init is None:
            return []
        assignments = primitives.find_all_of(cst.Assign, init, m.Assign(targets=[m.AssignTarget(target=SELF_FLAG)]))
        if any(m.matches(a.value, m.Name("False")) for a in assignments):
            return []
        return assignments

    def transform_class(self, cls: cst.ClassDef) -> cst.ClassDef:
        if primitives.find_class_attribute(cls, FLAG) is None:
            cls = primitives.add_class_attribute(cls, f"{FLAG}: bool = {self.VALUE}")
            cls = (
                self._upstream_layout(cls)
                if self.UPSTREAM_LAYOUT
                else primitives.space_class_attribute(cls, FLAG, self.WHY)
            )
        if self._overriding_assignments(cls):
            # 0.5.15 opted out for dflash only, per instance; the class-wide
            # opt-out must win, so that assignment says False as well.
            cls = primitives.replace_method(
                cls,
                "__init__",
                lambda fn: primitives.replace_expressions(
                    fn,
                    m.Assign(targets=[m.AssignTarget(target=SELF_FLAG)], value=~m.Name("False")),
                    lambda node, _: node.with_changes(value=cst.Name("False")),
                ),
            )
        return cls

    def _upstream_layout(self, cls: cst.ClassDef) -> cst.ClassDef:
        body = list(primitives.class_body(cls))
        declares_flag = m.SimpleStatementLine(body=[m.AnnAssign(target=m.Name(FLAG))])
        index = next(i for i, stmt in enumerate(body) if m.matches(stmt, declares_flag))
        lines = [cst.EmptyLine(indent=False)] if index > 0 else []
        lines += [cst.EmptyLine(comment=cst.Comment(f"# {c}".rstrip())) for c in self.WHY.splitlines()]
        body[index] = body[index].with_changes(leading_lines=lines)
        return cls.with_changes(body=cls.body.with_changes(body=body))


class OptOutFlag(ClassFlag):
    """``needs_cpu_seq_lens: bool = False``, and no ``__init__`` assignment that
    sets anything else (FA3, FlashMLA, TRT-LLM MHA)."""

    INIT = True


# -- the backends' reads of the mirror (FA3, TRT-LLM MHA, FlashMLA) ----------------------------


MIRROR = attr("seq_lens_cpu", m.Name("forward_batch")) | m.Name("seq_lens_cpu")
IS_NOT_NONE = none_comparison(MIRROR, m.IsNot())
IS_NONE = none_comparison(MIRROR, m.Is())


def _tests(node: cst.BaseExpression, comparison: m.BaseMatcherNode) -> bool:
    """``node`` is ``comparison``, or an ``and`` chain holding it."""
    if m.matches(node, comparison):
        return True
    if isinstance(node, cst.BooleanOperation) and isinstance(node.operator, cst.And):
        return _tests(node.left, comparison) or _tests(node.right, comparison)
    return False


def _guarded_regions(fn: cst.FunctionDef) -> list[cst.CSTNode]:
    """The code upstream runs only with the mirror: the body of ``if mirror is
    not None`` and of ``A if mirror is not None else B`` (and the else side of
    the ``is None`` forms)."""
    regions: list[cst.CSTNode] = []
    for node in primitives.find_all(fn, m.If() | m.IfExp()):
        if not isinstance(node, (cst.If, cst.IfExp)):  # what the matcher finds
            continue
        if _tests(node.test, IS_NOT_NONE):
            regions.append(node.body)
        elif _tests(node.test, IS_NONE) and node.orelse is not None:
            regions.append(node.orelse)
    return regions


def max_item(receiver: primitives.Expr) -> m.OneOf[m.BaseExpressionMatchType]:
    """The host max of a tensor, as a Python number, in the spellings vendors
    use (``primitives.host_scalar``): ``<receiver>.max().item()``,
    ``int(<receiver>.max())``, ``torch.max(<receiver>).item()``, casts on the
    receiver or the max (``<receiver>.int().max().item()``). A batch slice of
    the receiver is another value (``first_rows``: the rows' max)."""
    return primitives.host_scalar("max", receiver, slices=False)


def first_rows(value: primitives.Expr, rows: str) -> m.Subscript:
    """``<value>[:ROWS]`` (the first rows)."""
    return m.Subscript(
        value=value,
        slice=[m.SubscriptElement(slice=m.Slice(lower=None, upper=save(ANY, rows), step=None))],
    )


class _NoneTestGuards(MethodGuards):
    """MethodGuards where upstream's own guard is a None test on the mirror
    around the read (an ``if`` or a conditional expression), anywhere in the
    method, or an ``if`` matching UPSTREAM; such reads need nothing."""

    METHODS_READ: ClassVar[Optional[tuple[str, ...]]] = ()  # detect_in_class reads the method alone

    def _unguarded(self, fn: cst.FunctionDef, guard: Guard) -> list[cst.CSTNode]:
        found = primitives.find_all(fn, guard.site, guard.within)
        if not found:
            return found
        regions = _guarded_regions(fn)
        if self.UPSTREAM is not None:
            regions += primitives.find_all(fn, self.UPSTREAM)
        covered = {id(n) for region in regions for n in primitives.find_all(region, guard.site, guard.within)}
        return [n for n in found if id(n) not in covered]

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        finding = super().detect_in_class(cls)
        fn = self.find_method(cls)
        if finding.state is State.MISSING and fn is not None and _guarded_regions(fn):
            return Finding.done(self.anchor, "upstream's own None test on the mirror")
        return finding


BOUND = "self.max_context_len"


class MirrorReadGuards(_NoneTestGuards):
    """Guards whose helpers come from ``backends.mirror_reads`` (FA3 and TRT-LLM MHA)."""

    VALUES = MirrorGuards.VALUES
    READS = MirrorGuards.READS
    HELPER_MODULE = MIRROR_READS
    # A fork's spelling of the host max (`int(M.max())`, `torch.max(M).item()`) is what the guard replaces.
    REPLACES_VENDOR = (
        (
            r"int|torch|max|item",
            "the vendor's host max of the CPU mirror becomes host_max_seq_len (the same value with the mirror)",
        ),
    )


#: The eager metadata reads (FA3 and TRT-LLM MHA share their shape).
EAGER_GUARDS = (
    # 0.5.10 .. 0.5.14: the mirror's max sizes the req_to_token gather.
    Guard(
        max_item(save(attr("seq_lens_cpu", m.Name("forward_batch")), "M")),
        f"host_max_seq_len(M, {BOUND}, forward_batch)",
        "host_max_seq_len",
    ),
    # 0.5.15: a mirror-or-local-D2H variable; it becomes the mirror (None
    # without), and its reads below are bounded like the others.
    Guard(
        m.IfExp(
            test=IS_NOT_NONE,
            body=save(attr("seq_lens_cpu", m.Name("forward_batch")), "M"),
            orelse=m.Call(func=attr("cpu")),
        ),
        "M",
    ),
    Guard(
        max_item(first_rows(save(m.Name("seq_lens_cpu"), "M"), "N")),
        "rows_max(M, forward_batch.seq_lens, N)",
        "rows_max",
    ),
    Guard(
        max_item(save(m.Name("seq_lens_cpu"), "M")), f"host_max_seq_len(M, {BOUND}, forward_batch)", "host_max_seq_len"
    ),
    # The GPU-only draft extend leaves the prefix host list unset (the
    # lengths stay a device tensor) and may leave the extend one unset.
    Guard(
        call("any", m.Arg(save(attr("extend_prefix_lens_cpu", m.Name("forward_batch")), "L"))),
        "any_host_lens(L)",
        "any_host_lens",
    ),
    Guard(
        call("max", m.Arg(save(attr("extend_seq_lens_cpu", m.Name("forward_batch")), "L"))),
        "max_host_lens(L, self.speculative_num_draft_tokens)",
        "max_host_lens",
    ),
)


class EagerMirrorReads(MirrorReadGuards):
    """The eager ``init_forward_metadata`` reads of FA3's shape (FA3, TRT-LLM MHA)."""

    METHOD = "init_forward_metadata"
    GUARDS = EAGER_GUARDS
    # 0.5.16+: the draft-extend branch comes first and reads the host lists
    # only where they are set.
    UPSTREAM = m.If(test=m.Call(func=attr("is_draft_extend_v2")))


#: EagerMirrorReads' DESCRIPTION, for a backend class.
EAGER_DESCRIPTION = (
    "{}.init_forward_metadata: page-table width from the mirror or the static max_context_len; "
    "draft-extend host lengths may be unset"
)


#: The CUDA-graph replay reads (FA3 and TRT-LLM MHA share their shape).
REPLAY_GUARDS = (
    Guard(first_rows(save(m.Name("seq_lens_cpu"), "M"), "N"), "rows_or_none(M, N)", "rows_or_none"),
    Guard(max_item(save(m.Name("seq_lens_cpu"), "M")), f"host_max_seq_len(M, {BOUND})", "host_max_seq_len"),
    # 0.5.15: the spec branches fell back to a local D2H; the page-table
    # width they feed takes the static bound instead, as in 0.5.16.
    Guard(
        m.Assign(
            targets=[m.AssignTarget(target=save(attr("max_seq_len_k"), "T"))],
            value=m.Call(func=attr("_host_max_seq_len", m.Name("self")), args=[m.Arg(save(ANY, "M")), m.Arg()]),
        ),
        f"T = host_max_seq_len(M, {BOUND})",
        "host_max_seq_len",
    ),
)


class ReplayMirrorReads(MirrorReadGuards):
    """The CUDA-graph replay reads of FA3's shape (FA3, TRT-LLM MHA)."""

    METHOD = "init_forward_metadata_replay_cuda_graph"
    RENAMED = ("_apply_cuda_graph_metadata",)  # 0.5.13+
    GUARDS = REPLAY_GUARDS


#: ReplayMirrorReads' DESCRIPTION, for a backend class.
REPLAY_DESCRIPTION = (
    "{} CUDA-graph replay metadata: seq_lens_cpu may be None; host max from the mirror or the static max_context_len"
)
