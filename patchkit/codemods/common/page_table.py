"""The CUDA-graph replay's page table built on the device, each row stopped at
its real length (FA3: sglang #29343 + #31381 + #32109; TRT-LLM MHA: #28106),
on the floor of ``common``: FA3's and TRT-LLM MHA's replays share the shape.

The replay gathers ``page_indices = self.req_to_token[rows[:, None],
strided[:max_seq_pages]]`` and copies it into ``metadata.page_table[:,
:max_seq_pages]`` (sliding-window models translate a copy into
``metadata.swa_page_table`` on the way). Without the CPU mirror
``max_seq_pages`` is the static bound, so every replay moves ``bs *
max_context_len / page_size`` entries. Each such group of statements, in the
branches a patch names, becomes::

    if not fill_page_table_rows(self.req_to_token, rows, metadata.cache_seqlens_int32,
                                metadata.page_table, self.page_size, metadata.swa_page_table):
        <the group, unchanged>

``backends.page_table.fill_page_table_rows`` writes each row up to
``ceil(cache_seqlens / page_size)`` from the device lengths (what the
attention kernels read) and declines sliding-window tables, which keep the
gather. A group is taken only where the same block wrote
``metadata.cache_seqlens_int32`` before it: those are the lengths the kernels
stop at.

The eager ``init_forward_metadata`` (TRT-LLM MHA; sglang #28106's eager half)
gathers ``metadata.page_table = <pool>.req_to_token[rows, :max_seq_len_k]``
in each forward-mode branch, a token table as wide as the longest row (the
static bound without the mirror), then strides it into pages after the
branches. ``EagerPageTableToRealLength`` guards each gather and the striding
with ``if not page_table_on_device:`` and builds the page table after the
branches instead (``backends.page_table.eager_page_table``: a fresh table,
each row up to its ``cache_seqlens_int32``). ``page_table_on_device`` is False
for a sliding-window backend (the switch its SWA translator tests), whose
tables keep the gather and the translation.
"""

from __future__ import annotations

from typing import ClassVar, Optional

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import Finding, MethodCodemod
from patchkit.codemods.common.primitives import attr
from patchkit.codemods.common.shared import code_of
from patchkit.layout import import_path

PAGE_TABLE = import_path("backends.page_table")
HELPER = "fill_page_table_rows"
EAGER_HELPER = "eager_page_table"
ON_DEVICE = "page_table_on_device"

_GATHER = m.Assign(
    targets=[m.AssignTarget(target=m.Name())],
    value=m.Subscript(value=attr("req_to_token", m.Name("self"))),
)
_OURS = m.UnaryOperation(operator=m.Not(), expression=m.Call(func=m.Name(HELPER)))
COMMENT = (
    "patchkit {patch} ({upstream}): the page table is built on\n"
    "the device, each row up to its own cache_seqlens (all the kernels read),\n"
    "not gathered as wide as the longest row (without the CPU mirror, the\n"
    "static bound). Sliding-window tables are declined: they keep the gather."
)


def _mode(test: cst.BaseExpression) -> Optional[str]:
    """``is_target_verify`` for ``forward_mode.is_target_verify()`` (and the
    ``forward_batch.forward_mode`` spelling): the forward-mode test of an ``if``."""
    found = primitives.find_all_of(cst.Call, test, m.Call(func=m.Attribute(value=attr("forward_mode") | m.Name("forward_mode"))))
    return cst.ensure_type(found[0].func, cst.Attribute).attr.value if found else None


def _writes_lengths(stmt: cst.CSTNode, receiver: str) -> bool:
    """``stmt`` writes ``<receiver>.cache_seqlens_int32`` (``.copy_`` into it or an assignment)."""
    lengths = m.Attribute(value=m.MatchIfTrue(lambda n: code_of(n) == receiver), attr=m.Name("cache_seqlens_int32"))
    return primitives.contains(stmt, m.Call(func=attr("copy_", lengths))) or primitives.contains(
        stmt, m.Assign(targets=[m.AssignTarget(target=lengths)])
    )


