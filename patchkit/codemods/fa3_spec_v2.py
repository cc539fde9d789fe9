"""FA3 (``FlashAttentionBackend``) opts out of the spec-v2 seq_lens D2H sync.

Upstream: sglang #29343 (sync-free page table: built on the device over a
static width), #29589 (preallocated FULL_MASK tree mask handed to
``build_tree_kernel_efficient``; FA3 opts out for every spec algorithm),
#31364 (the multi-step draft wrapper declares the flag; draft-extend q width
from the config when the host lengths are unset; CUDA-graph replay passes
``None`` instead of a stale pinned ``seq_lens_cpu`` buffer) and #31527 (the
tree mask only on the target backend). All of them are in the sglang 0.5.16
wheel (SPEC.md's table of later changes says 0.5.17), so 0.5.16+ is native.

What FA3 read from the CPU mirror, and what it reads now (helpers in
``patchkit.backends.mirror_reads``, each exactly the old value when the mirror is there):

* eager ``init_forward_metadata``: ``forward_batch.seq_lens_cpu.max().item()``
  sized the page table gathered from ``req_to_token`` -> the static bound
  ``max_context_len`` without the mirror (FA3's kernels stop every row at the
  device ``cache_seqlens``; nothing else reads the value on the spec paths);
  the draft-extend test ``any(extend_prefix_lens_cpu)`` and
  ``max(extend_seq_lens_cpu)`` cope with the unset host lists of the GPU-only
  draft extend (q width = the configured number of draft tokens). 0.5.15
  already had a mirror-or-local-D2H variable: its fallback becomes None and its
  reads bounded the same way.
* CUDA-graph replay (``init_forward_metadata_replay_cuda_graph``, 0.5.13+
  ``_apply_cuda_graph_metadata``): the slice ``seq_lens_cpu[:bs]`` and each
  host max the same way; 0.5.15's local ``_host_max_seq_len`` syncs on the spec
  branches as well; and the page count handed to the fused Triton page-table
  writer (``normal_decode_set_metadata``, which masks only by that count) is
  kept within the preallocated table.
* the verify tree mask: ``__init__`` sets ``cuda_graph_custom_mask = None``
  and records whether this instance is on the draft worker;
  ``init_cuda_graph_state`` allocates the worst case on the target backend;
  ``get_verify_buffers_to_fill_after_draft`` hands it to the worker, so
  ``build_tree_kernel_efficient`` never needs ``seq_lens_sum``.
* ``needs_cpu_seq_lens = False`` on ``FlashAttentionBackend`` (0.5.15's
  dflash-only instance assignment becomes False too) and on
  ``FlashAttentionMultiStepBackend``.

The CUDA-graph runners' stale-buffer fix (#31364's other half) is a patch of
its own, ``replay-no-stale-mirror``, which this one requires: it only matters
once a backend that opts out reads ``seq_lens_cpu`` during replay, and FA3 is
the first that does (Triton and TRT-LLM MLA never read it there);
trtllm-mha-spec-v2 needs it too.

0.5.17 replaced ``cuda_graph_custom_mask`` with a ``verify_mask`` property:
the tree-mask parts are superseded there, never re-added.
"""

from __future__ import annotations

from typing import ClassVar, Optional

import libcst as cst
import libcst.matchers as m

from patchkit.codemods import primitives
from patchkit.codemods import trtllm_mla_spec_v2 as mla
from patchkit.codemods.replay_no_stale_mirror import MIRROR_READS, code_of, none_comparison
from patchkit.codemods.base import ClassCodemod, Finding, State
from patchkit.codemods.needs_cpu_seq_lens_guards import ANY, Guard, MethodGuards, MirrorGuards, attr, call, save
from patchkit.codemods.primitives import dotted
from patchkit.vendoring import import_path

