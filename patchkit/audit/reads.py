"""What the audit reports about one read of the CPU seq_lens mirror (:class:`Read`),
and the two tables a read's verdict looks up: the backends that opt out with a
patch of their own, and the functions that only run where the mirror exists.

Kept apart from :mod:`patchkit.audit.syntax` (which walks a module's ast and
decides each verdict): the checks and the tree-wide audit need the record and
the tables without the walker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

PATCH = "needs-cpu-seq-lens"

# Backends that opt out with a patch of their own (the patch a "patched" read
# of their module names).
OPTS_OUT_WITH = {
    "srt/layers/attention/flashmla_backend.py": "flashmla-spec-v2",
    "srt/layers/attention/flashattention_backend.py": "fa3-spec-v2",
    "srt/layers/attention/trtllm_mha_backend.py": "trtllm-mha-spec-v2",
    "srt/layers/attention/trtllm_mla_backend.py": "trtllm-mla-spec-v2",
}

# Functions whose reads only run where the mirror always exists.
MIRROR_ALWAYS = {
    "ScheduleBatch.prepare_for_decode": "after `if not self.spec_algorithm.is_none(): return` (spec v2 decodes in "
    "EagleDraftInputV2Mixin.prepare_for_decode)",
    "ForwardBatch._compute_mrope_positions": "mrope models only; configure_needs_cpu_seq_lens keeps the mirror for them",
    "ForwardBatch.post_forward_mlp_sync_batch": "non-spec extend branch only (spec_info is None)",
    "CudaGraphRunner.capture_one_batch_size": "capture builds its own ForwardBatch with a mirror",
    "EAGLEDraftCudaGraphRunner.capture_one_batch_size": "capture builds its own ForwardBatch with a mirror",
    "EAGLEDraftExtendCudaGraphRunner.capture_one_batch_size": "capture builds its own ForwardBatch with a mirror",
    "TpModelWorker.forward_batch_split_prefill": "PD-multiplexing split prefill: never speculative",
    # 0.5.4 .. 0.5.9 (forward_batch_deepseek_mha_mixin.py from 0.5.10, outside MODULES)
    "ForwardBatch.fetch_mha_one_shot_kv_indices": "DeepSeek MHA_ONE_SHOT prefill: dispatched only under "
    "forward_mode.is_extend_without_speculative()",
    # DeepSeek sparse attention (patch dsa-no-mirror), both class names:
    **{
        f"{cls}.{fn}": why
        for cls in ("NativeSparseAttnBackend", "DeepseekSparseAttnBackend")
        for fn, why in (
            ("set_nsa_prefill_impl", "reads under is_extend_without_speculative() / == EXTEND: prefill batches only"),
            ("set_dsa_prefill_impl", "reads under is_extend_without_speculative() / == EXTEND: prefill batches only"),
            ("_cal_indexer_k_start_end", "returns early unless forward_mode.is_extend_without_speculative()"),
        )
    },
}

# Keyword arguments that hand a mirror value on, read where they are used:
# NSA / DSA metadata's indexer_seq_lens_cpu (read by the indexer's ragged,
# prefill-only top-k).
HANDED_ON = ("indexer_seq_lens_cpu",)


@dataclass
class Read:
    file: str  # relative to the sglang package folder
    line: int
    column: int
    function: str  # Class.method, or the module-level function
    code: str
    value: str  # seq_lens_cpu or seq_lens_sum
    kind: str  # "mirror" (a batch's) or "buffer" (a CUDA-graph runner's CPU buffer)
    verdict: str = ""
    why: str = ""
    patch: Optional[str] = None  # the patch that handles it (verdict "patched")
    cls: Optional[str] = None  # the innermost class holding it
    origin: Optional[str] = None  # "release" / "vendor" (set by audit.py), None: no release to compare