class _Group:
    """One gather-and-copy group: statements ``start:end`` of a block."""

    def __init__(self, block: cst.IndentedBlock, start: int, end: int, rows: str, receiver: str, mode: Optional[str]):
        self.block, self.start, self.end, self.rows, self.receiver, self.mode = block, start, end, rows, receiver, mode


def _group_at(body: list, i: int) -> Optional[tuple[int, str, str]]:
    """The group starting at statement ``i`` (a ``X = self.req_to_token[...]``
    gather): its end, the rows expression and the metadata receiver."""
    stmt = body[i]
    gather = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
    if not (isinstance(gather, cst.Assign) and isinstance(gather.value, cst.Subscript) and m.matches(gather, _GATHER)):
        return None
    name = cst.ensure_type(gather.targets[0].target, cst.Name).value
    index = gather.value.slice[0].slice
    if not isinstance(index, cst.Index):
        return None
    rows = index.value
    if isinstance(rows, cst.Subscript) or m.matches(rows, m.Call(func=attr("unsqueeze"))):  # rows[:, None], rows.unsqueeze(1)
        rows = rows.value if isinstance(rows, cst.Subscript) else cst.ensure_type(cst.ensure_type(rows, cst.Call).func, cst.Attribute).value
    uses = m.Name(name)
    copy_into_table = m.Call(
        func=attr("copy_", m.Subscript(value=attr("page_table"))),
        args=[m.Arg(m.MatchIfTrue(lambda v: primitives.contains(v, uses)))],
    )
    for j in range(i + 1, len(body)):
        found = primitives.find_all_of(cst.Call, body[j], copy_into_table)
        if not found:
            continue
        table = cst.ensure_type(cst.ensure_type(found[0].func, cst.Attribute).value, cst.Subscript)  # <receiver>.page_table[...]
        receiver = code_of(cst.ensure_type(table.value, cst.Attribute).value)
        end = j + 1
        swa_copy = m.Call(func=attr("_copy_swa_page_table", m.Name("self")), args=[m.Arg(), m.Arg(uses), m.ZeroOrMore()])
        if end < len(body) and primitives.contains(body[end], swa_copy):
            end += 1  # TRT-LLM MHA's sliding-window copy of the same gather
        return end, code_of(rows), receiver
    return None


def _branch_modes(node: cst.If, modes: dict[int, Optional[str]]) -> None:
    """The forward mode of the blocks an ``if`` opens (``modes``: id(block) -> mode)."""
    if m.matches(node.test, _OURS):
        modes[id(node.body)] = "ours"
        return
    mode = _mode(node.test)
    if mode is not None:
        modes[id(node.body)] = mode
        if isinstance(node.orelse, cst.Else):
            modes[id(node.orelse.body)] = "other"


def _block_groups(block: cst.IndentedBlock, mode: Optional[str]) -> list[_Group]:
    """The groups among a block's statements (none in our own branch)."""
    if mode == "ours":
        return []
    groups, body, i = [], list(block.body), 0
    while i < len(body):
        found = _group_at(body, i)
        if found is None:
            i += 1
            continue
        end, rows, receiver = found
        if any(_writes_lengths(s, receiver) for s in body[:i]):
            groups.append(_Group(block, i, end, rows, receiver, mode))
        i = end
    return groups


def groups_in(fn: cst.FunctionDef) -> list[_Group]:
    """Every group in a method with its branch's forward mode, as
    :class:`_Groups` finds them, by a walk that rebuilds nothing (detection
    runs it on the longest methods of the backends, several times an apply)."""
    groups: list[_Group] = []
    modes: dict[int, Optional[str]] = {}
    stack: list[tuple[cst.CSTNode, Optional[str]]] = [(fn, None)]  # (node, mode of the innermost block around it)
    while stack:
        node, mode = stack.pop()
        if type(node) is cst.If:
            _branch_modes(node, modes)
        elif type(node) is cst.IndentedBlock:
            mode = modes.get(id(node), mode)
            groups.extend(_block_groups(node, mode))
        stack.extend((child, mode) for child in reversed(primitives.children(node)))
    return groups