BACKEND = "FlashAttentionBackend"
DRAFT_BACKEND = "FlashAttentionMultiStepBackend"
FLAG, MASK, GET_BUFFERS = mla.FLAG, mla.MASK, mla.GET_BUFFERS
HELPERS = import_path("backends.fa3")  # the verify tree mask
SELF_FLAG = m.Attribute(value=m.Name("self"), attr=m.Name(FLAG))


# -- the flags -----------------------------------------------------------------------------


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


class BackendOptsOut(OptOutFlag):
    DESCRIPTION = f"{BACKEND}.{FLAG} = False: no FA3 read of seq_lens_cpu / seq_lens_sum is left on the spec-v2 paths"
    CLASS = BACKEND
    WHY = (
        "Page tables use a static width without the CPU mirror and the verify tree\n"
        "mask is preallocated, so no seq_lens_cpu / seq_lens_sum D2H is needed."
    )


class DraftWrapperOptsOut(OptOutFlag):
    DESCRIPTION = f"{DRAFT_BACKEND}.{FLAG} = False: the draft steps are FA3 backends that opt out"
    CLASS = DRAFT_BACKEND
    WHY = (
        "Read by decide_needs_cpu_seq_lens (a missing flag counts as True); the\n"
        "per-step FA3 backends never read the CPU mirror."
    )


# -- the reads of the mirror --------------------------------------------------------------


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


class EagerMetadataWithoutMirror(MirrorReadGuards):
    DESCRIPTION = (
        f"{BACKEND}.init_forward_metadata: page-table width from the mirror or the static max_context_len; "
        "draft-extend host lengths may be unset"
    )
    CLASS = BACKEND
    METHOD = "init_forward_metadata"
    GUARDS = EAGER_GUARDS
    # 0.5.16+: the draft-extend branch comes first and reads the host lists
    # only where they are set.
    UPSTREAM = m.If(test=m.Call(func=attr("is_draft_extend_v2")))


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


class ReplayMetadataWithoutMirror(MirrorReadGuards):
    DESCRIPTION = (
        f"{BACKEND} CUDA-graph replay metadata: seq_lens_cpu may be None; host max from the mirror "
        "or the static max_context_len"
    )
    CLASS = BACKEND
    METHOD = "init_forward_metadata_replay_cuda_graph"
    RENAMED = ("_apply_cuda_graph_metadata",)  # 0.5.13+
    GUARDS = REPLAY_GUARDS


#: ``normal_decode_set_metadata(cache_seqlens, cu_seqlens_k, page_table, req_to_token,
#: req_pool_indices, strided_indices, max_seq_pages, ...)`` (0.5.10 .. 0.5.14): the fused
#: Triton page-table writer of the decode and draft-decode replay.
PAGE_WRITER = "normal_decode_set_metadata"
PAGES_ARG, TABLE_ARG = 6, 2
#: A page count that cannot pass the table: ours, or upstream's static width
#: (0.5.15+ pass ``self.max_num_pages``, wherever the signature puts it).
BOUNDED_PAGES = call("pages_within") | attr("max_num_pages", m.Name("self"))


