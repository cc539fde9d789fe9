"""sglang #26128, part 1: the per-backend ``needs_cpu_seq_lens`` flag.

``AttentionBackend`` declares ``needs_cpu_seq_lens: bool = True`` (every backend
keeps the CPU mirror of seq_lens unless it says otherwise). The Triton backend
and its multi-step draft wrapper opt out: their CUDA-graph replay rebuilds
metadata from device buffers and never reads ``seq_lens_cpu`` /
``seq_lens_sum``. ``TritonMultiStepDraftBackend`` is a plain class (not an
``AttentionBackend``), so it needs its own attribute.

Upstream (0.5.13+) has the same attribute in the same classes, so the detector
is one for both: the class attribute exists.
"""

from __future__ import annotations

from patchkit.codemods.common.shared import FLAG, ClassFlag

REPLAY_COMMENT = (
    "CUDA-graph replay rebuilds metadata from preallocated kv_indptr/kv_indices\n"
    "buffers; it never reads seq_lens_cpu / seq_lens_sum."
)


class _DeclareFlag(ClassFlag):
    """A declaration the tree already has is its own choice: done."""

    KEEPS_TREE_VALUE = True


class BaseBackendFlag(_DeclareFlag):
    DESCRIPTION = f"AttentionBackend.{FLAG}: bool = True (default: keep the CPU seq_lens mirror)"
    CLASS = "AttentionBackend"
    VALUE = True
    WHY = "Opt out only when this backend never reads seq_lens_cpu / seq_lens_sum."


class TritonBackendOptsOut(_DeclareFlag):
    DESCRIPTION = f"TritonAttnBackend.{FLAG} = False (replay never reads seq_lens_cpu / seq_lens_sum)"
    CLASS = "TritonAttnBackend"
    VALUE = False
    WHY = REPLAY_COMMENT


class TritonMultiStepDraftOptsOut(_DeclareFlag):
    DESCRIPTION = f"TritonMultiStepDraftBackend.{FLAG} = False (a plain class: needs its own flag)"
    CLASS = "TritonMultiStepDraftBackend"
    VALUE = False
    WHY = REPLAY_COMMENT
