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

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import ClassCodemod, Finding
from patchkit.codemods.common.shared import FLAG
from patchkit.codemods.common.tree_mask import GET_BUFFERS, MASK, MAX_BS, AllocMask, InitMask, VerifyBuffersReturnMask
from patchkit.layout import import_path

BACKEND = "TRTLLMMLABackend"
DRAFT_BACKEND = "TRTLLMMLAMultiStepDraftBackend"
HELPERS = import_path("backends.trtllm_mla")


class _OptOutFlag(ClassCodemod):
    """``needs_cpu_seq_lens: bool = False`` as a class attribute.

    Not ``common.OptOutFlag``: this one says where a tree's own value is,
    ignores ``__init__`` assignments and writes its comment (WHY carries the
    ``# ``) after a blank line wherever the attribute lands; merging them
    would change what this patch reports and writes."""

    WHY: ClassVar[str] = ""

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        anchor = f"{self.CLASS}.{FLAG}"
        found = primitives.find_class_attribute(cls, FLAG)
        if found is None:
            return Finding.todo(anchor, "class attribute not declared (inherits True / treated as True)")
        if found.value is None:
            return self.located(Finding.missing(anchor, f"{self.where(found)}: this tree declares {FLAG} without a value; refusing to override it"), found)
        if m.matches(found.value, m.Name("False")):
            return Finding.done(anchor)
        value = cst.Module([]).code_for_node(found.value)
        return self.located(Finding.missing(anchor, f"{self.where(found)}: this tree declares {FLAG} = {value}; refusing to override it (the patch needs False)"), found)

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


# -- the verify tree mask (common's, with TRT-LLM MLA's helpers) -----------------------------


class InitCustomMask(InitMask):
    DESCRIPTION = f"{BACKEND}.__init__ sets self.{MASK} = None"
    CLASS = BACKEND


class AllocCustomMask(AllocMask):
    __doc__ = AllocMask.__doc__
    DESCRIPTION = (
        f"{BACKEND}.init_cuda_graph_state preallocates self.{MASK} (bool, max_num_tokens * "
        "(max_context_len + num_draft_tokens)) when draft tokens are configured and prefill is not skipped, "
        f"and records the captured max_bs (self.{MAX_BS}) it fits"
    )
    CLASS = BACKEND
    HELPERS = HELPERS
    ALLOC_HELPER = "alloc_cuda_graph_custom_mask"


class VerifyBuffersReturnCustomMask(VerifyBuffersReturnMask):
    DESCRIPTION = f"{BACKEND}.{GET_BUFFERS} returns [self.{MASK}, None]"
    CLASS = BACKEND
    HELPERS = HELPERS
    BUFFERS_HELPER = "verify_buffers_to_fill_after_draft"
