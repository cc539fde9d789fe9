"""sglang #26824: TRT-LLM MLA opts out of the spec-v2 seq_lens D2H sync.

trtllm-gen kernels rebuild their metadata from preallocated buffers and never
read ``seq_lens_cpu`` / ``seq_lens_sum``, so both TRT-LLM MLA classes declare
``needs_cpu_seq_lens = False`` (the flag the needs-cpu-seq-lens patch adds).
The one host value the verify step still needed is ``seq_lens_sum`` to size
the FULL_MASK tree mask; instead the target backend preallocates a worst-case
``cuda_graph_custom_mask`` in ``init_cuda_graph_state`` and hands it to
``build_tree`` through ``get_verify_buffers_to_fill_after_draft``, which fills
it in place.

The allocation and the buffer list are in ``patchkit.backends.trtllm_mla``;
the patched methods call it.

Releases: the TRT-LLM MLA classes are the same in 0.5.10 .. 0.5.12.post1 at
every edit site. 0.5.13 has the change natively. 0.5.17 replaced
``cuda_graph_custom_mask`` with a ``verify_mask`` property (built by
``maybe_create_verify_mask``): there the mask parts are superseded and only the
flags are checked.
"""

from __future__ import annotations

from typing import ClassVar

import libcst as cst
import libcst.matchers as m

from patchkit.codemods import primitives
from patchkit.codemods.base import ClassCodemod, Finding, MethodCodemod
from patchkit.vendoring import import_path

BACKEND = "TRTLLMMLABackend"
DRAFT_BACKEND = "TRTLLMMLAMultiStepDraftBackend"
FLAG = "needs_cpu_seq_lens"
MASK = "cuda_graph_custom_mask"
GET_BUFFERS = "get_verify_buffers_to_fill_after_draft"
HELPERS = import_path("backends.trtllm_mla")
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


def _import_helper(module: cst.Module, name: str) -> cst.Module:
    # After the module's last top-level import: libcst's AddImportsVisitor would
    # put it right under `from __future__`, above the docstring-like string these
    # files have there.
    return primitives.add_import_sorted(module, HELPERS, name)


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


class _OptOutFlag(ClassCodemod):
    """``needs_cpu_seq_lens: bool = False`` as a class attribute."""

    WHY: ClassVar[str] = ""

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        anchor = f"{self.CLASS}.{FLAG}"
        found = primitives.find_class_attribute(cls, FLAG)
        if found is None:
            return Finding.todo(anchor, "class attribute not declared (inherits True / treated as True)")
        if found.value is None:
            return Finding.missing(anchor, f"{self.where(found)}: this tree declares {FLAG} without a value; refusing to override it")
        if m.matches(found.value, m.Name("False")):
            return Finding.done(anchor)
        value = cst.Module([]).code_for_node(found.value)
        return Finding.missing(anchor, f"{self.where(found)}: this tree declares {FLAG} = {value}; refusing to override it (the patch needs False)")

    def transform_class(self, cls: cst.ClassDef) -> cst.ClassDef:
        cls = primitives.add_class_attribute(cls, f"{FLAG}: bool = False")
        # Upstream's comment above it, and a blank line after the docstring.
        body = list(primitives.class_body(cls))
        declares_flag = m.SimpleStatementLine(body=[m.AnnAssign(target=m.Name(FLAG))])
        index = next(i for i, stmt in enumerate(body) if m.matches(stmt, declares_flag))
        lines = [cst.EmptyLine(indent=False)] if index > 0 else []
        lines += [cst.EmptyLine(comment=cst.Comment(c)) for c in self.WHY.splitlines()]
        body[index] = body[index].with_changes(leading_lines=lines)
        return cls.with_changes(body=cls.body.with_changes(body=body))


class BackendOptsOutOfCpuSeqLens(_OptOutFlag):
    DESCRIPTION = f"{BACKEND}.{FLAG} = False: trtllm-gen kernels never read seq_lens_cpu / seq_lens_sum"
    CLASS = BACKEND
    WHY = (
        "# trtllm-gen kernels rebuild metadata from preallocated buffers and never\n"
        "# read seq_lens_cpu / seq_lens_sum; opt out of the D2H sync."
    )


class DraftBackendOptsOutOfCpuSeqLens(_OptOutFlag):
    DESCRIPTION = f"{DRAFT_BACKEND}.{FLAG} = False: per-step draft decode never reads seq_lens_cpu / seq_lens_sum"
    CLASS = DRAFT_BACKEND
    WHY = (
        "# Per-step draft decode never reads seq_lens_cpu / seq_lens_sum; opt out so\n"
        "# decide_needs_cpu_seq_lens' OR over the backends stays False."
    )


class _MaskMethod(MethodCodemod):
    """A method of the target backend that gets a part of the custom mask;
    superseded where upstream replaced the mask (:func:`_mask_superseded`)."""

    CLASS = BACKEND

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


class InitCustomMask(_MaskMethod):
    DESCRIPTION = f"{BACKEND}.__init__ sets self.{MASK} = None"
    METHOD = "__init__"

    def detect_todo(self, fn: cst.FunctionDef) -> Finding:
        return Finding.todo(self.anchor, f"self.{MASK} not initialised")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        return primitives.insert_at_end(fn, f"self.{MASK} = None")


class AllocCustomMask(_MaskMethod):
    """The worst-case mask for the captured ``max_bs``, and that ``max_bs``
    recorded beside it: the spec worker hands the mask over only to batches
    it fits (``backends.verify_tree_mask``; see verify_tree_mask_fits).

    A tree patched by an earlier patchkit allocates the mask (our helper
    call) without recording the bound: TODO, and the transform adds only the
    record, so the upgrade reads exactly as a fresh apply. Upstream's own
    allocation (0.5.13 .. 0.5.16, no bound: its hook is upstream's contract)
    and a fork's are left as they are."""

    DESCRIPTION = (
        f"{BACKEND}.init_cuda_graph_state preallocates self.{MASK} (bool, max_num_tokens * "
        "(max_context_len + num_draft_tokens)) when draft tokens are configured and prefill is not skipped, "
        f"and records the captured max_bs (self.{MAX_BS}) it fits"
    )
    METHOD = "init_cuda_graph_state"
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
        return _import_helper(super().transform_module_impl(tree), "alloc_cuda_graph_custom_mask")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        if not _assigns_mask(fn):
            fn = self.insert_mask(fn)
        return record_max_bs(fn)

    def insert_mask(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        source = f"""
            # Worst-case FULL_MASK tree mask (bool) for verify; build_tree fills it
            # in place, so the GPU-only spec-v2 path needs no seq_lens_sum.
            self.{MASK} = alloc_cuda_graph_custom_mask(
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


class VerifyBuffersReturnCustomMask(ClassCodemod):
    DESCRIPTION = f"{BACKEND}.{GET_BUFFERS} returns [self.{MASK}, None]"
    CLASS = BACKEND

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
        return _import_helper(super().transform_module_impl(tree), "verify_buffers_to_fill_after_draft")

    def transform_class(self, cls: cst.ClassDef) -> cst.ClassDef:
        source = f'''
            def {GET_BUFFERS}(self):
                """[tree mask, positions] buffers that build_tree fills after draft."""
                return verify_buffers_to_fill_after_draft(self.{MASK})
        '''
        after = "init_cuda_graph_state" if primitives.find_method(cls, "init_cuda_graph_state") else None
        return primitives.add_method(cls, source, after=after)