class _Groups(cst.CSTTransformer):
    """The transform: each group (``groups_in``) whose mode is in ``modes``
    is replaced by what ``edit`` (a function of the group's statements and
    the group) returns."""

    def __init__(self, modes: tuple[str, ...], edit) -> None:
        self.groups: list[_Group] = []
        self._modes: dict[int, Optional[str]] = {}  # id(block) -> mode of the branch it is
        self._stack: list[Optional[str]] = [None]
        self._wanted, self._edit = modes, edit

    def visit_If(self, node: cst.If) -> None:
        _branch_modes(node, self._modes)

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        mode = self._modes.get(id(node), self._stack[-1])
        self._stack.append(mode)
        self.groups.extend(_block_groups(node, mode))

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        self._stack.pop()
        mine = [g for g in self.groups if g.block is original_node and g.mode in self._wanted]
        if not mine:
            return updated_node
        body = list(updated_node.body)  # nested edits keep the statement positions
        for group in reversed(mine):
            body[group.start : group.end] = [self._edit(body[group.start : group.end], group)]
        return updated_node.with_changes(body=body)


class ReplayPageTableToRealLength(MethodCodemod):
    """Each gather-and-copy group of the replay in a ``MODES`` branch becomes
    the device build (above). ``DETECT_MODES``: the branches whose groups make
    the change todo (upstream's own form leaves other branches' gathers:
    0.5.16+ FA3 converted the verify branches only); ``PATCH``/``UPSTREAM``:
    the comment's attribution."""

    METHOD = "init_forward_metadata_replay_cuda_graph"
    RENAMED = ("_apply_cuda_graph_metadata",)  # 0.5.13+
    MODES: ClassVar[tuple[str, ...]] = ()
    DETECT_MODES: ClassVar[tuple[str, ...]] = ()
    PATCH: ClassVar[str] = ""
    UPSTREAM: ClassVar[str] = ""

    def _groups(self, fn: cst.FunctionDef, modes: tuple[str, ...]) -> list[_Group]:
        return [g for g in groups_in(fn) if g.mode in modes]

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        left = self._groups(fn, self.DETECT_MODES)
        if left:
            where = ", ".join(sorted({g.mode for g in left if g.mode is not None}))
            return Finding.todo(self.anchor_of(fn), f"{len(left)} full-width req_to_token gather(s) ({where})")
        if primitives.contains(fn, m.Call(func=m.Name(HELPER))):
            return Finding.done(self.anchor_of(fn))
        return Finding.done(self.anchor_of(fn), "no full-width page-table gather in the verify branches (upstream's device build)")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        comment = COMMENT.format(patch=self.PATCH, upstream=self.UPSTREAM)
        self.require_import(PAGE_TABLE, HELPER)

        def device_build(stmts: list, group: _Group) -> cst.If:
            lengths, table = f"{group.receiver}.cache_seqlens_int32", f"{group.receiver}.page_table"
            condition = (
                f"not {HELPER}(self.req_to_token, {group.rows}, {lengths}, {table}, "
                f"self.page_size, {group.receiver}.swa_page_table)"
            )
            return primitives.guard_statements(stmts, condition, comment)

        return primitives.visit_below(fn, _Groups(self.MODES, device_build))


# -- the eager metadata -------------------------------------------------------------------------

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
        target, value = cst.ensure_type(assign.targets[0].target, cst.Attribute), cst.ensure_type(assign.value, cst.Subscript)
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
            if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and m.matches(stmt.body[0], _TOKEN_TABLE):
                table = _TokenTable(stmt)
                if any(_writes_lengths(s, table.receiver) for s in block.body[:i]):
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
            return Finding.todo(self.anchor_of(fn), f"{len(plan[0])} eager req_to_token gather(s) as wide as the longest row")
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
