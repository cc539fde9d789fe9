"""A value by meaning, not by spelling: what codemods that anchor on a value
(lengths, widths, sums, bounds) use to recognise it however a vendor wrote it.

Equivalent spellings of one value:

- parentheses: ``(a + b)``;
- casts: ``x.to(torch.int32)``, ``x.to(device)``, ``x.int()``, ``x.long()``,
  ``x.type(...)``, ``x.contiguous()``, ``int(x)``, ``torch.as_tensor(x, ...)``;
- slices of the batch: ``x[:bs]`` (a prefix, the batch's rows; kept apart, as
  ``Peeled.bound``, so a rewrite can slice its own value the same way);
- a temporary variable: a local assigned once in the method (``Locals``);
- operand order: ``a + b`` and ``b + a``, and ``torch.add(a, b)``.

``peel`` takes the spelling off one expression; ``sum_of`` finds a sum of two
values, each matched by a libcst matcher, in any of these spellings.

Where a codemod's anchor is a matcher whose captures (``save``) its rewrite
fills in, ``spelled`` is the same value as a matcher (casts, parentheses and,
unless told not to, a batch slice around it; captures inside still extract),
``added`` the value plus another term in either order (captures ``LEFT``:
the value, ``RIGHT``: the other), and ``host_scalar`` a reduction read to the host (``x.max().item()``,
``int(x.max())``, ``torch.max(x).item()`` ...) of such a value: the mirror
reads, sums and widths the shared codemods anchor on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common.primitives.matchers import ANY, Expr, attr, call, dotted, save
from patchkit.codemods.common.primitives.search import find_all

CASTS = "to|int|long|type|contiguous"
_CAST_CALL = m.Call(func=attr(CASTS))
_CAST_FUNCTION = m.Call(func=m.Name("int") | dotted("torch.as_tensor"), args=[m.Arg(keyword=None), m.ZeroOrMore()])
# ``x[:n]``: one prefix slice (no start, no step), what a batch's rows are cut to.
BATCH_SLICE = m.Subscript(slice=[m.SubscriptElement(slice=m.Slice(lower=None, upper=m.DoNotCare(), step=None))])


class Locals:
    """The assignments of one function, by the local name they bind (the
    temporary variables a value may be computed in)."""

    def __init__(self, fn: cst.FunctionDef) -> None:
        self.fn = fn
        self.defs: dict[str, list[cst.Assign | cst.AnnAssign]] = {}
        for assign in find_all(
            fn, m.Assign(targets=[m.AssignTarget(target=m.Name())]) | m.AnnAssign(target=m.Name(), value=m.DoNotCare())
        ):
            if not isinstance(assign, (cst.Assign, cst.AnnAssign)):  # what the matcher finds
                continue
            target = assign.targets[0].target if isinstance(assign, cst.Assign) else assign.target
            if assign.value is not None and isinstance(target, cst.Name):
                self.defs.setdefault(target.value, []).append(assign)

    def values(self, node: cst.BaseExpression, depth: int = 0) -> list[cst.BaseExpression]:
        """The expressions ``node`` stands for: itself, or every value a local it names is assigned."""
        if isinstance(node, cst.Name) and node.value in self.defs and depth < 4:
            return [v for d in self.defs[node.value] if d.value is not None for v in self.values(d.value, depth + 1)]
        return [node]

    def one(self, node: cst.BaseExpression) -> cst.BaseExpression:
        """``node`` through locals assigned once, and casts."""
        for _ in range(5):
            node = strip_casts(node)
            values = self.values(node) if isinstance(node, cst.Name) else [node]
            if len(values) != 1 or values[0] is node:
                return node
            node = values[0]
        return node


def strip_casts(node: cst.BaseExpression) -> cst.BaseExpression:
    """``X.to(...)`` / ``X.int()`` / ``int(X)`` / ``torch.as_tensor(X, ...)`` -> X
    (the value, not its dtype or device); parentheses need nothing (a matcher
    that names none ignores them)."""
    while True:
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and m.matches(node, _CAST_CALL):
            node = node.func.value
        elif isinstance(node, cst.Call) and m.matches(node, _CAST_FUNCTION):
            node = node.args[0].value
        else:
            return node


@dataclass(frozen=True)
class Peeled:
    value: cst.BaseExpression  # the value without its spelling
    bound: Optional[cst.BaseExpression] = None  # ``n`` of a batch slice ``[:n]`` taken off, if any


def peel(node: cst.BaseExpression, local: Optional[Locals] = None) -> Peeled:
    """``node`` without parentheses, casts, a batch slice ``[:n]`` and (with
    ``local``) the temporary variables it was computed in."""
    bound = None
    for _ in range(8):
        before = node
        node = strip_casts(node) if local is None else local.one(node)
        if bound is None and isinstance(node, cst.Subscript) and m.matches(node, BATCH_SLICE):
            prefix = node.slice[0].slice
            if isinstance(prefix, cst.Slice):  # what BATCH_SLICE matches
                bound, node = prefix.upper, node.value
        if node is before:
            break
    if getattr(node, "lpar", None):
        node = node.with_changes(lpar=[], rpar=[])  # a copy: what was matched, not where it is
    return Peeled(node, bound)


def operands(node: cst.BaseExpression) -> Optional[tuple[cst.BaseExpression, cst.BaseExpression]]:
    """The two terms of ``a + b`` or ``torch.add(a, b)``; None for anything else."""
    if isinstance(node, cst.BinaryOperation) and m.matches(node, m.BinaryOperation(operator=m.Add())):
        return node.left, node.right
    if isinstance(node, cst.Call) and m.matches(
        node, m.Call(func=call("torch.add").func, args=[m.Arg(keyword=None), m.Arg(keyword=None)])
    ):
        return node.args[0].value, node.args[1].value
    return None


@dataclass(frozen=True)
class Sum:
    first: cst.BaseExpression  # matched by ``first``, its spelling peeled
    second: cst.BaseExpression  # the second term as written: what a rewrite repeats
    bound: Optional[cst.BaseExpression] = None  # a batch slice ``[:n]`` on the sum or its first term


def sum_of(
    node: cst.BaseExpression, first: m.BaseMatcherNode, second: m.BaseMatcherNode, local: Optional[Locals] = None
) -> Optional[Sum]:
    """``node`` as ``<first> + <second>`` in any spelling (parentheses, casts,
    batch slices, temporaries, either order, ``torch.add``), or None."""
    outer = peel(node, local)
    terms = operands(outer.value)
    if terms is None:
        return None
    for a, b in (terms, terms[::-1]):
        lhs = peel(a, local)
        if m.matches(lhs.value, first) and m.matches(peel(b, local).value, second):
            return Sum(lhs.value, b, outer.bound if outer.bound is not None else lhs.bound)
    return None


# -- a value as a matcher (captures kept) -------------------------------------------------


def _cast_of(value: Expr) -> Expr:
    """``value`` under one cast: ``.to(...)``, ``.int()`` ..., ``int(value)``, ``torch.as_tensor(value, ...)``."""
    return m.Call(func=attr(CASTS, value)) | m.Call(
        func=m.Name("int") | dotted("torch.as_tensor"), args=[m.Arg(value=value, keyword=None), m.ZeroOrMore()]
    )


def _slice_of(value: Expr) -> m.Subscript:
    """``value[:n]``: the batch's rows of it."""
    return m.Subscript(
        value=value, slice=[m.SubscriptElement(slice=m.Slice(lower=None, upper=m.DoNotCare(), step=None))]
    )


