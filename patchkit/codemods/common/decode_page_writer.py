"""The fused decode page-table writer's Triton kernels stop each row at its
live pages (sglang #32109, 0.5.17), on the floor of ``common``.

``normal_decode_set_metadata`` (FA3's decode and draft-decode CUDA-graph
replay; defined in ``flashattention_backend.py`` up to 0.5.12.post1, in
``triton_ops/metadata.py`` 0.5.13 – 0.5.15) launches
``_fused_metadata_kernel_ps1_no_swa`` / ``_fused_metadata_kernel_general``
over ``max_seq_pages`` columns and writes all of them for every row: without
the CPU mirror that is the static bound, ``max_context_len / page_size``
columns per row, every draft step. The attention kernels read a row only up
to ``cache_seqlens`` = ``seq_len + seq_len_delta``, so each kernel's column
mask, ``mask = col_offsets < max_seq_pages``, also stops at the row's live
pages (``ceil((seq_len + delta) / page_size)``): masked columns are neither
read from ``req_to_token`` nor written. The rest of a row keeps what an
earlier replay wrote there, which nothing reads. Upstream made the same cut
(0.5.17), for every caller of the writer.
"""

from __future__ import annotations

from typing import ClassVar, Optional

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import Finding, PatchCodemod
from patchkit.codemods.common.reads import Reads, reads_only

KERNELS = ("_fused_metadata_kernel_ps1_no_swa", "_fused_metadata_kernel_general")
#: The names the guard reads; a kernel lacking one of them is a fork's (missing anchor).
NEEDS = ("seq_lens", "seq_lens_stride_0", "seq_len_delta", "max_seq_pages")

#: ``mask = col_offsets < max_seq_pages``, the column mask of the gather.
COLUMN_MASK = m.SimpleStatementLine(
    body=[
        m.Assign(
            targets=[m.AssignTarget(target=m.Name("mask"))],
            value=m.Comparison(
                left=m.Name(),
                comparisons=[m.ComparisonTarget(operator=m.LessThan(), comparator=m.Name("max_seq_pages"))],
            ),
        )
    ]
)
#: Ours (or upstream's 0.5.17 form): the mask also bounded by the row's live pages.
LIVE = m.Name("live_pages") | m.Name("num_live_pages")

GUARD = """
# patchkit {patch} (sglang #32109): each row stops at its live pages
# (seq_len + delta tokens, what the attention kernels read), not at the
# width given for the whole batch; the rest of the row is never read.
live_pages = {live}
mask = ({column} < max_seq_pages) & ({column} < live_pages)
"""


def _params(fn: cst.FunctionDef) -> set[str]:
    return {p.name.value for p in fn.params.params}


def _row_index(fn: cst.FunctionDef) -> Optional[str]:
    """The row the program writes: the name assigned ``tl.program_id(0)`` or
    from it (``i = pid_b``)."""
    first = primitives.find_all_of(
        cst.Assign,
        fn,
        m.Assign(
            targets=[m.AssignTarget(target=m.Name())],
            value=m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.Name("program_id")), args=[m.Arg(m.Integer("0"))]),
        ),
    )
    if not first:
        return None
    pid = cst.ensure_type(first[0].targets[0].target, cst.Name).value
    alias = primitives.find_all_of(
        cst.Assign, fn, m.Assign(targets=[m.AssignTarget(target=m.Name())], value=m.Name(pid))
    )
    return cst.ensure_type(alias[0].targets[0].target, cst.Name).value if alias else pid


class DecodePageWriterStopsAtLivePages(PatchCodemod):
    """The two kernels' column masks (module-level functions of ``FILE``)."""

    PATCH: ClassVar[str] = ""
    #: Set where the kernels may legitimately live elsewhere (FA3's module from
    #: 0.5.13 on): their absence is superseded, with this reason.
    ELSEWHERE: ClassVar[str] = ""
    REQUIRED_TEXT: ClassVar[tuple[str, ...]] = ("_fused_metadata_kernel",)

    @classmethod
    def reads(cls) -> Optional[Reads]:
        own = reads_only(
            cls, ("detect", "transform_module", "transform_module_impl"), PatchCodemod, DecodePageWriterStopsAtLivePages
        )
        return {name: None for name in KERNELS} if own else None

    def _kernels(self, module: cst.Module) -> list[cst.FunctionDef]:
        return [fn for name in KERNELS if (fn := primitives.find_function(module, name)) is not None]

    def detect(self, module: cst.Module) -> Finding:
        self.detect_module(module)
        anchor = "normal_decode_set_metadata kernels"
        kernels = self._kernels(module)
        if not kernels:
            if self.ELSEWHERE:
                return Finding.superseded(anchor, self.ELSEWHERE)
            return Finding.missing(anchor, f"none of {', '.join(KERNELS)} in this file")
        left = []
        for fn in kernels:
            masks = primitives.find_all(fn, COLUMN_MASK)
            if primitives.contains(
                fn,
                m.Assign(
                    targets=[m.AssignTarget(target=m.Name("mask"))],
                    value=m.MatchIfTrue(lambda v: primitives.contains(v, LIVE)),
                ),
            ):
                continue
            missing = [n for n in NEEDS if n not in _params(fn)] + ([] if _row_index(fn) else ["tl.program_id(0)"])
            if len(masks) != 1 or missing:
                what = "no `mask = ... < max_seq_pages` line" if len(masks) != 1 else f"no {', '.join(missing)}"
                return self.located(
                    Finding.missing(
                        anchor,
                        f"{self.where(fn)}: {fn.name.value} has {what}; "
                        "the patch needs its column mask and the row's length",
                    ),
                    fn,
                )
            left.append(fn)
        if not left:
            return Finding.done(anchor)
        return self.located(
            Finding.todo(anchor, f"{len(left)} kernel(s) write every column up to max_seq_pages"), left[0]
        )

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        for fn in self._kernels(tree):
            if primitives.contains(
                fn,
                m.Assign(
                    targets=[m.AssignTarget(target=m.Name("mask"))],
                    value=m.MatchIfTrue(lambda v: primitives.contains(v, LIVE)),
                ),
            ):
                continue
            tree = primitives.replace_function(tree, fn.name.value, self._guard)
        return tree

    def _guard(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        row = _row_index(fn)
        tokens = f"tl.load(seq_lens + {row} * seq_lens_stride_0).to(tl.int32) + seq_len_delta"
        live = f"({tokens} + page_size - 1) // page_size" if "page_size" in _params(fn) else tokens
        mask = primitives.find_all_of(cst.SimpleStatementLine, fn, COLUMN_MASK)[0]
        assign = mask.body[0]
        # what COLUMN_MASK matched: mask = <column> < max_seq_pages
        assert (
            isinstance(assign, cst.Assign)
            and isinstance(assign.value, cst.Comparison)
            and isinstance(assign.value.left, cst.Name)
        )
        column = assign.value.left.value

        def edit(stmt):
            lines = primitives.parse_statements_with_comments(GUARD.format(patch=self.PATCH, live=live, column=column))
            lines[0] = lines[0].with_changes(leading_lines=[*stmt.leading_lines, *lines[0].leading_lines])
            return cst.FlattenSentinel(lines)

        return primitives.replace_statements(fn, COLUMN_MASK, edit)
