"""sglang #31430: no softmax / top-k in the spec-v2 draft-extend CUDA graph.

``EAGLEDraftExtendCudaGraphRunner`` captures ``run_once``: the draft model's
forward, then ``torch.softmax`` + ``fast_topk`` over every row x vocab
(0.5.13 .. 0.5.16: ``argmax`` + ``ones_like`` when topk is 1 on CUDA). For
DRAFT_EXTEND_V2 nothing reads that: ``EagleDraftWorker._draft_extend_for_decode``
keeps one row per request and computes softmax + top-k on those rows itself.
One codemod makes the V2 graph top-k-free, because the two edits only work
together:

* capture (``capture_one_batch_size``; 0.5.14+ ``capture_one_shape``): the
  statements of ``run_once`` that compute top-k (with the locals they bind,
  ``probs``) go under ``if self.forward_mode != ForwardMode.DRAFT_EXTEND_V2:``,
  so V1 (``DRAFT_EXTEND``, whose worker reads the graph's top-k) is unchanged;
* replay (``replay``; 0.5.14+ ``execute``): the top-k slices copied into the
  unpadded output go under the same guard, or a V2 replay would read fields
  the graph no longer sets. 0.5.13 has this natively (sglang #25002); on
  0.5.10 .. 0.5.12.post1 trtllm-mha-draft-extend-v2 makes the same edit: the
  pieces live in ``common.draft_extend_topk`` and whichever patch comes first
  makes it, the other finds it done. 0.5.14+ ``execute`` returns logits and
  hidden states only (done).

Done where every top-k assignment of the capture method is confined to
non-V2 modes or gone (upstream from #31430 on) and replay copies none for V2.
A runner that never names DRAFT_EXTEND_V2 (0.5.4.post3) has no V2 graph:
not applicable. The runner must keep ``self.forward_mode`` (the guard reads it); a run of
top-k statements mixed with other work is refused in one line.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import ClassCodemod, Finding
from patchkit.codemods.common.draft_extend_topk import (
    CAPTURE_METHODS,
    FORWARD_MODE_MODULE,
    REPLAY_METHODS,
    RUNNER,
    TOPK_ASSIGN,
    TOPK_COPY,
    V1_ONLY,
    V1_ONLY_WORDS,
    captures_v1_only,
    copy_block,
    guard_copies,
    guard_topk,
    topk_block,
    unguarded,
)

WHY = (
    "V1 only: the DRAFT_EXTEND_V2 worker computes top-k itself on the rows it\n"
    "selects (patchkit draft-extend-graph-no-topk, sglang #31430)."
)
_SETS_FORWARD_MODE = m.Assign(
    targets=[m.AssignTarget(target=m.Attribute(value=m.Name("self"), attr=m.Name("forward_mode")))]
)


class V2GraphComputesNoTopk(ClassCodemod):
    DESCRIPTION = (
        "EAGLEDraftExtendCudaGraphRunner: the captured run_once computes softmax + top-k only for modes other "
        "than DRAFT_EXTEND_V2, and replay copies top-k slices only for those modes"
    )
    CLASS = RUNNER
    METHODS_READ, WORDS_READ = CAPTURE_METHODS + REPLAY_METHODS, V1_ONLY_WORDS  # self.forward_mode too

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        capture = primitives.find_first_method(cls, CAPTURE_METHODS)
        replay = primitives.find_first_method(cls, REPLAY_METHODS)
        for fn, names in ((capture, CAPTURE_METHODS), (replay, REPLAY_METHODS)):
            if fn is None:
                return Finding.missing(
                    self.CLASS, f"{self.where(cls)}: class {self.CLASS} defines none of {', '.join(names)}"
                )
        assert capture is not None and replay is not None  # else the loop returned
        anchor = f"{self.CLASS}.{capture.name.value}"
        computed, copied = unguarded(capture, TOPK_ASSIGN), unguarded(replay, TOPK_COPY)
        if not computed and not copied:
            return Finding.done(anchor)
        if captures_v1_only(cls):
            return Finding.superseded(anchor, V1_ONLY)
        if not primitives.contains(cls, _SETS_FORWARD_MODE):
            return Finding.missing(
                anchor,
                f"{self.where(cls)}: class {self.CLASS} never sets self.forward_mode; "
                "the patch needs it to tell DRAFT_EXTEND_V2 from V1",
            )
        if computed and topk_block(capture) is None:
            return Finding.missing(
                anchor,
                f"{self.where(computed[0])}: the top-k computed in the graph is not one run "
                "of statements that only compute it; the patch needs such a run to guard it for V1",
            )
        if copied and copy_block(replay) is None:
            return Finding.missing(
                f"{self.CLASS}.{replay.name.value}",
                f"{self.where(copied[0])}: the top-k copies "
                "into the output are not one run of statements in one block; the patch needs them "
                "as one run, to guard it for non-V2 modes",
            )
        if not computed:
            return Finding.todo(anchor, "replay copies top-k slices the DRAFT_EXTEND_V2 graph does not compute")
        return Finding.todo(anchor, "the DRAFT_EXTEND_V2 graph computes softmax + top-k over every row, unread")

    def transform_class(self, cls: cst.ClassDef) -> cst.ClassDef:
        self.require_import(FORWARD_MODE_MODULE, "ForwardMode")
        capture = primitives.find_first_method(cls, CAPTURE_METHODS)
        assert capture is not None  # detect found it
        if unguarded(capture, TOPK_ASSIGN):
            cls = primitives.replace_method(cls, capture.name.value, lambda fn: guard_topk(fn, WHY))
        replay = primitives.find_first_method(cls, REPLAY_METHODS)
        assert replay is not None  # detect found it
        if unguarded(replay, TOPK_COPY):
            cls = primitives.replace_method(cls, replay.name.value, guard_copies)
        return cls
