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

0.5.4.post3 and 0.5.5.post3: the draft-extend branch of
``init_forward_metadata`` takes ``max_seq`` from the mirror a second time,
unguarded, right after the method's own None test set it (from the mirror,
else the device): with the opt-out, a TypeError there. 0.5.6 dropped that
re-read; so does this patch (``DraftExtendReadsNoMirrorTwice``).
"""

from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives, shared
from patchkit.codemods.common.base import Finding, MethodCodemod
from patchkit.codemods.common.shared import FLAG, MIRROR_READS, ClassFlag, code_of
from patchkit.codemods.common.tree_mask import (
    GET_BUFFERS,
    MASK,
    MAX_BS,
    AllocMask,
    InitMaskAndDraftRunner,
    VerifyBuffersReturnMask,
)
from patchkit.layout import import_path

BACKEND = "TRTLLMMLABackend"
DRAFT_BACKEND = "TRTLLMMLAMultiStepDraftBackend"
HELPERS = import_path("backends.trtllm_mla")


class _OptOutFlag(ClassFlag):
    """Upstream's layout (a blank line above, wherever the attribute lands);
    no ``__init__`` rule (TRT-LLM MLA never set the flag per instance)."""

    UPSTREAM_LAYOUT = True


class BackendOptsOutOfCpuSeqLens(_OptOutFlag):
    DESCRIPTION = f"{BACKEND}.{FLAG} = False: trtllm-gen kernels never read seq_lens_cpu / seq_lens_sum"
    CLASS = BACKEND
    WHY = (
        "trtllm-gen kernels rebuild metadata from preallocated buffers and never\n"
        "read seq_lens_cpu / seq_lens_sum; opt out of the D2H sync."
    )


class DraftBackendOptsOutOfCpuSeqLens(_OptOutFlag):
    DESCRIPTION = f"{DRAFT_BACKEND}.{FLAG} = False: per-step draft decode never reads seq_lens_cpu / seq_lens_sum"
    CLASS = DRAFT_BACKEND
    WHY = (
        "Per-step draft decode never reads seq_lens_cpu / seq_lens_sum; opt out so\n"
        "decide_needs_cpu_seq_lens' OR over the backends stays False."
    )


# -- the verify tree mask (common's, with TRT-LLM MLA's helpers) -----------------------------


class InitCustomMask(InitMaskAndDraftRunner):
    __doc__ = InitMaskAndDraftRunner.__doc__
    DESCRIPTION = f"{BACKEND}.__init__ sets self.{MASK} = None and self.is_draft_runner (sglang #31527)"
    CLASS = BACKEND
    ALLOC_HELPER = "alloc_cuda_graph_custom_mask"


class AllocCustomMask(AllocMask):
    __doc__ = AllocMask.__doc__
    DESCRIPTION = (
        f"{BACKEND}.init_cuda_graph_state preallocates self.{MASK} in the compact QLEN_ONLY layout "
        "(bool, max_num_tokens * num_draft_tokens: trtllm-gen never reads it, sglang #32920) on the target "
        f"backend only (sglang #31527), and records the captured max_bs (self.{MAX_BS}) it fits"
    )
    CLASS = BACKEND
    HELPERS = HELPERS
    ALLOC_HELPER = "alloc_cuda_graph_custom_mask"
    READS_MASK = "False"
    READS_MASK_WHY = "Target verify runs the trtllm-gen kernel, which takes no tree mask (sglang #32920)."
    GATE_KEYWORDS = ("is_draft_runner=self.is_draft_runner",)


class VerifyBuffersReturnCustomMask(VerifyBuffersReturnMask):
    DESCRIPTION = f"{BACKEND}.{GET_BUFFERS} returns [self.{MASK}, None]"
    CLASS = BACKEND
    HELPERS = HELPERS
    BUFFERS_HELPER = "verify_buffers_to_fill_after_draft"


# -- 0.5.4 / 0.5.5: the draft extend's second, unguarded max of the mirror ---------------------

MAX = "max_seq"
_SETS_MAX = m.Assign(targets=[m.AssignTarget(target=m.Name(MAX))])
_MIRROR = m.Attribute(value=m.Name("forward_batch"), attr=m.Name("seq_lens_cpu"))
_IS_DRAFT_EXTEND = m.Call(func=m.Attribute(attr=m.Name("is_draft_extend")))


def _re_reads(fn: cst.FunctionDef) -> list[cst.SimpleStatementLine]:
    """``max_seq = forward_batch.seq_lens_cpu...`` lines in a draft-extend branch,
    outside the method's own None test."""
    guarded = _guarded_max(fn)
    kept = {id(n) for n in primitives.find_all(guarded, m.SimpleStatementLine())} if guarded is not None else set()
    branches = primitives.find_all_of(
        cst.If, fn, m.If(test=_IS_DRAFT_EXTEND)
    )  # the branch itself, not an `or` holding it
    return [
        line
        for b in branches
        for line in primitives.find_all_of(cst.SimpleStatementLine, b.body, m.SimpleStatementLine(body=[_SETS_MAX]))
        if primitives.contains(line, _MIRROR) and id(line) not in kept
    ]


def _guarded_max(fn: cst.FunctionDef) -> Optional[cst.If]:
    """The method's own ``if <mirror> is not None: max_seq = ... else: max_seq = ...``."""
    return next(
        (
            b
            for b in primitives.find_all_of(cst.If, fn, m.If())
            if b.orelse is not None
            and primitives.contains(b.test, m.SimpleString('"seq_lens_cpu"') | _MIRROR)
            and primitives.contains(b.body, _SETS_MAX)
            and primitives.contains(b.orelse, _SETS_MAX)
        ),
        None,
    )


