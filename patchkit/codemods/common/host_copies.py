"""Host-to-device copies that do not make the host wait: the shapes the
codemods carrying them share (the penalizers' output ids, spec-v2
``prepare_for_decode``'s kv lengths; issue 53).

Two rewrites, both through the runtime's ``pin_memory_for(device)`` (pinned
on CUDA, as before elsewhere):

* a host list built straight on the device, ``torch.tensor(LIST, ...,
  device=D)`` (a blocking copy from pageable memory), becomes upstream's
  (0.5.14) ``torch.tensor(LIST, ..., pin_memory=pin_memory_for(D)).to(D,
  non_blocking=True)``;
* a copy of a host tensor, ``T.to(device=D)``, becomes ``non_blocking``, and
  ``T``'s ``torch.tensor(...)`` is pinned: without pinning the driver still
  stages pageable bytes synchronously.

And one that needs no copy at all: a list of one repeated value,
``torch.tensor([W] * n, dtype=T, device=D)`` (the list inline or through
locals), is ``torch.full((n,), W, dtype=T, device=D)``, made on the device
(``filled_on_device``; sglang 0.5.15's replay writes it so).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.primitives.values import Locals
from patchkit.codemods.common.shared import code_of
from patchkit.layout import import_path

HELPERS = import_path("runtime")
PIN = "pin_memory_for"
PINNED_TENSOR = "pinned_tensor"
TENSOR = primitives.call("torch.tensor")
TO = primitives.method_call("to")
#: ``X.pin_memory()``: a host tensor a fork pins itself before its copy (issue 69).
OWN_PIN = m.Call(func=m.Attribute(attr=m.Name("pin_memory")), args=[])


def _is_true(arg: Optional[cst.Arg]) -> bool:
    return arg is not None and m.matches(arg.value, m.Name("True"))


def _on_cpu(expr: cst.BaseExpression) -> bool:
    return m.matches(expr, m.SimpleString('"cpu"') | m.SimpleString("'cpu'"))


def built_on_device(call: cst.CSTNode) -> Optional[cst.BaseExpression]:
    """The device ``D`` of ``torch.tensor(LIST, ..., device=D)`` (not the CPU), else None."""
    if not isinstance(call, cst.Call) or not m.matches(call, TENSOR):
        return None
    device = primitives.keyword_argument(call, "device")
    return None if device is None or _on_cpu(device.value) else device.value


def is_pinned_copy(call: cst.CSTNode) -> bool:
    """``torch.tensor(..., pin_memory=...).to(..., non_blocking=True)``: ours and upstream's (0.5.14+)."""
    return (
        isinstance(call, cst.Call)
        and m.matches(call, TO)
        and _is_true(primitives.keyword_argument(call, "non_blocking"))
        and isinstance(call.func, cst.Attribute)
        and isinstance(tensor := call.func.value, cst.Call)
        and m.matches(tensor, TENSOR)
        and primitives.keyword_argument(tensor, "pin_memory") is not None
    )


def pinned_copy(call: cst.Call) -> cst.Call:
    """``torch.tensor(LIST, ..., device=D)`` -> ``torch.tensor(LIST, ...,
    pin_memory=pin_memory_for(D)).to(D, non_blocking=True)`` (the keyword
    where ``device=`` was, the call's layout kept)."""
    device = primitives.keyword_argument(call, "device")
    assert device is not None  # built_on_device found it
    pin = device.with_changes(
        keyword=cst.Name("pin_memory"), value=primitives.parse_expression(f"{PIN}({code_of(device.value)})")
    )
    host = call.with_changes(args=[pin if a is device else a for a in call.args])
    return cst.ensure_type(
        primitives.parse_expression(f"X.to({code_of(device.value)}, non_blocking=True)"), cst.Call
    ).with_changes(func=cst.Attribute(value=host, attr=cst.Name("to")))


