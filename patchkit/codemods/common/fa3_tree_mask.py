"""FA3's verify tree mask (FlashMLA's too), on top of TRT-LLM MLA's in
:mod:`patchkit.codemods.common.tree_mask`: ``InitTreeMask``, ``AllocTreeMask``,
``VerifyBuffersReturnTreeMask``, whose helpers come from ``patchkit.backends.fa3``.
Patch modules subclass them under their own names.

Kept apart from ``tree_mask`` so each stays under the house's 400 lines.
"""

from __future__ import annotations

from typing import ClassVar

import libcst as cst

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import ClassCodemod, Finding, State
from patchkit.codemods.common.tree_mask import (
    GET_BUFFERS,
    MASK,
    MASK_METHODS,
    AllocMask,
    InitMask,
    VerifyBuffersReturnMask,
)
from patchkit.layout import import_path


class _TreeMaskPart:
    """Mixin: FA3's tree mask (FlashMLA's too): the detection above, FA3's
    own code from ``patchkit.backends.fa3``, imported by the engine."""

    HELPERS: ClassVar[str] = import_path("backends.fa3")
    HELPER: ClassVar[str]

    TOP_LEVEL_ONLY: ClassVar[bool] = True  # its module hook (PatchCodemod.reads)

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        assert isinstance(self, ClassCodemod)  # a mixin of ClassCodemods
        self.require_import(self.HELPERS, self.HELPER)
        return ClassCodemod.transform_module_impl(self, tree)


class InitTreeMask(InitMask):
    """``__init__``: ``self.cuda_graph_custom_mask = None`` and
    ``self.is_draft_runner`` (draft-worker instances never verify)."""

    #: The backend's name in the comment the transform writes.
    KIND: ClassVar[str]
    METHODS_READ = MASK_METHODS

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        finding = super().detect_in_class(cls)
        init = primitives.find_method(cls, "__init__")
        if finding.state is State.TODO and "model_runner" not in {
            p.name.value for p in cst.ensure_type(init, cst.FunctionDef).params.params
        }:
            return Finding.missing(finding.anchor, "no model_runner parameter to tell a draft-worker instance by").at(
                finding.line
            )
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

    @property
    def SIZE_KEYWORDS(self) -> tuple[str, ...]:  # type: ignore[override]  # noqa: N802 (AllocMask's class attribute; mypy refuses a read-only override, nothing writes it)
        return (
            "max_num_tokens=max_num_tokens",
            "max_context_len=self.max_context_len",
            f"num_draft_tokens={self.NUM_DRAFT_TOKENS}",
            "skip_prefill=self.skip_prefill",
            "is_draft_runner=self.is_draft_runner",
            "device=self.device",
        )

    def insert_mask(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        # At the end: FA3's init_cuda_graph_state does not hand over to a parent.
        return primitives.insert_at_end(fn, self.mask_source())


class VerifyBuffersReturnTreeMask(_TreeMaskPart, VerifyBuffersReturnMask):
    """``get_verify_buffers_to_fill_after_draft`` returns the mask (``verify_buffers``)."""

    HELPER = "verify_buffers"
    METHODS_READ = MASK_METHODS

    def transform_class(self, cls: cst.ClassDef) -> cst.ClassDef:
        source = f'''
            def {GET_BUFFERS}(self):
                """[tree mask, positions] that build_tree_kernel_efficient fills after draft."""
                return verify_buffers(self.{MASK})
        '''
        after = primitives.find_first_method(cls, ("get_cuda_graph_seq_len_fill_value", "init_cuda_graph_state"))
        return primitives.add_method(cls, source, after=after.name.value if after else None)
