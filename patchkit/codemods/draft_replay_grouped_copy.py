"""sglang #28465 (0.5.14): the EAGLE draft and draft-extend CUDA-graph replays copy
their inputs in groups, not one ``cudaMemcpyAsync`` a field.

Before each replay, ``EAGLEDraftCudaGraphRunner.replay`` and
``EAGLEDraftExtendCudaGraphRunner.replay`` copy every input field into the
graph's static buffer, ``buffers.X[:n].copy_(Y)`` (``self.X`` before 0.5.10),
six and seven memcpys a spec-v2 decode step. Upstream 0.5.14 collects them into
lists and calls ``_grouped_foreach_copy_`` (one ``torch._foreach_copy_`` per dtype
pair), keeping ``hidden_states`` a plain ``copy_`` (large: the copy engine is
faster than the foreach kernel); the host buffers (``seq_lens_cpu``) are not
device copies and stay as they are.

The codemod does the same with the runtime's ``copy_grouped``: from the first
per-field copy of the method to the last, each ``X[...].copy_(Y)`` (a top-level
statement, or one in an ``if`` there: the optional fields) becomes
``field_copies.append((X[...], Y))``, and ``copy_grouped(field_copies)`` follows
the last one. The copies then run after the statements between them, so those
statements may not read a buffer copied before them nor change a source in
place (the releases' ``maybe_detect_nan`` / ``hidden_states`` lines do neither);
a tree where one does is a missing anchor naming it.

* DONE: the method calls ``copy_grouped`` (patchkit) or ``_grouped_foreach_copy_``
  (upstream, 0.5.14+: ``execute``).
* SUPERSEDED: a fork's own ``torch._foreach_copy_`` (or a helper of its own named
  ``*foreach_copy*``) in the method.
* MISSING: fewer than two per-field copies to group, or a statement between them
  that the grouping would reorder.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import Finding, MethodCodemod
from patchkit.codemods.common.shared import RUNTIME, code_of

COPY = "copy_grouped"
UPSTREAM_COPY = "_grouped_foreach_copy_"
LIST = "field_copies"
#: Buffers whose copy stays a ``copy_``, as upstream keeps them: ``hidden_states``
#: (large: the copy engine) and the host buffers (``*_cpu``: no device copy).
KEPT = ("hidden_states",)

#: ``X[...].copy_(Y)`` as a statement line: one field copied into its buffer.
FIELD_COPY = primitives.line(
    m.Expr(
        value=m.Call(func=m.Attribute(value=m.Subscript(), attr=m.Name("copy_")), args=[m.Arg(keyword=None, star="")])
    )
)
#: A grouped copy the tree wrote itself: ``torch._foreach_copy_(...)`` or a helper named so.
OWN_GROUPED = m.Call(
    func=m.Attribute(attr=m.Name(m.MatchIfTrue(lambda n: "foreach_copy" in n)))
    | m.Name(m.MatchIfTrue(lambda n: "foreach_copy" in n and n != UPSTREAM_COPY))
)
#: What a statement between the copies may touch only by name: ``A.B`` / ``A``.
REFERENCE = m.Attribute() | m.Name()
#: ``X.op_(...)``: an in-place method.
IN_PLACE = m.Call(func=m.Attribute(attr=m.Name(m.MatchIfTrue(lambda n: n.endswith("_") and not n.startswith("_")))))


def _parts(line: cst.SimpleStatementLine) -> tuple[cst.Subscript, cst.BaseExpression]:
    """``(X[...], Y)`` of the copy line ``X[...].copy_(Y)``."""
    call = cst.ensure_type(cst.ensure_type(line.body[0], cst.Expr).value, cst.Call)
    return cst.ensure_type(cst.ensure_type(call.func, cst.Attribute).value, cst.Subscript), call.args[0].value


def _grouped(line: cst.CSTNode) -> bool:
    """A per-field copy that joins the group (not ``hidden_states`` nor a host buffer)."""
    buffer = _parts(cst.ensure_type(line, cst.SimpleStatementLine))[0].value
    name = buffer.attr.value if isinstance(buffer, cst.Attribute) else code_of(buffer)
    return name not in KEPT and not name.endswith("_cpu")


def _copies_in(stmt: primitives.Statement) -> list[cst.SimpleStatementLine]:
    """The grouped copies of one top-level statement: itself, or those in an ``if``."""
    if m.matches(stmt, FIELD_COPY):
        return [cst.ensure_type(stmt, cst.SimpleStatementLine)] if _grouped(stmt) else []
    if isinstance(stmt, cst.If):
        return [
            cst.ensure_type(n, cst.SimpleStatementLine) for n in primitives.find_all(stmt, FIELD_COPY) if _grouped(n)
        ]
    return []


@dataclass
class _Plan:
    start: int  # the method body's statements start:end hold every grouped copy
    end: int
    copies: dict[int, list[cst.SimpleStatementLine]]  # by statement index
    clash: Optional[tuple[cst.CSTNode, str]]  # a statement the grouping would reorder, and why


def _clash(stmt: primitives.Statement, skip: list[cst.SimpleStatementLine], dsts: set, srcs: set) -> Optional[str]:
    """Why ``stmt`` (less its own copies ``skip``) may not run before copies queued
    into the buffers ``dsts`` from ``srcs``: it reads such a buffer, or changes a source in place."""
    inside = {id(n) for line in skip for n in primitives.find_all(line, REFERENCE | IN_PLACE)}
    for node in primitives.find_all(stmt, REFERENCE):
        if id(node) not in inside and code_of(node) in dsts:
            return f"reads {code_of(node)}, copied before it"
    for node in primitives.find_all(stmt, IN_PLACE):
        receiver = code_of(cst.ensure_type(cst.ensure_type(node, cst.Call).func, cst.Attribute).value)
        if id(node) not in inside and receiver in srcs:
            return f"changes {receiver} in place, copied before it"
    return None


def _plan(fn: cst.FunctionDef) -> Optional[_Plan]:
    """Where the method's grouped copies are, or None with fewer than two."""
    body = primitives.block_statements(fn.body)
    copies = {i: found for i, stmt in enumerate(body) if (found := _copies_in(stmt))}
    if sum(len(found) for found in copies.values()) < 2:
        return None
    start, end = min(copies), max(copies) + 1
    dsts: set[str] = set()
    srcs: set[str] = set()
    for i in range(start, end):
        found = copies.get(i, [])
        if not m.matches(body[i], FIELD_COPY) and (why := _clash(body[i], found, dsts, srcs)):
            return _Plan(start, end, copies, (body[i], why))
        for line in found:
            dst, src = _parts(line)
            dsts.add(code_of(dst.value))
            srcs.add(code_of(src))
    return _Plan(start, end, copies, None)


