"""sglang #26241: the TRT-LLM MLA multi-step draft backend skips common_template.

``FlashInferMLAMultiStepDraftBackend.init_forward_metadata`` and
``init_forward_metadata_replay_cuda_graph`` go through ``common_template``,
which launches the ``generate_draft_decode_kv_indices`` Triton kernel and
slices ``spec_info.kv_indptr`` / ``kv_indices`` for every step. The TRT-LLM MLA
step backends never read those: their decode path builds its own block
kv-indices from ``req_pool_indices`` and ``seq_lens``. So
``TRTLLMMLAMultiStepDraftBackend`` overrides both to call each step's backend
directly (steps ``0 .. speculative_num_steps - 2``); replay passes DECODE mode,
``seq_lens_sum=None`` and ``encoder_lens=None``.

The bodies are inline, as upstream: a loop over the step backends, no logic to
ship. Capture (``init_forward_metadata_capture_cuda_graph``) keeps the parent's
path, as upstream.

Releases: 0.5.10 .. 0.5.12.post1 have neither override and the same step
replay signature ``(bs, req_pool_indices, seq_lens, seq_lens_sum,
encoder_lens, forward_mode, spec_info, seq_lens_cpu)``. 0.5.13+ has
``init_forward_metadata`` natively and renamed the replay hook to
``init_forward_metadata_out_graph`` (which it overrides the same way).
"""

from __future__ import annotations

from typing import ClassVar

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import Finding, MethodCodemod

DRAFT_BACKEND = "TRTLLMMLAMultiStepDraftBackend"
STEP_BACKEND = "TRTLLMMLABackend"
INIT = "init_forward_metadata"
REPLAY = "init_forward_metadata_replay_cuda_graph"
REPLAY_RENAMED = "init_forward_metadata_out_graph"  # 0.5.13+
FORWARD_BATCH_INFO = "sglang.srt.model_executor.forward_batch_info"

COMMON_TEMPLATE = m.Attribute(value=m.Name("self"), attr=m.Name("common_template"))
STEP_BACKENDS = m.Attribute(value=m.Name("self"), attr=m.Name("attn_backends"))


INIT_SOURCE = f"""
def {INIT}(self, forward_batch: ForwardBatch):
    # Skip common_template: each TRT-LLM MLA step backend builds its own
    # block kv-indices from req_pool_indices / seq_lens, so the parent's
    # generate_draft_decode_kv_indices kernel and kv_indptr slicing are
    # unused.
    for i in range(self.speculative_num_steps - 1):
        self.attn_backends[i].{INIT}(forward_batch)
"""

REPLAY_SOURCE = f"""
def {REPLAY}(
    self, forward_batch: ForwardBatch, bs: int
):
    # Skip common_template (see {INIT}). seq_lens_sum=None: the
    # step backends need no host-side mirror of the sequence lengths.
    for i in range(self.speculative_num_steps - 1):
        self.attn_backends[i].{REPLAY}(
            bs,
            forward_batch.req_pool_indices,
            forward_batch.seq_lens,
            seq_lens_sum=None,
            encoder_lens=None,
            forward_mode=ForwardMode.DECODE,
            spec_info=forward_batch.spec_info,
            seq_lens_cpu=forward_batch.seq_lens_cpu,
        )
"""


def _direct_override(fn: cst.FunctionDef, name: str, allow_super: bool = False) -> bool:
    """Does this override call the step backends itself, never the template
    (directly or through the parent's method)?"""
    return (
        primitives.contains(fn, STEP_BACKENDS)
        and not primitives.contains(fn, COMMON_TEMPLATE)
        and (allow_super or not primitives.contains(fn, primitives.super_call(name)))
    )


class _DirectOverride(MethodCodemod):
    """The draft backend's own METHOD, calling each step backend directly;
    where the class inherits it, the transform adds it (SOURCE)."""

    CLASS = DRAFT_BACKEND
    REQUIRED_TEXT = (DRAFT_BACKEND,)
    SOURCE: str
    METHODS_READ = ("__init__", INIT)  # place_after

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        if _direct_override(fn, self.METHOD):
            return Finding.done(self.anchor)
        return Finding.missing(
            self.anchor,
            f"{self.where(fn)}: this tree overrides it through common_template/super(); refusing to replace it "
            "(the patch needs each step backend called directly)",
        )

    def detect_absent(self, cls: cst.ClassDef) -> Finding:
        return Finding.todo(self.anchor, "inherited from FlashInferMLAMultiStepDraftBackend (runs common_template)")

    TOP_LEVEL_ONLY: ClassVar[bool] = True  # its module hooks (PatchCodemod.reads)

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        # No-ops where the module already imports them (every release does).
        self.require_import(FORWARD_BATCH_INFO, "ForwardBatch", among_siblings=True)
        self.require_import(FORWARD_BATCH_INFO, "ForwardMode", among_siblings=True)
        return super().transform_module_impl(tree)

    def transform_class(self, cls: cst.ClassDef) -> cst.ClassDef:
        after = self.place_after(cls)
        return primitives.add_method(cls, self.SOURCE, after=after)

    def place_after(self, cls: cst.ClassDef) -> str | None:
        return "__init__" if primitives.find_method(cls, "__init__") else None


class DraftInitMetadataSkipsTemplate(_DirectOverride):
    DESCRIPTION = f"{DRAFT_BACKEND}.{INIT} calls each step backend directly (no common_template)"
    METHOD = INIT
    SOURCE = INIT_SOURCE


class DraftReplaySkipsTemplate(_DirectOverride):
    DESCRIPTION = (
        f"{DRAFT_BACKEND}.{REPLAY} calls each step backend's replay directly with DECODE mode "
        "and seq_lens_sum=None (no common_template)"
    )
    METHOD = REPLAY
    SOURCE = REPLAY_SOURCE
    METHODS_READ = (REPLAY_RENAMED, INIT)  # detect_absent, place_after

    def detect_absent(self, cls: cst.ClassDef) -> Finding:
        renamed = primitives.find_method(cls, REPLAY_RENAMED)
        if renamed is not None:
            # 0.5.13+: the replay hook is init_forward_metadata_out_graph and
            # upstream overrides it per step backend (no common_template); only
            # its capture branch hands over to the parent.
            if _direct_override(renamed, REPLAY_RENAMED, allow_super=True):
                return Finding.done(f"{self.CLASS}.{REPLAY_RENAMED}")
            return self.located(
                Finding.missing(
                    f"{self.CLASS}.{REPLAY_RENAMED}",
                    f"{self.where(renamed)}: renamed replay hook goes through common_template/super() "
                    "(the patch needs each step backend called directly)",
                ),
                renamed,
            )
        return super().detect_absent(cls)

    def place_after(self, cls: cst.ClassDef) -> str | None:
        if primitives.find_method(cls, INIT) is not None:
            return INIT
        return super().place_after(cls)
