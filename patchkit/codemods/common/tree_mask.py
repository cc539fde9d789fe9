"""The verify tree mask (``cuda_graph_custom_mask``) the FA3, FlashMLA and TRT-LLM MLA
codemods share: TRT-LLM MLA's (``InitMask``, ``AllocMask``, ``VerifyBuffersReturnMask``)
here and, on top of them, FA3's and FlashMLA's (``InitTreeMask``, ``AllocTreeMask``,
``VerifyBuffersReturnTreeMask``) in ``common.fa3_tree_mask``. Patch modules subclass
them under their own names."""

from __future__ import annotations

from typing import ClassVar

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import ClassCodemod, Finding, MethodCodemod, State

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
#: Where the backend records whether its verify reads the mask
#: (backends.verify_tree_mask.IS_READ_ATTR; the spec worker reads it).
IS_READ = "verify_tree_mask_is_read"
#: The helper keyword that sizes an unread mask compact (sglang #32920).
READS_KEYWORD = "reads_mask"
DRAFT_RUNNER = "is_draft_runner"
ASSIGNS_DRAFT_RUNNER = m.Assign(
    targets=[m.AssignTarget(target=m.Attribute(value=m.Name("self"), attr=m.Name(DRAFT_RUNNER)))]
)

SUPERSEDED_WHY = f"upstream replaced {MASK} with the verify_mask property (sglang 0.5.17+)"
#: What the mask's codemods read (theirs, upstream's later shape's, those a new one goes after).
MASK_METHODS = ("__init__", "init_cuda_graph_state", "verify_mask", GET_BUFFERS, "get_cuda_graph_seq_len_fill_value")


def _assigns_mask(fn: cst.FunctionDef | None) -> bool:
    return fn is not None and primitives.contains(fn, ASSIGNS_MASK)


def record_max_bs(fn: cst.FunctionDef) -> cst.FunctionDef:
    """``self.verify_tree_mask_max_bs = max_bs`` right after the statement that allocates
    the mask (a fresh apply and an upgrade of a tree patched before read the same)."""
    source = f"""
        # The mask holds max_bs requests: the spec worker hands it to
        # build_tree_kernel_efficient only for a batch it fits, so an eager
        # batch above the captured size never writes past its end.
        self.{MAX_BS} = max_bs
    """
    index, body = primitives.find_statement_index(fn, ASSIGNS_MASK), primitives.block_statements(fn.body)
    assert index is not None  # detect found it
    body[index + 1 : index + 1] = primitives.parse_statements_with_comments(source)
    return fn.with_changes(body=fn.body.with_changes(body=body))


def _mask_superseded(cls: cst.ClassDef) -> bool:
    """Upstream's later shape: a ``verify_mask`` accessor and no custom mask."""
    return primitives.find_method(cls, "verify_mask") is not None and not any(
        _assigns_mask(primitives.find_method(cls, name)) for name in ("__init__", "init_cuda_graph_state")
    )


class _MaskMethod(MethodCodemod):
    """A method of the target backend that gets a part of the custom mask;
    superseded where upstream replaced the mask (:func:`_mask_superseded`)."""

    METHODS_READ = MASK_METHODS

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