class ReplayPageTableFits(ClassCodemod):
    """Every call of the page-table writer in the class passes a bounded page
    count. Upstream later moved the calls (0.5.20: a ``_set_decode_page_metadata``
    helper) and changed the signature (0.5.19: no strided indices), always
    with ``self.max_num_pages``: any bounded argument makes a call done."""

    DESCRIPTION = (
        f"{BACKEND} CUDA-graph replay: the page count handed to {PAGE_WRITER} stays within the "
        "preallocated page table (pages_within)"
    )
    CLASS = BACKEND
    METHODS = ("init_forward_metadata_replay_cuda_graph", "_apply_cuda_graph_metadata")

    @staticmethod
    def _writes(node: cst.CSTNode) -> list[cst.Call]:
        return primitives.find_all(node, m.Call(func=m.Name(PAGE_WRITER)))

    @staticmethod
    def _bounded(write: cst.Call) -> bool:
        return any(m.matches(arg.value, BOUNDED_PAGES) for arg in write.args)

    @staticmethod
    def _fixable(write: cst.Call) -> bool:
        # The old signature, the page count a local name computed from the host max.
        return len(write.args) > PAGES_ARG and m.matches(write.args[PAGES_ARG], m.Arg(keyword=None, value=m.Name()))

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        anchor = f"{self.CLASS}.{self.METHODS[0]}"
        writes = self._writes(cls)
        if not writes:
            return Finding.missing(anchor, f"no {PAGE_WRITER}(...) call in the class")
        left = [w for w in writes if not self._bounded(w)]
        if not left:
            return Finding.done(anchor)
        if not all(self._fixable(w) for w in left):
            return Finding.missing(anchor, f"a {PAGE_WRITER}(...) call of an unknown signature")
        return Finding.todo(anchor, f"{len(left)} {PAGE_WRITER} call(s) with an unbounded page count")

    def transform_class(self, cls: cst.ClassDef) -> cst.ClassDef:
        def bound(node: cst.Call, _) -> cst.Call:
            if self._bounded(node) or not self._fixable(node):
                return node
            args = list(node.args)
            pages, table = args[PAGES_ARG], args[TABLE_ARG]
            value = primitives.parse_expression(f"pages_within({code_of(pages.value)}, {code_of(table.value)})")
            args[PAGES_ARG] = pages.with_changes(value=value)
            return node.with_changes(args=args)

        def edit(fn: cst.FunctionDef) -> cst.FunctionDef:
            return primitives.replace_expressions(fn, m.Call(func=m.Name(PAGE_WRITER)), bound)

        self.require_import(MIRROR_READS, "pages_within")
        for fn in list(primitives.methods(cls)):
            if any(not self._bounded(w) for w in self._writes(fn)):
                cls = primitives.replace_method(cls, fn.name.value, edit)
        return cls


# -- the verify tree mask -------------------------------------------------------------------


# The detection is the TRT-LLM MLA patch's (sglang #26824 gave TRT-LLM MLA the same
# cuda_graph_custom_mask; 0.5.17 replaced both with the verify_mask property): the
# classes below keep it and write FA3's own code, from patchkit.backends.fa3. Its
# transforms import TRT-LLM MLA helpers, so these go through ClassCodemod's.


class _TreeMaskPart:
    """Mixin: the FA3 transform, with FA3's helpers imported by the engine."""

    HELPER: ClassVar[str]

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        self.require_import(HELPERS, self.HELPER)
        return ClassCodemod.transform_module_impl(self, tree)


class InitTreeMask(mla.InitCustomMask):
    DESCRIPTION = f"{BACKEND}.__init__: self.{MASK} = None and self.is_draft_runner (draft-worker instances never verify)"
    CLASS = BACKEND
    #: The backend's name in the comment the transform writes.
    KIND: ClassVar[str] = "FA3"

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


class AllocTreeMask(_TreeMaskPart, mla.AllocCustomMask):
    DESCRIPTION = (
        f"{BACKEND}.init_cuda_graph_state preallocates self.{MASK} (bool, max_num_tokens * "
        f"(max_context_len + num_draft_tokens)) on the target backend only, and records the captured "
        f"max_bs (self.{mla.MAX_BS}) it fits"
    )
    CLASS = BACKEND
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


class VerifyBuffersReturnTreeMask(_TreeMaskPart, mla.VerifyBuffersReturnCustomMask):
    DESCRIPTION = f"{BACKEND}.{GET_BUFFERS} returns [self.{MASK}, None]"
    CLASS = BACKEND
    HELPER = "verify_buffers"

    def transform_class(self, cls: cst.ClassDef) -> cst.ClassDef:
        source = f'''
            def {GET_BUFFERS}(self):
                """[tree mask, positions] that build_tree_kernel_efficient fills after draft."""
                return verify_buffers(self.{MASK})
        '''
        after = primitives.find_first_method(cls, ("get_cuda_graph_seq_len_fill_value", "init_cuda_graph_state"))
        return primitives.add_method(cls, source, after=after.name.value if after else None)
