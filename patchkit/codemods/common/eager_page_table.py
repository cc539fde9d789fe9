"""The eager ``init_forward_metadata`` (TRT-LLM MHA; sglang #28106's eager half)
gathers ``metadata.page_table = <pool>.req_to_token[rows, :max_seq_len_k]``
in each forward-mode branch, a token table as wide as the longest row (the
static bound without the mirror), then strides it into pages after the
branches. ``EagerPageTableToRealLength`` guards each gather and the striding
with ``if not page_table_on_device:`` and builds the page table after the
branches instead (``backends.page_table.eager_page_table``: a fresh table,
each row up to its ``cache_seqlens_int32``). ``page_table_on_device`` is False
for a sliding-window backend (the switch its SWA translator tests), whose
tables keep the gather and the translation.

Kept apart from :mod:`patchkit.codemods.common.page_table` (the CUDA-graph
replay's groups) so each stays under the house's 400 lines; it shares the
replay's names and its test of a block that writes the device lengths.
"""

from __future__ import annotations

from typing import ClassVar, Optional

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import Finding, MethodCodemod
from patchkit.codemods.common.page_table import EAGER_HELPER, ON_DEVICE, PAGE_TABLE, writes_lengths
from patchkit.codemods.common.primitives import attr
from patchkit.codemods.common.shared import code_of

_TOKEN_TABLE = m.Assign(
    targets=[m.AssignTarget(target=attr("page_table"))],
    value=m.Subscript(value=attr("req_to_token"), slice=[m.SubscriptElement(m.Index()), m.SubscriptElement(m.Slice())]),
)
_EAGER_GUARD = m.If(test=m.UnaryOperation(operator=m.Not(), expression=m.Name(ON_DEVICE)))
EAGER_COMMENT = (
    "patchkit {patch} ({upstream}): the page table is built on\n"
    "the device after the branches, each row up to its own cache_seqlens (all\n"
    "the kernels read), not gathered as wide as the longest row (without the CPU\n"
    "mirror, the static bound) and strided. Sliding-window backends keep the gather."
)


class _TokenTable:
    """One eager gather: its statement line, the metadata receiver, the
    ``req_to_token`` tensor and the rows, as source."""

    def __init__(self, line: cst.SimpleStatementLine):
        assign = cst.ensure_type(line.body[0], cst.Assign)  # what _TOKEN_TABLE matches
        target, value = (
            cst.ensure_type(assign.targets[0].target, cst.Attribute),
            cst.ensure_type(assign.value, cst.Subscript),
        )
        self.line, self.receiver = line, code_of(target.value)
        self.tokens, self.rows = code_of(value.value), code_of(cst.ensure_type(value.slice[0].slice, cst.Index).value)


def _holds(tree: cst.CSTNode, node: cst.CSTNode) -> bool:
    """``node`` is ``tree`` or under it (libcst matches no top-level MatchIfTrue)."""
    return any(found is node for found in primitives.find_all(tree, getattr(m, type(node).__name__)()))


def _token_tables(fn: cst.FunctionDef) -> list[_TokenTable]:
    """The eager gathers not yet guarded, each preceded in its block by a
    write of its receiver's ``cache_seqlens_int32`` (the lengths to build to).
    (``find_all``, not a visitor: the gathers found are ``fn``'s own nodes.)"""
    ours = [guard.body for guard in primitives.find_all_of(cst.If, fn, _EAGER_GUARD)]
    found = []
    for block in primitives.find_all_of(cst.IndentedBlock, fn, m.IndentedBlock()):
        if any(_holds(guarded, block) for guarded in ours):
            continue
        for i, stmt in enumerate(block.body):
            if (
                isinstance(stmt, cst.SimpleStatementLine)
                and len(stmt.body) == 1
                and m.matches(stmt.body[0], _TOKEN_TABLE)
            ):
                table = _TokenTable(stmt)
                if any(writes_lengths(s, table.receiver) for s in block.body[:i]):
                    found.append(table)
    return found


def _swa_switch(cls: cst.ClassDef, translator: str) -> Optional[str]:
    """The test under which the class's SWA translator returns None (no
    sliding-window pool: ``not self.use_sliding_window_kv_pool`` up to
    0.5.12.post1, ``self._swa_kv_pool is None`` in 0.5.13), if it reads the
    backend only (none of the translator's arguments)."""
    fn = primitives.find_method(cls, translator)
    if fn is None:
        return None
    params = {p.name.value for p in fn.params.params[1:]}
    for stmt in fn.body.body:
        if isinstance(stmt, cst.If) and primitives.contains(stmt.body, m.Return(value=m.Name("None"))):
            if any(name.value in params for name in primitives.find_all_of(cst.Name, stmt.test, m.Name())):
                return None
            return code_of(stmt.test)
    return None