def copy_device(call: cst.Call) -> Optional[cst.BaseExpression]:
    """The device a ``.to(...)`` copy goes to (``device=D`` or the first argument)."""
    device = primitives.keyword_argument(call, "device")
    if device is not None:
        return device.value
    first = call.args[0] if call.args else None
    return first.value if first is not None and first.keyword is None else None


def blocks(call: cst.Call) -> bool:
    """A ``.to(...)`` copy without ``non_blocking=True``."""
    return not _is_true(primitives.keyword_argument(call, "non_blocking"))


def non_blocking(call: cst.Call) -> cst.Call:
    return primitives.set_keyword_argument(call, "non_blocking", "True")


def pinned(call: cst.Call, device: cst.BaseExpression) -> cst.Call:
    """``torch.tensor(...)`` built on the host, pinned for ``device``."""
    return primitives.set_keyword_argument(call, "pin_memory", f"{PIN}({code_of(device)})")


def is_pinned(call: cst.Call) -> bool:
    return primitives.keyword_argument(call, "pin_memory") is not None


def pinned_build(build: cst.Call, device: cst.BaseExpression) -> cst.Call:
    """``torch.tensor(LIST, ...)`` / ``torch.as_tensor(LIST, ...)`` -> the runtime's
    ``pinned_tensor(LIST, ..., pin_for=D)``: pinned where ``D`` is a CUDA device, and a
    tensor (needs-cpu-seq-lens's device lengths) kept as it is, never pinned. One call for
    both (a keyword would not do: torch.as_tensor has no ``pin_memory``)."""
    return primitives.set_keyword_argument(build.with_changes(func=cst.Name(PINNED_TENSOR)), "pin_for", code_of(device))


# -- a repeated host list: no copy, a fill on the device -----------------------------------------

FULL = primitives.call("torch.full")


@dataclass(frozen=True)
class Filled:
    call: cst.Call  # ``torch.full((n,), W, dtype=T, device=D)``
    locals: tuple[str, ...]  # the locals the list was followed through, the one the call reads first


def filled_on_device(fn: cst.CSTNode, call: cst.Call, scopes: Sequence[cst.CSTNode] = ()) -> Optional[Filled]:
    """``call``, ``torch.tensor(L, dtype=T, device=D)`` with ``D`` not the CPU and
    ``L`` a list of one repeated value, ``[W] * n`` (or ``n * [W]``), as
    ``torch.full((n,), W, dtype=T, device=D)``: the same values, with no host
    list copied (from pageable memory, a copy the host waits for). ``L`` may be
    inline or a local, through a chain of locals, each assigned once in the
    innermost of ``scopes`` (nodes of ``fn``, then ``fn``) that assigns it, in a
    block that holds the use after it, never changed in place, and neither it
    nor a name ``W`` and ``n`` read rebound in between. None: not that shape
    (no ``dtype``: ``torch.tensor([])`` is a float tensor, ``torch.full`` not;
    another keyword; a list not followed)."""
    device = built_on_device(call)
    positional = [a for a in call.args if a.keyword is None]
    keywords = {a.keyword.value for a in call.args if a.keyword is not None}
    if device is None or len(positional) != 1 or keywords != {"dtype", "device"} or positional[0].star:
        return None
    found = _repeated(fn, positional[0].value, [Locals(s) for s in (*scopes, fn)])  # type: ignore[arg-type]
    if found is None:
        return None
    (value, count), chain = found
    dtype = primitives.keyword_argument(call, "dtype")
    assert dtype is not None  # in keywords
    full = primitives.parse_expression(
        f"torch.full(({code_of(count)},), {code_of(value)}, dtype={code_of(dtype.value)}, device={code_of(device)})"
    )
    return Filled(cst.ensure_type(full, cst.Call), chain)


def _repeat(node: cst.BaseExpression) -> Optional[tuple[cst.BaseExpression, cst.BaseExpression]]:
    """``[W] * n`` / ``n * [W]`` -> (W, n)."""
    if not (isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply)):
        return None
    for one, count in ((node.left, node.right), (node.right, node.left)):
        if isinstance(one, cst.List) and len(one.elements) == 1 and isinstance(one.elements[0], cst.Element):
            if not isinstance(count, cst.List):
                return one.elements[0].value, count
    return None


