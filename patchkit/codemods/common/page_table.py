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

The eager metadata's page table is ``common.eager_page_table``'s.
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
    found = primitives.find_all_of(
        cst.Call, test, m.Call(func=m.Attribute(value=attr("forward_mode") | m.Name("forward_mode")))
    )
    return cst.ensure_type(found[0].func, cst.Attribute).attr.value if found else None


def writes_lengths(stmt: cst.CSTNode, receiver: str) -> bool:
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
    if isinstance(rows, cst.Subscript) or m.matches(
        rows, m.Call(func=attr("unsqueeze"))
    ):  # rows[:, None], rows.unsqueeze(1)
        rows = (
            rows.value
            if isinstance(rows, cst.Subscript)
            else cst.ensure_type(cst.ensure_type(rows, cst.Call).func, cst.Attribute).value
        )
    uses = m.Name(name)
    copy_into_table = m.Call(
        func=attr("copy_", m.Subscript(value=attr("page_table"))),
        args=[m.Arg(m.MatchIfTrue(lambda v: primitives.contains(v, uses)))],
    )
    for j in range(i + 1, len(body)):
        found = primitives.find_all_of(cst.Call, body[j], copy_into_table)
        if not found:
            continue
        table = cst.ensure_type(
            cst.ensure_type(found[0].func, cst.Attribute).value, cst.Subscript
        )  # <receiver>.page_table[...]
        receiver = code_of(cst.ensure_type(table.value, cst.Attribute).value)
        end = j + 1
        swa_copy = m.Call(
            func=attr("_copy_swa_page_table", m.Name("self")), args=[m.Arg(), m.Arg(uses), m.ZeroOrMore()]
        )
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
        if any(writes_lengths(s, receiver) for s in body[:i]):
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

    def leave_IndentedBlock(
        self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
    ) -> cst.IndentedBlock:
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
        return Finding.done(
            self.anchor_of(fn), "no full-width page-table gather in the verify branches (upstream's device build)"
        )

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