class EagerPageTableToRealLength(MethodCodemod):
    """The eager metadata's page table built on the device (see the module
    docstring). ``PATCH``/``UPSTREAM``: the comment's attribution."""

    METHOD = "init_forward_metadata"
    PATCH: ClassVar[str] = ""
    UPSTREAM: ClassVar[str] = ""
    # _plan reads the sliding-window translator the method calls: these releases' names for it.
    METHODS_READ: ClassVar[Optional[tuple[str, ...]]] = ("_maybe_translate_swa", "kv_index_translator")

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        self._cls = cls
        return super().detect_in_class(cls)

    def transform_class(self, cls: cst.ClassDef) -> cst.ClassDef:
        self._cls = cls
        return super().transform_class(cls)

    def _plan(self, fn: cst.FunctionDef):
        """(tables, chain index, tail indices, on-device condition), or a
        string: why the eager shape is not one this codemod knows."""
        tables = _token_tables(fn)
        if not tables:
            return None
        if len({(t.receiver, t.tokens, t.rows) for t in tables}) > 1:
            return "page-table gathers of different rows or pools"
        body, receiver = list(fn.body.body), tables[0].receiver
        holding = {i for i, stmt in enumerate(body) for t in tables if _holds(stmt, t.line)}
        if len(holding) != 1:
            return "page-table gathers in more than one top-level statement"
        chain = holding.pop()
        table = m.Attribute(value=m.MatchIfTrue(lambda n: code_of(n) == receiver), attr=m.Name("page_table"))
        reads, swa, tail = [], None, []
        for i in range(chain + 1, len(body)):
            if not primitives.contains(body[i], table):
                continue
            if primitives.contains(body[i], m.Assign(targets=[m.AssignTarget(target=table)])):
                tail.append(i)  # the striding into pages
                continue
            translate = m.Assign(
                targets=[m.AssignTarget(target=attr("swa_page_table"))],
                value=m.Call(func=m.Attribute(value=m.Name("self")), args=[m.Arg(table)]),
            )
            found = primitives.find_all_of(cst.Assign, body[i], translate)
            if found and swa is None:  # self.<swa>(table), as translate matched
                swa = cst.ensure_type(cst.ensure_type(found[0].value, cst.Call).func, cst.Attribute).attr.value
            else:
                reads.append(i)
        if tail and any(i < tail[-1] for i in reads):
            return "a read of the token-level page table before it is strided"
        condition = "True"
        if swa is not None:
            switch = _swa_switch(self._cls, swa)
            if switch is None:
                return f"a sliding-window translator ({swa}) that opens with no `if <backend test>: return None`"
            condition = switch
        return tables, chain, tail, condition

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        plan = self._plan(fn)
        if isinstance(plan, str):
            return self.missing_in(fn, plan, "the eager token-table gathers, then their striding into pages")
        if plan is not None:
            return Finding.todo(
                self.anchor_of(fn), f"{len(plan[0])} eager req_to_token gather(s) as wide as the longest row"
            )
        if primitives.contains(fn, m.Call(func=m.Name(EAGER_HELPER))):
            return Finding.done(self.anchor_of(fn))
        return Finding.done(self.anchor_of(fn), "no eager page-table gather after the lengths")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        tables, chain, tail, condition = self._plan(fn)
        self.require_import(PAGE_TABLE, EAGER_HELPER)
        first = tables[0]
        lines = {id(t.line) for t in tables}

        class Guard(cst.CSTTransformer):
            def leave_SimpleStatementLine(self, original, updated):
                return primitives.guard_statement(updated, f"not {ON_DEVICE}") if id(original) in lines else updated

        body = list(fn.body.body)
        for i in tail:
            body[i] = primitives.guard_statement(body[i], f"not {ON_DEVICE}")
        build = primitives.parse_statement(
            f"if {ON_DEVICE}:\n    {first.receiver}.page_table = {EAGER_HELPER}({first.tokens}, {first.rows}, "
            f"{first.receiver}.cache_seqlens_int32, self.page_size)\n"
        ).with_changes(leading_lines=[cst.EmptyLine(indent=False)])
        comment = EAGER_COMMENT.format(patch=self.PATCH, upstream=self.UPSTREAM)
        if condition == "True":
            comment += "\n(No sliding-window pool in this release: the gathers are never run.)"
        ours = [cst.EmptyLine(comment=cst.Comment(f"# {line}")) for line in comment.splitlines()]
        flag = primitives.parse_statement(f"{ON_DEVICE} = {condition}\n").with_changes(
            leading_lines=[*body[chain].leading_lines, *ours]
        )
        guarded = body[chain].visit(Guard()).with_changes(leading_lines=[])
        body[chain : chain + 1] = [flag, guarded, build]
        return fn.with_changes(body=fn.body.with_changes(body=body))