def _repeated(
    fn: cst.CSTNode, node: cst.BaseExpression, scopes: Sequence[Locals]
) -> Optional[tuple[tuple[cst.BaseExpression, cst.BaseExpression], tuple[str, ...]]]:
    """((W, n), the locals followed) of ``node``, a repeated list, or None."""
    links: list[tuple[cst.Name, cst.Assign]] = []  # (a use of the local, its one assignment)
    for _ in range(4):
        found = _repeat(node)
        if found is not None:
            watched = _watched(node)
            chain = tuple(use.value for use, _ in links)
            if all(_holds(fn, assign, use, watched | {use.value}) for use, assign in links):
                return found, chain
            return None
        assign = _one_assignment(node, scopes)
        if assign is None or _changed_in_place(fn, cst.ensure_type(node, cst.Name).value):
            return None
        links.append((cst.ensure_type(node, cst.Name), assign))
        node = assign.value
    return None


def _one_assignment(node: cst.BaseExpression, scopes: Sequence[Locals]) -> Optional[cst.Assign]:
    """The one plain assignment of the local ``node`` in the innermost scope that assigns it."""
    if not isinstance(node, cst.Name):
        return None
    for scope in scopes:
        defs = scope.defs.get(node.value)
        if defs:
            return defs[0] if len(defs) == 1 and isinstance(defs[0], cst.Assign) else None
    return None


def _changed_in_place(fn: cst.CSTNode, name: str) -> bool:
    """``name.append(...)`` (any method), ``name[i] = ...``, ``name += ...``, ``del name[i]``."""
    own = m.Name(name)
    return primitives.contains(
        fn,
        m.Call(func=m.Attribute(value=own))
        | m.AugAssign(target=own | m.Subscript(value=own))
        | m.AssignTarget(target=m.Subscript(value=own))
        | m.Del(target=m.Subscript(value=own)),
    )


def _holds(fn: cst.CSTNode, assign: cst.Assign, use: cst.Name, watched: set[str]) -> bool:
    """``assign``'s line is in a block whose later statement holds ``use``, and no
    statement from there to that one rebinds or sets a ``watched`` name or attribute."""
    for block in primitives.find_all_of(cst.IndentedBlock, fn, m.IndentedBlock()):
        body = list(block.body)
        start = next(
            (
                i
                for i, s in enumerate(body)
                if isinstance(s, cst.SimpleStatementLine) and any(x is assign for x in s.body)
            ),
            None,
        )
        if start is None:
            continue
        end = next((i for i, s in enumerate(body) if primitives.contains(s, primitives.is_node(use))), None)
        if end is None or end <= start:
            return False
        return not any(_sets(s) & watched for s in body[start + 1 : end + 1])
    return False


def _watched(node: cst.CSTNode) -> set[str]:
    """The names and attributes ``node`` reads, as written."""
    return {code_of(n) for n in primitives.find_all(node, m.Name() | m.Attribute())}


def _sets(stmt: cst.CSTNode) -> set[str]:
    """What the statements in ``stmt`` bind or set: names (assignments, loops, ``with ...
    as``, ``:=``), attributes and subscripted objects, as written."""
    targets: list[cst.CSTNode] = [
        node.name if isinstance(node, cst.AsName) else node.target
        for node in primitives.find_all(
            stmt, m.AssignTarget() | m.AugAssign() | m.AnnAssign() | m.For() | m.AsName() | m.NamedExpr()
        )
        if isinstance(node, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For, cst.AsName, cst.NamedExpr))
    ]
    found: set[str] = set()
    while targets:
        target = targets.pop()
        if isinstance(target, (cst.Tuple, cst.List)):
            targets.extend(e.value for e in target.elements)
        elif isinstance(target, cst.StarredElement):
            targets.append(target.value)
        elif isinstance(target, cst.Subscript):
            found |= {code_of(target), code_of(target.value)}
        else:
            found.add(code_of(target))
    return found