class InitMaskAndDraftRunner(InitMask):
    """``__init__`` also sets ``self.is_draft_runner`` (sglang #31527): the
    draft worker's instances of the backend (its draft-extend backend is
    built with prefill on) never verify, so ``AllocMask`` allocates no mask
    there. A tree patched by an earlier patchkit (the mask initialised, the
    allocation ours, no ``is_draft_runner``) is TODO and gets only the
    record, as a fresh apply writes it; upstream's own ``__init__`` (its own
    allocation, 0.5.13 .. 0.5.15) is left alone."""

    #: The helper whose call marks patchkit's own allocation.
    ALLOC_HELPER: ClassVar[str]
    METHODS_READ = MASK_METHODS

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        alloc = primitives.find_method(cls, "init_cuda_graph_state")
        self._ours = alloc is not None and primitives.contains(alloc, m.Call(func=m.Name(self.ALLOC_HELPER)))
        finding = super().detect_in_class(cls)
        init = primitives.find_method(cls, "__init__")
        if finding.state is State.TODO and "model_runner" not in {
            p.name.value for p in cst.ensure_type(init, cst.FunctionDef).params.params
        }:
            return Finding.missing(finding.anchor, "no model_runner parameter to tell a draft-worker instance by").at(
                finding.line
            )
        return finding

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        if _assigns_mask(fn) and self._ours and not primitives.contains(fn, ASSIGNS_DRAFT_RUNNER):
            return Finding.todo(
                self.anchor, f"self.{DRAFT_RUNNER} not set (the draft worker's instances allocate a mask)"
            )
        return super().detect_in_method(fn)

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        if not _assigns_mask(fn):
            fn = super().transform_method(fn)
        if primitives.contains(fn, ASSIGNS_DRAFT_RUNNER):
            return fn
        source = f"""
            # The draft worker's instances never verify: no tree mask there (sglang #31527).
            self.{DRAFT_RUNNER} = getattr(model_runner, "is_draft_worker", False)
        """
        index, body = primitives.find_statement_index(fn, ASSIGNS_MASK), primitives.block_statements(fn.body)
        assert index is not None  # detect found it
        body[index + 1 : index + 1] = primitives.parse_statements_with_comments(source)
        return fn.with_changes(body=fn.body.with_changes(body=body))


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

    #: Whether this backend's verify reads the mask (an expression on self):
    #: unread, the mask is the compact QLEN_ONLY layout (sglang #32886, #32920).
    READS_MASK: ClassVar[str]
    #: Why (the comment above the record).
    READS_MASK_WHY: ClassVar[str]
    #: Keywords the helper call passes beyond the sizes (``name=expression``).
    GATE_KEYWORDS: ClassVar[tuple[str, ...]] = ()

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        lacking = self._lacking(fn) if _assigns_mask(fn) and self._ours(fn) else []
        if lacking:
            return self._needs_max_bs(fn) or Finding.todo(
                self.anchor, f"self.{MASK} allocated by an earlier patchkit: " + "; ".join(lacking)
            )
        return super().detect_in_method(fn)

    def _lacking(self, fn: cst.FunctionDef) -> list[str]:
        """What an earlier patchkit's allocation lacks that this one writes."""
        lacking = []
        if not primitives.contains(fn, ASSIGNS_MAX_BS):
            lacking.append("no max_bs recorded (an eager batch above it would get the mask and write past its end)")
        return lacking + self._outdated_call(fn)

    def _outdated_call(self, fn: cst.FunctionDef) -> list[str]:
        """What an earlier patchkit's helper call lacks (its statement is replaced)."""
        lacking = []
        keywords = {arg.keyword.value for arg in self._alloc_call(fn).args if arg.keyword is not None}
        if READS_KEYWORD not in keywords:
            lacking.append(
                "the context-wide FULL_MASK layout whether verify reads it or not "
                "(build_tree fills all of it every verify step)"
            )
        missing_gates = [kw.split("=")[0] for kw in self.GATE_KEYWORDS if kw.split("=")[0] not in keywords]
        if missing_gates:
            lacking.append(f"no {', '.join(missing_gates)} check (a draft-side instance allocates one it never uses)")
        return lacking

    def _alloc_pattern(self) -> m.Assign:
        return m.Assign(targets=[m.AssignTarget(target=SELF_MASK)], value=m.Call(func=m.Name(self.ALLOC_HELPER)))

    def _ours(self, fn: cst.FunctionDef) -> bool:
        return primitives.contains(fn, self._alloc_pattern())

    def _alloc_call(self, fn: cst.FunctionDef) -> cst.Call:
        return cst.ensure_type(primitives.find_all_of(cst.Assign, fn, self._alloc_pattern())[0].value, cst.Call)

    def _needs_max_bs(self, fn: cst.FunctionDef):
        params = [p.name.value for p in fn.params.params]
        if "max_bs" not in params:
            return self.missing_in(
                fn, f"parameters ({', '.join(params)})", "a max_bs parameter to record the mask's bound"
            )
        return None

    def detect_todo(self, fn: cst.FunctionDef) -> Finding:
        params = [p.name.value for p in fn.params.params]
        if "max_num_tokens" not in params:
            return self.missing_in(
                fn, f"parameters ({', '.join(params)})", "a max_num_tokens parameter to size the mask with"
            )
        return self._needs_max_bs(fn) or Finding.todo(self.anchor, f"self.{MASK} not allocated")

    TOP_LEVEL_ONLY: ClassVar[bool] = True  # its module hook (PatchCodemod.reads)

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        self.require_import(self.HELPERS, self.ALLOC_HELPER, among_siblings=True)
        return super().transform_module_impl(tree)

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        if not _assigns_mask(fn):
            fn = self.insert_mask(fn)
        elif self._ours(fn) and self._outdated_call(fn):
            fn = self.replace_mask(fn)
        if not primitives.contains(fn, ASSIGNS_MAX_BS):
            fn = record_max_bs(fn)
        return fn

    #: The sizes the helper call passes (``name=expression``), in order.
    SIZE_KEYWORDS: ClassVar[tuple[str, ...]] = (
        "max_num_tokens=max_num_tokens",
        "max_context_len=self.max_context_len",
        "num_draft_tokens=self.num_draft_tokens",
        "skip_prefill=self.skip_prefill",
        "device=self.device",
    )

    def mask_source(self) -> str:
        """The record of whether verify reads the mask, then the allocation:
        what a fresh apply writes and what an upgrade puts in place of an
        earlier patchkit's allocation (so the two read the same)."""
        keywords = (*self.SIZE_KEYWORDS, *self.GATE_KEYWORDS, f"{READS_KEYWORD}=self.{IS_READ}")
        args = "".join(f"\n    {kw}," for kw in keywords)
        why = "".join(f"# {line}\n" for line in self.READS_MASK_WHY.splitlines())
        return (
            f"{why}self.{IS_READ} = {self.READS_MASK}\n"
            "# Verify tree mask (bool) that build_tree_kernel_efficient fills in place, so\n"
            "# the GPU-only spec-v2 path needs no seq_lens_sum: FULL_MASK where verify\n"
            "# reads it, else the compact QLEN_ONLY layout (no context-wide fill a step).\n"
            f"self.{MASK} = {self.ALLOC_HELPER}({args}\n)\n"
        )

    def insert_mask(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        # Before handing over to the parent, as upstream; else at the end.
        if primitives.find_statement_index(fn, PARENT_CUDA_GRAPH_STATE) is not None:
            return primitives.insert_before(fn, PARENT_CUDA_GRAPH_STATE, self.mask_source())
        return primitives.insert_at_end(fn, self.mask_source())

    def replace_mask(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        """An earlier patchkit's allocation -> :meth:`mask_source`; the blank
        lines above it stay (where a fresh apply puts the anchor's)."""
        index, body = primitives.find_statement_index(fn, self._alloc_pattern()), primitives.block_statements(fn.body)
        assert index is not None  # _ours found it
        lines = list(body[index].leading_lines)
        first_comment = next((k for k, line in enumerate(lines) if line.comment is not None), len(lines))
        new = primitives.parse_statements_with_comments(self.mask_source())
        new[0] = new[0].with_changes(leading_lines=[*lines[:first_comment], *new[0].leading_lines])
        body[index : index + 1] = new
        return fn.with_changes(body=fn.body.with_changes(body=body))


class VerifyBuffersReturnMask(ClassCodemod):
    """``get_verify_buffers_to_fill_after_draft`` returns the mask, through
    ``BUFFERS_HELPER`` from ``HELPERS`` (imported after the module's last
    top-level import)."""

    HELPERS: ClassVar[str]
    BUFFERS_HELPER: ClassVar[str] = "verify_buffers_to_fill_after_draft"
    METHODS_READ = MASK_METHODS

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        anchor = f"{self.CLASS}.{GET_BUFFERS}"
        fn = primitives.find_method(cls, GET_BUFFERS)
        if fn is not None:
            if primitives.contains(fn, SELF_MASK):
                return Finding.done(anchor)
            return self.located(
                Finding.missing(
                    anchor,
                    f"{self.where(fn)}: this tree overrides it without self.{MASK}; refusing to replace it "
                    "(the patch needs it to return the mask)",
                ),
                fn,
            )
        if _mask_superseded(cls):
            return Finding.superseded(anchor, SUPERSEDED_WHY)
        return Finding.todo(anchor, "not overridden (the base returns [None, None])")

    TOP_LEVEL_ONLY: ClassVar[bool] = True  # its module hook (PatchCodemod.reads)

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        self.require_import(self.HELPERS, self.BUFFERS_HELPER, among_siblings=True)
        return super().transform_module_impl(tree)

    def transform_class(self, cls: cst.ClassDef) -> cst.ClassDef:
        source = f'''
            def {GET_BUFFERS}(self):
                """[tree mask, positions] buffers that build_tree fills after draft."""
                return {self.BUFFERS_HELPER}(self.{MASK})
        '''
        after = "init_cuda_graph_state" if primitives.find_method(cls, "init_cuda_graph_state") else None
        return primitives.add_method(cls, source, after=after)