def _one_of(nodes: list[cst.SimpleStatementLine]) -> Callable[[cst.CSTNode], bool]:
    """Whether a node is one of ``nodes`` (those very nodes: the copies to queue)."""
    return lambda node: any(node is n for n in nodes)


def _free_name(fn: cst.FunctionDef) -> str:
    """``field_copies``, or with underscores added until the method uses no such name."""
    used = {n.value for n in primitives.find_all(fn, m.Name()) if isinstance(n, cst.Name)}
    name = LIST
    while name in used:
        name += "_"
    return name


class _GroupReplayCopies(MethodCodemod):
    """The shared codemod; each runner's class below names its class."""

    METHOD = "replay"
    RENAMED = ("execute",)  # 0.5.14+: upstream's grouped copy lives there

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        if primitives.contains(fn, primitives.call(COPY)):
            return Finding.done(self.anchor)
        if primitives.contains(fn, primitives.call(UPSTREAM_COPY)):
            return Finding.done(self.anchor, "upstream's grouped copy (sglang #28465, 0.5.14+)")
        own = primitives.find_all(fn, OWN_GROUPED)
        if own:
            return self.vendors_own(self.anchor, "groups its buffer copies", own[0])
        plan = _plan(fn)
        if plan is None:
            return self.missing_in(
                fn, "fewer than two per-field X[...].copy_(Y) buffer copies here", "the per-field copies to group them"
            )
        if plan.clash is not None:
            node, why = plan.clash
            return self.missing_in(
                fn,
                f"a statement between the per-field copies {why}",
                "nothing between them that the grouped copy (run after the last) would reorder",
                node,
            )
        count = sum(len(found) for found in plan.copies.values())
        return Finding.todo(self.anchor, f"{count} per-field buffer copies, one memcpy each")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        plan = _plan(fn)
        assert plan is not None  # detect said TODO
        name = _free_name(fn)

        def queued(stmt: primitives.Statement) -> cst.SimpleStatementLine:
            line = cst.ensure_type(stmt, cst.SimpleStatementLine)
            dst, src = _parts(line)
            pair = cst.Tuple([cst.Element(dst), cst.Element(src)])
            append = cst.Call(func=cst.Attribute(cst.Name(name), cst.Name("append")), args=[cst.Arg(pair)])
            return line.with_changes(body=[cst.Expr(append)])

        body = primitives.block_statements(fn.body)
        region: list[primitives.Statement] = []
        for i in range(plan.start, plan.end):
            stmt, found = body[i], plan.copies.get(i, [])
            if m.matches(stmt, FIELD_COPY) and found:
                stmt = queued(stmt)
            elif found:
                stmt = primitives.replace_statements(stmt, FIELD_COPY & m.MatchIfTrue(_one_of(found)), queued)
            region.append(stmt)
        (init,) = primitives.parse_statements_with_comments(f"""
            # patchkit (sglang #28465): the fields go into the graph's buffers together, one
            # torch._foreach_copy_ per dtype pair (hidden_states keeps its copy_), not a memcpy each.
            {name} = []
        """)
        region[0], init = (
            region[0].with_changes(leading_lines=[]),
            init.with_changes(leading_lines=[*region[0].leading_lines, *init.leading_lines]),
        )
        body[plan.start : plan.end] = [init, *region, primitives.parse_statement(f"{COPY}({name})")]
        self.require_import(RUNTIME, COPY)
        return fn.with_changes(body=fn.body.with_changes(body=body))


class GroupDraftCopies(_GroupReplayCopies):
    DESCRIPTION = (
        "EAGLEDraftCudaGraphRunner.replay: the per-field buffer copies go out as one torch._foreach_copy_ "
        "per dtype pair (copy_grouped), not a cudaMemcpyAsync each; hidden_states keeps its copy_"
    )
    CLASS = "EAGLEDraftCudaGraphRunner"


class GroupDraftExtendCopies(_GroupReplayCopies):
    DESCRIPTION = (
        "EAGLEDraftExtendCudaGraphRunner.replay: the per-field buffer copies go out as one "
        "torch._foreach_copy_ per dtype pair (copy_grouped), not a cudaMemcpyAsync each; hidden_states keeps its copy_"
    )
    CLASS = "EAGLEDraftExtendCudaGraphRunner"
