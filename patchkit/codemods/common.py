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
* ``OptOutFlag``: ``needs_cpu_seq_lens: bool = False`` on a backend class
  (FA3, FlashMLA, TRT-LLM MHA);
* the verify tree mask (``cuda_graph_custom_mask``): TRT-LLM MLA's
  (``InitMask``, ``AllocMask``, ``VerifyBuffersReturnMask``, helpers imported
  at the module's last import) and FA3's on top of them, also FlashMLA's
  (``InitTreeMask``, ``AllocTreeMask``, ``VerifyBuffersReturnTreeMask``,
  helpers from ``backends.fa3``).
"""

from __future__ import annotations

from typing import ClassVar, Optional

import libcst as cst
import libcst.matchers as m

from patchkit.codemods import primitives
from patchkit.codemods.base import ClassCodemod, Finding, Guard, MethodCodemod, MethodGuards, State
from patchkit.codemods.primitives import ANY, attr, call, dotted, save
from patchkit.vendoring import import_path

RUNTIME = import_path("runtime")
MIRROR_READS = import_path("backends.mirror_reads")


# -- matchers ---------------------------------------------------------------------------------


def code_of(node: cst.CSTNode) -> str:
    """The source of one node."""
    return cst.Module([]).code_for_node(node)


def none_comparison(target: m.BaseMatcherNode, operator: m.BaseMatcherNode) -> m.Comparison:
    """``<target> is None`` (operator ``m.Is()``) or ``is not None`` (``m.IsNot()``)."""
    return m.Comparison(left=target, comparisons=[m.ComparisonTarget(operator=operator, comparator=m.Name("None"))])


# -- the mirror guards (needs-cpu-seq-lens) -----------------------------------------------------


class MirrorGuards(MethodGuards):
    """The reads of the CPU seq_lens mirror in one method; helpers from the
    vendored patchkit.runtime. A None test of any mirror value guards a read
    of any of them: the sync owner sets them None together."""

    VALUES: ClassVar[tuple[str, ...]] = ("seq_lens_cpu", "seq_lens_sum", "extend_prefix_lens_cpu", "extend_seq_lens_cpu")
    READS = "the CPU seq_lens mirror"
    HELPER_MODULE = RUNTIME


# -- the opt-out flag ---------------------------------------------------------------------------

FLAG = "needs_cpu_seq_lens"
SELF_FLAG = m.Attribute(value=m.Name("self"), attr=m.Name(FLAG))


def _flag_value(cls: cst.ClassDef) -> Optional[cst.BaseExpression]:
    found = primitives.find_class_attribute(cls, FLAG)
    if isinstance(found, (cst.Assign, cst.AnnAssign)):
        return found.value
    return None


class OptOutFlag(ClassCodemod):
    """``needs_cpu_seq_lens: bool = False`` as a class attribute, and no
    instance assignment in ``__init__`` that sets anything else."""

    WHY: ClassVar[str] = ""  # comment lines above the attribute, without "# "

    def _instance_assignments(self, cls: cst.ClassDef) -> list[cst.Assign]:
        init = primitives.find_method(cls, "__init__")
        if init is None:
            return []
        return primitives.find_all(init, m.Assign(targets=[m.AssignTarget(target=SELF_FLAG)]))

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        anchor = f"{self.CLASS}.{FLAG}"
        value = _flag_value(cls)
        if value is not None and not m.matches(value, m.Name("False")):
            return Finding.missing(anchor, f"this tree declares {FLAG} = {code_of(value)}; refusing to override it")
        if value is None:
            return Finding.todo(anchor, "class attribute not declared (inherits True / treated as True)")
        others = self._overriding_assignments(cls)
        if others:
            return Finding.todo(anchor, f"__init__ sets self.{FLAG} = {code_of(others[0].value)}")
        return Finding.done(anchor)

    def _overriding_assignments(self, cls: cst.ClassDef) -> list[cst.Assign]:
        """0.5.15's per-instance value (dflash only) that shadows the class
        attribute. Upstream from 0.5.16 assigns False in __init__ and 0.5.21+
        refines it afterwards (KV-shard pools keep the mirror): with a False
        assignment there, the other ones are upstream's later rules, kept."""
        assignments = self._instance_assignments(cls)
        if any(m.matches(a.value, m.Name("False")) for a in assignments):
            return []
        return assignments

    def transform_class(self, cls: cst.ClassDef) -> cst.ClassDef:
        if _flag_value(cls) is None:
            cls = primitives.add_class_attribute(cls, f"{FLAG}: bool = False")
            cls = primitives.space_class_attribute(cls, FLAG, self.WHY)
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
        if _tests(node.test, IS_NOT_NONE):
            regions.append(node.body)
        elif _tests(node.test, IS_NONE) and node.orelse is not None:
            regions.append(node.orelse)
    return regions


def max_item(receiver: m.BaseMatcherNode) -> m.BaseMatcherNode:
    """The host max of a tensor, as a Python number: ``<receiver>.max().item()``,
    ``int(<receiver>.max())``, ``torch.max(<receiver>).item()`` or ``int(torch.max(<receiver>))``."""
    tensor_max = m.Call(func=attr("max", receiver), args=[]) | m.Call(func=dotted("torch.max"), args=[m.Arg(receiver, keyword=None)])
    return m.Call(func=attr("item", tensor_max), args=[]) | m.Call(func=m.Name("int"), args=[m.Arg(tensor_max, keyword=None)])


def first_rows(value: m.BaseMatcherNode, rows: str) -> m.Subscript:
    """``<value>[:ROWS]`` (the first rows)."""
    return m.Subscript(
        value=value,
        slice=[m.SubscriptElement(slice=m.Slice(lower=None, upper=save(ANY, rows), step=None))],
    )


class _NoneTestGuards(MethodGuards):
    """MethodGuards where upstream's own guard is a None test on the mirror
    around the read (an ``if`` or a conditional expression), anywhere in the
    method, or an ``if`` matching UPSTREAM; such reads need nothing."""

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
    REPLACES_VENDOR = ((r"int|torch|max|item", "the vendor's host max of the CPU mirror becomes host_max_seq_len (the same value with the mirror)"),)


#: The eager metadata reads (FA3 and TRT-LLM MHA share their shape).
EAGER_GUARDS = (
    # 0.5.10 .. 0.5.14: the mirror's max sizes the req_to_token gather.
    Guard(max_item(save(attr("seq_lens_cpu", m.Name("forward_batch")), "M")), f"host_max_seq_len(M, {BOUND})", "host_max_seq_len"),
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
    Guard(max_item(first_rows(save(m.Name("seq_lens_cpu"), "M"), "N")), "rows_max(M, forward_batch.seq_lens, N)", "rows_max"),
    Guard(max_item(save(m.Name("seq_lens_cpu"), "M")), f"host_max_seq_len(M, {BOUND})", "host_max_seq_len"),
    # The GPU-only draft extend leaves the prefix host list unset (the
    # lengths stay a device tensor) and may leave the extend one unset.
    Guard(call("any", m.Arg(save(attr("extend_prefix_lens_cpu", m.Name("forward_batch")), "L"))), "any_host_lens(L)", "any_host_lens"),
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
    "{} CUDA-graph replay metadata: seq_lens_cpu may be None; host max from the mirror "
    "or the static max_context_len"
)


# -- the verify tree mask (TRT-LLM MLA, FA3, FlashMLA) -------------------------------------------

MASK = "cuda_graph_custom_mask"
GET_BUFFERS = "get_verify_buffers_to_fill_after_draft"
#: Where the backend records the batch size its mask was sized for
#: (backends.verify_tree_mask.MAX_BS_ATTR; the spec worker reads it).
MAX_BS = "verify_tree_mask_max_bs"

SELF_MASK = m.Attribute(value=m.Name("self"), attr=m.Name(MASK))
ASSIGNS_MASK = m.Assign(targets=[m.AssignTarget(target=SELF_MASK)]) | m.AnnAssign(target=SELF_MASK)
PARENT_CUDA_GRAPH_STATE = primitives.super_call("init_cuda_graph_state")
ASSIGNS_MAX_BS = m.Assign(targets=[m.AssignTarget(target=m.Attribute(value=m.Name("self"), attr=m.Name(MAX_BS)))])

SUPERSEDED_WHY = f"upstream replaced {MASK} with the verify_mask property (sglang 0.5.17+)"


def _assigns_mask(fn: cst.FunctionDef | None) -> bool:
    return fn is not None and primitives.contains(fn, ASSIGNS_MASK)


def record_max_bs(fn: cst.FunctionDef) -> cst.FunctionDef:
    """``self.verify_tree_mask_max_bs = max_bs`` right after the statement
    that allocates the mask (a fresh apply and an upgrade of a tree patched
    before the bound was recorded read the same)."""
    source = f"""
        # The mask holds max_bs requests: the spec worker hands it to
        # build_tree_kernel_efficient only for a batch it fits, so an eager
        # batch above the captured size never writes past its end.
        self.{MAX_BS} = max_bs
    """
    index = primitives.find_statement_index(fn, ASSIGNS_MASK)
    body = list(fn.body.body)
    body[index + 1 : index + 1] = primitives.parse_statements_with_comments(source)
    return fn.with_changes(body=fn.body.with_changes(body=body))


def _mask_superseded(cls: cst.ClassDef) -> bool:
    """Upstream's later shape: a ``verify_mask`` accessor and no custom mask."""
    if primitives.find_method(cls, "verify_mask") is None:
        return False
    return not any(
        _assigns_mask(primitives.find_method(cls, name)) for name in ("__init__", "init_cuda_graph_state")
    )


class _MaskMethod(MethodCodemod):
    """A method of the target backend that gets a part of the custom mask;
    superseded where upstream replaced the mask (:func:`_mask_superseded`)."""

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        self._superseded = _mask_superseded(cls)
        return super().detect_in_class(cls)

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        if _assigns_mask(fn):
            return Finding.done(self.anchor)
        if self._superseded:
            return Finding.superseded(self.anchor, SUPERSEDED_WHY)
        return self.detect_todo(fn)

    def detect_todo(self, fn: cst.FunctionDef) -> Finding:
        raise NotImplementedError


class InitMask(_MaskMethod):
    """``__init__`` sets ``self.cuda_graph_custom_mask = None``."""

    METHOD = "__init__"

    def detect_todo(self, fn: cst.FunctionDef) -> Finding:
        return Finding.todo(self.anchor, f"self.{MASK} not initialised")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        return primitives.insert_at_end(fn, f"self.{MASK} = None")


class AllocMask(_MaskMethod):
    """The worst-case mask for the captured ``max_bs``, and that ``max_bs``
    recorded beside it: the spec worker hands the mask over only to batches
    it fits (``backends.verify_tree_mask``; see verify_tree_mask_fits).

    A tree patched by an earlier patchkit allocates the mask (our helper
    call) without recording the bound: TODO, and the transform adds only the
    record, so the upgrade reads exactly as a fresh apply. Upstream's own
    allocation (0.5.13 .. 0.5.16, no bound: its hook is upstream's contract)
    and a fork's are left as they are.

    The helper ``ALLOC_HELPER`` comes from ``HELPERS`` (imported after the
    module's last top-level import)."""

    METHOD = "init_cuda_graph_state"
    #: The module of the helpers the transform calls.
    HELPERS: ClassVar[str]
    #: The helper whose call marks patchkit's own allocation.
    ALLOC_HELPER: ClassVar[str] = "alloc_cuda_graph_custom_mask"

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        if _assigns_mask(fn) and not primitives.contains(fn, ASSIGNS_MAX_BS) and self._ours(fn):
            return self._needs_max_bs(fn) or Finding.todo(
                self.anchor,
                f"self.{MASK} allocated by an earlier patchkit without recording max_bs "
                "(an eager batch above it would get the mask and write past its end)",
            )
        return super().detect_in_method(fn)

    def _ours(self, fn: cst.FunctionDef) -> bool:
        return primitives.contains(fn, m.Assign(targets=[m.AssignTarget(target=SELF_MASK)], value=m.Call(func=m.Name(self.ALLOC_HELPER))))

    def _needs_max_bs(self, fn: cst.FunctionDef):
        params = [p.name.value for p in fn.params.params]
        if "max_bs" not in params:
            return self.missing_in(fn, f"parameters ({', '.join(params)})", "a max_bs parameter to record the mask's bound")
        return None

    def detect_todo(self, fn: cst.FunctionDef) -> Finding:
        params = [p.name.value for p in fn.params.params]
        if "max_num_tokens" not in params:
            return self.missing_in(fn, f"parameters ({', '.join(params)})", "a max_num_tokens parameter to size the mask with")
        return self._needs_max_bs(fn) or Finding.todo(self.anchor, f"self.{MASK} not allocated")

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        # After the module's last top-level import: libcst's AddImportsVisitor would
        # put it right under `from __future__`, above the docstring-like string these
        # files have there.
        return primitives.add_import_sorted(super().transform_module_impl(tree), self.HELPERS, self.ALLOC_HELPER)

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        if not _assigns_mask(fn):
            fn = self.insert_mask(fn)
        return record_max_bs(fn)

    def insert_mask(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        source = f"""
            # Worst-case FULL_MASK tree mask (bool) for verify; build_tree fills it
            # in place, so the GPU-only spec-v2 path needs no seq_lens_sum.
            self.{MASK} = {self.ALLOC_HELPER}(
                max_num_tokens=max_num_tokens,
                max_context_len=self.max_context_len,
                num_draft_tokens=self.num_draft_tokens,
                skip_prefill=self.skip_prefill,
                device=self.device,
            )
        """
        # Before handing over to the parent, as upstream; else at the end.
        if primitives.find_statement_index(fn, PARENT_CUDA_GRAPH_STATE) is not None:
            return primitives.insert_before(fn, PARENT_CUDA_GRAPH_STATE, source)
        return primitives.insert_at_end(fn, source)


class VerifyBuffersReturnMask(ClassCodemod):
    """``get_verify_buffers_to_fill_after_draft`` returns the mask, through
    ``BUFFERS_HELPER`` from ``HELPERS`` (imported after the module's last
    top-level import)."""

    HELPERS: ClassVar[str]
    BUFFERS_HELPER: ClassVar[str] = "verify_buffers_to_fill_after_draft"

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        anchor = f"{self.CLASS}.{GET_BUFFERS}"
        fn = primitives.find_method(cls, GET_BUFFERS)
        if fn is not None:
            if primitives.contains(fn, SELF_MASK):
                return Finding.done(anchor)
            return Finding.missing(
                anchor,
                f"{self.where(fn)}: this tree overrides it without self.{MASK}; refusing to replace it "
                "(the patch needs it to return the mask)",
            )
        if _mask_superseded(cls):
            return Finding.superseded(anchor, SUPERSEDED_WHY)
        return Finding.todo(anchor, "not overridden (the base returns [None, None])")

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        return primitives.add_import_sorted(super().transform_module_impl(tree), self.HELPERS, self.BUFFERS_HELPER)

    def transform_class(self, cls: cst.ClassDef) -> cst.ClassDef:
        source = f'''
            def {GET_BUFFERS}(self):
                """[tree mask, positions] buffers that build_tree fills after draft."""
                return {self.BUFFERS_HELPER}(self.{MASK})
        '''
        after = "init_cuda_graph_state" if primitives.find_method(cls, "init_cuda_graph_state") else None
        return primitives.add_method(cls, source, after=after)


# FA3's tree mask (FlashMLA's too): the detection above, FA3's own code from
# patchkit.backends.fa3, imported by the engine (ClassCodemod's transform, not
# the TRT-LLM MLA import above).


class _TreeMaskPart:
    """Mixin: the FA3 transform, with FA3's helpers imported by the engine."""

    HELPERS: ClassVar[str] = import_path("backends.fa3")
    HELPER: ClassVar[str]

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        self.require_import(self.HELPERS, self.HELPER)
        return ClassCodemod.transform_module_impl(self, tree)


class InitTreeMask(InitMask):
    """``__init__``: ``self.cuda_graph_custom_mask = None`` and
    ``self.is_draft_runner`` (draft-worker instances never verify)."""

    #: The backend's name in the comment the transform writes.
    KIND: ClassVar[str]

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        finding = super().detect_in_class(cls)
        init = primitives.find_method(cls, "__init__")
        if finding.state is State.TODO and "model_runner" not in {p.name.value for p in init.params.params}:
            return Finding.missing(finding.anchor, "no model_runner parameter to tell a draft-worker instance by")
        return finding

    def transform_class(self, cls: cst.ClassDef) -> cst.ClassDef:
        source = f"""
            # Preallocated verify tree mask (init_cuda_graph_state); handed to
            # build_tree_kernel_efficient so it needs no seq_lens_sum.
            self.{MASK} = None
            # The draft worker's {self.KIND} instances never verify: no tree mask there.
            self.is_draft_runner = getattr(model_runner, "is_draft_worker", False)
        """
        return primitives.replace_method(cls, "__init__", lambda fn: primitives.insert_at_end(fn, source))


class AllocTreeMask(_TreeMaskPart, AllocMask):
    """``init_cuda_graph_state`` preallocates the mask on the target backend
    only and records the captured ``max_bs`` it fits."""

    HELPER = "alloc_verify_tree_mask"
    ALLOC_HELPER = HELPER
    #: Where the backend keeps the configured number of draft tokens.
    NUM_DRAFT_TOKENS: ClassVar[str] = "self.speculative_num_draft_tokens"

    def insert_mask(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        # At the end: FA3's init_cuda_graph_state does not hand over to a parent.
        source = f"""
            # Worst-case FULL_MASK verify tree mask (bool), filled in place by
            # build_tree_kernel_efficient: the GPU-only path needs no seq_lens_sum.
            self.{MASK} = alloc_verify_tree_mask(
                max_num_tokens=max_num_tokens,
                max_context_len=self.max_context_len,
                num_draft_tokens={self.NUM_DRAFT_TOKENS},
                skip_prefill=self.skip_prefill,
                is_draft_runner=self.is_draft_runner,
                device=self.device,
            )
        """
        return primitives.insert_at_end(fn, source)


class VerifyBuffersReturnTreeMask(_TreeMaskPart, VerifyBuffersReturnMask):
    """``get_verify_buffers_to_fill_after_draft`` returns the mask (``verify_buffers``)."""

    HELPER = "verify_buffers"

    def transform_class(self, cls: cst.ClassDef) -> cst.ClassDef:
        source = f'''
            def {GET_BUFFERS}(self):
                """[tree mask, positions] that build_tree_kernel_efficient fills after draft."""
                return verify_buffers(self.{MASK})
        '''
        after = primitives.find_first_method(cls, ("get_cuda_graph_seq_len_fill_value", "init_cuda_graph_state"))
        return primitives.add_method(cls, source, after=after.name.value if after else None)
