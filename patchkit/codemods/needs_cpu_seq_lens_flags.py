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

from typing import ClassVar

import libcst as cst

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import ClassCodemod, Finding

FLAG = "needs_cpu_seq_lens"
REPLAY_COMMENT = (
    "CUDA-graph replay rebuilds metadata from preallocated kv_indptr/kv_indices\n"
    "buffers; it never reads seq_lens_cpu / seq_lens_sum."
)


class _DeclareFlag(ClassCodemod):
    VALUE: ClassVar[bool]
    COMMENT: ClassVar[str]

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        anchor = f"{self.CLASS}.{FLAG}"
        if primitives.find_class_attribute(cls, FLAG) is not None:
            return Finding.done(anchor)
        return Finding.todo(anchor, "class attribute not declared")

    def transform_class(self, cls: cst.ClassDef) -> cst.ClassDef:
        cls = primitives.add_class_attribute(cls, f"{FLAG}: bool = {self.VALUE}")
        return primitives.space_class_attribute(cls, FLAG, self.COMMENT)


class BaseBackendFlag(_DeclareFlag):
    DESCRIPTION = f"AttentionBackend.{FLAG}: bool = True (default: keep the CPU seq_lens mirror)"
    CLASS = "AttentionBackend"
    VALUE = True
    COMMENT = "Opt out only when this backend never reads seq_lens_cpu / seq_lens_sum."


class TritonBackendOptsOut(_DeclareFlag):
    DESCRIPTION = f"TritonAttnBackend.{FLAG} = False (replay never reads seq_lens_cpu / seq_lens_sum)"
    CLASS = "TritonAttnBackend"
    VALUE = False
    COMMENT = REPLAY_COMMENT


class TritonMultiStepDraftOptsOut(_DeclareFlag):
    DESCRIPTION = f"TritonMultiStepDraftBackend.{FLAG} = False (a plain class: needs its own flag)"
    CLASS = "TritonMultiStepDraftBackend"
    VALUE = False
    COMMENT = REPLAY_COMMENT