def spelled(value: Expr, slices: bool = True, depth: int = 2) -> Expr:
    """``value`` in the spellings vendors use, as one matcher: itself, under
    casts and (``slices``) a batch slice ``[:n]``, up to ``depth`` of them
    nested; parentheses need nothing (a matcher naming none ignores them).
    Captures (``save``) inside ``value`` extract as from ``value`` itself.
    Temporary variables need the method: ``peel`` with ``Locals``."""
    matcher = value
    for _ in range(depth):
        # libcst types ``|`` on node matchers only, not on the field union Expr (ANY, metadata matchers), never given here.
        matcher = value | _cast_of(matcher) | _slice_of(matcher) if slices else value | _cast_of(matcher)  # type: ignore[operator, assignment]
    return matcher


def host_scalar(reduction: str, receiver: Expr, slices: bool = True) -> m.OneOf[m.BaseExpressionMatchType]:
    """A reduction of ``receiver`` read to the host as a Python number, however
    spelled: ``<r>.<reduction>().item()``, ``int(<r>.<reduction>())``,
    ``torch.<reduction>(<r>).item()``, ``int(torch.<reduction>(<r>))``; ``<r>``
    itself in any spelling of ``spelled`` (a cast, a batch slice with ``slices``)."""
    value = spelled(receiver, slices=slices)
    reduced = m.Call(func=attr(reduction, value), args=[]) | m.Call(
        func=dotted(f"torch.{reduction}"), args=[m.Arg(value, keyword=None)]
    )
    # As in spelled: libcst types ``|`` on node matchers only; and OneOf flattens the
    # OneOf _cast_of gives (at run time), so this is one OneOf of Call matchers.
    return m.Call(func=attr("item", spelled(reduced, slices=False, depth=1)), args=[]) | _cast_of(reduced)  # type: ignore[operator, return-value]


def added(value: Expr) -> m.OneOf[Union[m.BinaryOperation, m.Call]]:
    """``<value> + X`` in any operand order: ``X + <value>``, ``torch.add`` either
    way round. Captures ``LEFT`` (the value) and ``RIGHT`` (the other term),
    so a rewrite such as ``add_or_none(LEFT, RIGHT)`` reads the same however
    the vendor ordered the sum."""
    mine, other = save(value, "LEFT"), save(ANY, "RIGHT")
    torch_add = dotted("torch.add")
    return (
        m.BinaryOperation(left=mine, operator=m.Add(), right=other)
        | m.BinaryOperation(left=other, operator=m.Add(), right=mine)
        | m.Call(func=torch_add, args=[m.Arg(mine, keyword=None), m.Arg(other, keyword=None)])
        | m.Call(func=torch_add, args=[m.Arg(other, keyword=None), m.Arg(mine, keyword=None)])
    )