class DraftExtendReadsNoMirrorTwice(MethodCodemod):
    DESCRIPTION = (
        f"{BACKEND}.init_forward_metadata: the draft-extend branch keeps the {MAX} its None test set "
        "(mirror, else device) instead of reading the mirror again, unguarded (as from 0.5.6)"
    )
    CLASS = BACKEND
    METHOD = "init_forward_metadata"

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        anchor = f"{self.anchor}: draft-extend {MAX}"
        re_reads = _re_reads(fn)
        if not re_reads:  # superseded, not done: it never makes a pristine 0.5.6+ tree look half-patched
            return Finding.superseded(
                anchor, f"the draft extend reads no {MAX} from the mirror but the None-tested one"
            )
        if _guarded_max(fn) is None:
            return self.missing_in(
                fn,
                f"the draft extend reads {MAX} from the mirror with no None-tested {MAX} before it",
                f"an `if ... seq_lens_cpu ... is not None: {MAX} = ... else: {MAX} = ...` to keep",
                re_reads[0],
            )
        return Finding.todo(anchor, f"the draft extend reads {MAX} from the mirror again, unguarded")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        values = {id(cst.ensure_type(line.body[0], cst.Assign).value) for line in _re_reads(fn)}  # _SETS_MAX lines
        those = m.SimpleStatementLine(body=[m.Assign(value=m.MatchIfTrue(lambda value: id(value) in values))])
        return primitives.remove_statements(fn, those)


# -- the eager max without the mirror (sglang 0.5.16) --------------------------------------------

_DEVICE_MAX = shared.max_item(m.Attribute(value=m.Name("forward_batch"), attr=m.Name("seq_lens")))
_BOUND_MAX = m.Attribute(value=m.Name("self"), attr=m.Name("max_context_len"))  # upstream's, 0.5.16+
_OURS = m.Call(func=m.Name("alloc_cuda_graph_custom_mask") | m.Name("host_max_seq_len"))


def _fallback(guarded: cst.If) -> Optional[cst.BaseExpression]:
    """The value the guarded max takes without the mirror (its ``else``)."""
    assert guarded.orelse is not None  # _guarded_max has an else
    sets = primitives.find_all_of(cst.Assign, guarded.orelse, _SETS_MAX)
    return sets[0].value if len(sets) == 1 else None


class EagerMaxWithoutMirror(MethodCodemod):
    """Without the CPU mirror (the opt-out above), ``init_forward_metadata``
    fell back to ``forward_batch.seq_lens.max().item()``: a host wait in every
    eager verify, draft step and draft extend (a batch above
    ``cuda_graph_max_bs``, or CUDA graphs off). ``max_seq`` only sizes the
    block table and the kernel's bound, so 0.5.16 takes the static
    ``self.max_context_len`` there; the patched tree reads it through
    ``host_max_seq_len`` (FlashMLA's helper: the mirror's max when there).
    Upstream's own opt-out (0.5.13 .. 0.5.15) kept the device max: left as
    upstream wrote it (superseded), as the patch's other parts are there."""

    DESCRIPTION = (
        f"{BACKEND}.init_forward_metadata: without the CPU mirror, {MAX} is the static max_context_len "
        "(host_max_seq_len), not seq_lens.max().item() (a host wait every eager step; sglang 0.5.16)"
    )
    CLASS = BACKEND
    METHOD = "init_forward_metadata"
    METHODS_READ = ("init_cuda_graph_state",)

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        # Upstream's own opt-out (0.5.13 .. 0.5.15): the flag declared, no patchkit helper.
        alloc = primitives.find_method(cls, "init_cuda_graph_state")
        self._upstreams = primitives.find_class_attribute(cls, FLAG) is not None and not (
            alloc is not None and primitives.contains(alloc, _OURS)
        )
        return super().detect_in_class(cls)

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        if primitives.contains(
            fn, m.Assign(targets=[m.AssignTarget(target=m.Name(MAX))], value=primitives.call("host_max_seq_len"))
        ):
            return Finding.done(self.anchor)
        guarded = _guarded_max(fn)
        fallback = _fallback(guarded) if guarded is not None else None
        if fallback is not None and m.matches(fallback, _BOUND_MAX):
            return Finding.done(self.anchor, "upstream's static bound (0.5.16+)")
        if fallback is None or not m.matches(fallback, _DEVICE_MAX):
            return self.missing_in(
                fn,
                f"no `if <mirror> is not None: {MAX} = ... else: {MAX} = forward_batch.seq_lens.max().item()`",
                "that fallback to bound by max_context_len",
                guarded,
            )
        if self._upstreams:
            return Finding.superseded(
                self.anchor,
                f"upstream's own opt-out (0.5.13 .. 0.5.15) keeps the device {MAX}: left as upstream wrote it",
            )
        return Finding.todo(
            self.anchor, f"without the mirror {MAX} is read from the device (a host wait every eager step)"
        )

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        guarded = _guarded_max(fn)
        assert guarded is not None  # detect found it
        mirror = primitives.find_all_of(cst.Comparison, guarded.test, m.Comparison())[0].left
        source = f"""
            # Without the CPU mirror, the static bound (sglang 0.5.16): it only sizes
            # the block table; seq_lens.max().item() waited for the GPU every eager step.
            {MAX} = host_max_seq_len({code_of(mirror)}, self.max_context_len, forward_batch)
        """
        (line,) = primitives.parse_statements_with_comments(source)
        self.require_import(MIRROR_READS, "host_max_seq_len")
        return primitives.replace_node(
            fn, guarded, line.with_changes(leading_lines=[*guarded.leading_lines, *line.leading_lines])
        )
