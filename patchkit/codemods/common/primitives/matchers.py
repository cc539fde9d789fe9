"""What codemods look for: libcst matchers for attributes, calls, assignments and
None tests, the ``isinstance`` disjunction finder, and the None-guard test
(is a read only reached when its value is not None?).

Every codemod builds its anchors from these, so a fork's other spelling of the
same thing (another receiver, extra parentheses, the test the other way round,
an early ``return``) is handled once, here, for all of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Optional, TypeVar, Union

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common.primitives.search import _children, find_all

ANY = m.DoNotCare()
_M = TypeVar("_M")
_N = TypeVar("_N", bound=cst.CSTNode)
# What a libcst matcher field for a node of kind ``_M`` takes (a node matcher,
# MatchIfTrue, OneOf / AllOf of them, ANY): libcst spells this union out on
# each field and exports no name for it.
Field = Union[_M, m.DoNotCareSentinel, m.OneOf[_M], m.AllOf[_M]]
Expr = Field[m.BaseExpressionMatchType]
# An item of a sequence field (``args=[...]``): also ``m.ZeroOrMore()`` and the like.
Item = Union[Field[_M], m.AtLeastN[Field[_M]], m.AtMostN[Field[_M]]]


def save(matcher: _M, key: str) -> _M:
    return m.SaveMatchedNode(matcher, key)


def names(spec: str) -> Union[m.Name, m.OneOf[m.Name]]:
    """``m.Name`` for ``a`` or, with ``a|b``, for either."""
    parts = [m.Name(n) for n in spec.split("|")]
    one: Union[m.Name, m.OneOf[m.Name]] = parts[0]
    for other in parts[1:]:
        one = one | other
    return one


def attr(name: str, receiver: Expr = ANY) -> m.Attribute:
    """``<receiver>.<name>``; ``name`` may be ``a|b`` for either."""
    return m.Attribute(value=receiver, attr=names(name))


def mode_branch(fn: cst.CSTNode, mode: str) -> Optional[cst.If]:
    """The first ``if``/``elif`` under ``fn`` testing ``<...>forward_mode.<mode>()``."""
    test = m.Call(func=m.Attribute(value=attr("forward_mode") | m.Name("forward_mode"), attr=m.Name(mode)))
    found = [hit for hit in find_all(fn, m.If(test=test)) if isinstance(hit, cst.If)]
    return found[0] if found else None


def dotted(path: str) -> Union[m.Name, m.Attribute]:
    """``a.b.c`` as a Name / Attribute matcher."""
    parts = path.split(".")
    matcher: Union[m.Name, m.Attribute] = m.Name(parts[0])
    for part in parts[1:]:
        matcher = m.Attribute(value=matcher, attr=m.Name(part))
    return matcher


def call(func: str, *args: Item[m.ArgMatchType]) -> m.Call:
    """``func(args...)`` (``func`` dotted, e.g. ``torch.cat``); without args: any arguments."""
    if not args:
        return m.Call(func=dotted(func))
    return m.Call(func=dotted(func), args=list(args))


def method_call(name: str, receiver: Expr = ANY) -> m.Call:
    """``<receiver>.<name>(...)``, any arguments (``name`` may be ``a|b``)."""
    return m.Call(func=attr(name, receiver))


def super_call(name: str) -> m.Call:
    """``super().<name>(...)``: handing over to the parent's method."""
    return method_call(name, m.Call(func=m.Name("super")))


def plus(left: Expr) -> m.BinaryOperation:
    """``LEFT + RIGHT`` where the left operand matches ``left``."""
    return m.BinaryOperation(left=save(left, "LEFT"), operator=m.Add(), right=save(ANY, "RIGHT"))


def assigns_attr(name: str, value: Expr = ANY, receiver: Expr = ANY) -> m.Assign:
    """``<receiver>.<name> = <value>``, as a small statement."""
    return m.Assign(targets=[m.AssignTarget(target=attr(name, receiver))], value=value)


def assigns_name(name: str) -> m.Assign:
    """``<name> = ...`` (a local variable)."""
    return m.Assign(targets=[m.AssignTarget(target=names(name))])


def line(small: Field[m.BaseSmallStatementMatchType]) -> m.SimpleStatementLine:
    """A statement line holding just ``small``."""
    return m.SimpleStatementLine(body=[small])


def is_node(node: _N) -> m.MatchIfTrue[_N]:
    """Matches that very node (to edit a node found by a search)."""
    return m.MatchIfTrue(lambda candidate: candidate is node)


# -- None tests -----------------------------------------------------------------------------


def none_comparison(target: Expr = ANY) -> m.Comparison:
    """``<target> is None`` / ``<target> is not None``."""
    return m.Comparison(
        left=target,
        comparisons=[m.ComparisonTarget(operator=m.Is() | m.IsNot(), comparator=m.Name("None"))],
    )


def none_test(target: Expr) -> m.If:
    """``if <target> is None`` / ``is not None`` (alone or within and/or)."""
    comparison = none_comparison(target)
    return m.If(test=comparison | m.BooleanOperation(left=comparison) | m.BooleanOperation(right=comparison))


# -- isinstance checks -------------------------------------------------------------------------

_code = cst.Module(body=[]).code_for_node


def _strip_parens(node: cst.BaseExpression) -> cst.BaseExpression:
    return node.with_changes(lpar=[], rpar=[]) if getattr(node, "lpar", None) else node


def _isinstance_parts(node: cst.BaseExpression) -> Optional[tuple[cst.BaseExpression, list[cst.BaseExpression]]]:
    """(subject, classes) of ``isinstance(s, C)`` / ``isinstance(s, (C, D))``."""
    if not isinstance(node, cst.Call) or not m.matches(
        node, m.Call(func=m.Name("isinstance"), args=[m.Arg(keyword=None), m.Arg(keyword=None)])
    ):
        return None
    subject, classes = node.args[0].value, node.args[1].value
    if isinstance(classes, cst.Tuple):
        return subject, [e.value for e in classes.elements if not isinstance(e, cst.StarredElement)]
    return subject, [classes]


def isinstance_subject(node: cst.CSTNode) -> Optional[str]:
    """Code of ``s`` for ``isinstance(s, C)`` / ``isinstance(s, (C, D))``, else None."""
    parts = _isinstance_parts(_strip_parens(node)) if isinstance(node, cst.BaseExpression) else None
    return _code(parts[0]) if parts else None


def or_terms(node: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The operands of an ``or`` chain, however it is parenthesised."""
    if isinstance(node, cst.BooleanOperation) and isinstance(node.operator, cst.Or):
        return or_terms(node.left) + or_terms(node.right)
    return [node]


def find_isinstance_disjunction(expr: cst.BaseExpression, subject: str) -> Optional[cst.BaseExpression]:
    """The ``or`` (or the lone term) under ``expr`` whose terms include an
    ``isinstance(<subject>, ...)`` check: wherever it sits in nested and/or and
    parentheses, beside plain names and calls. The widest such ``or`` wins
    (``a or (isinstance(s, A) or isinstance(s, B))`` gives the outer one)."""
    for node in find_all(expr, m.BooleanOperation(operator=m.Or()) | m.Call(func=m.Name("isinstance"))):
        if not isinstance(node, cst.BaseExpression):  # the matcher finds only BooleanOperation / Call
            continue
        if any(isinstance_subject(term) == subject for term in or_terms(node)):
            return node
    return None


# -- None guards -------------------------------------------------------------------------------

_EXITS = (cst.Return, cst.Continue, cst.Raise, cst.Break)


class NoneGuards:
    """Answers "is this read only reached when the value is not None?" inside
    one function, for reads of attributes (or locals) named in ``names``.

    A read counts as guarded when it is, relative to a None test of a
    same-named attribute or local:

    * inside ``if x is not None:`` (also ``... and x is not None``), or in the
      ``else`` of ``if x is None:``;
    * after ``if x is None: return`` (``continue``, ``break``, ``raise``) in an
      enclosing block;
    * the right of ``x is not None and <read>`` / ``x is None or <read>``;
    * a branch of ``<read> if x is not None else ...`` (or the other way round);
    * the None test itself.

    The receiver is not compared: forks test ``batch.seq_lens_cpu`` and read
    ``self.seq_lens_cpu`` of the same object under another name."""

    def __init__(self, fn: cst.CSTNode, names: Iterable[str]) -> None:
        self.names = set(names)
        self.parents = _parents(fn)

    def _tests(self, test: cst.BaseExpression) -> Optional[bool]:
        """True: ``test`` holds only when a named value is not None
        (``x is not None``, alone or in an ``and``); False: only when it is
        None (``x is None``, alone or in an ``or``); None: neither."""
        test = _strip_parens(test)
        if isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and self._named(test.left):
            target = test.comparisons[0]
            if m.matches(target.comparator, m.Name("None")):
                if isinstance(target.operator, cst.IsNot):
                    return True
                if isinstance(target.operator, cst.Is):
                    return False
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            inner = self._tests(test.expression)
            return None if inner is None else not inner
        if isinstance(test, cst.BooleanOperation):
            left, right = self._tests(test.left), self._tests(test.right)
            if isinstance(test.operator, cst.And) and True in (left, right):
                return True
            if isinstance(test.operator, cst.Or) and False in (left, right):
                return False
        return None

    def _named(self, node: cst.BaseExpression) -> bool:
        node = _strip_parens(node)
        if isinstance(node, cst.Attribute):
            return node.attr.value in self.names
        return isinstance(node, cst.Name) and node.value in self.names

    def guarded(self, read: cst.CSTNode) -> bool:
        child, parent = read, self.parents.get(id(read))
        while parent is not None:
            if self._guards(parent, child):
                return True
            child, parent = parent, self.parents.get(id(parent))
        return False

    def _guards(self, parent: cst.CSTNode, child: cst.CSTNode) -> bool:
        if isinstance(parent, cst.Comparison) and child is parent.left and self._tests(parent) is not None:
            return True  # the None test itself
        if isinstance(parent, cst.If):
            if child is parent.body:
                return self._tests(parent.test) is True
            if child is parent.orelse:
                return self._tests(parent.test) is False
        if isinstance(parent, cst.Else):
            owner = self.parents.get(id(parent))
            return isinstance(owner, cst.If) and self._tests(owner.test) is False
        if isinstance(parent, cst.IfExp):
            if child is parent.body:
                return self._tests(parent.test) is True
            if child is parent.orelse:
                return self._tests(parent.test) is False
        if isinstance(parent, cst.BooleanOperation) and child is parent.right:
            wanted = True if isinstance(parent.operator, cst.And) else False
            return self._tests(parent.left) is wanted
        if isinstance(parent, (cst.IndentedBlock, cst.Module)):
            return any(self._exits_when_none(stmt) for stmt in _before(parent.body, child))
        return False

    def _exits_when_none(self, stmt: cst.CSTNode) -> bool:
        """``if x is None: ... return`` (or continue / break / raise)."""
        if not isinstance(stmt, cst.If) or self._tests(stmt.test) is not False:
            return False
        last = stmt.body.body[-1] if isinstance(stmt.body, cst.IndentedBlock) else stmt.body
        if isinstance(last, cst.SimpleStatementLine):
            return isinstance(last.body[-1], _EXITS)
        if isinstance(last, cst.SimpleStatementSuite):
            return isinstance(last.body[-1], _EXITS)
        return False


# id(fn) -> (fn, {id(node): its parent}): a method's guards are asked about
# again and again (each guard, detect and transform); nodes are immutable and
# the entry holds fn, so the map stays valid.
_PARENTS: dict[int, tuple] = {}


def _parents(fn: cst.CSTNode) -> dict[int, cst.CSTNode]:
    hit = _PARENTS.get(id(fn))
    if hit is not None and hit[0] is fn:
        return hit[1]
    parents: dict[int, cst.CSTNode] = {}
    stack = [fn]
    while stack:
        node = stack.pop()
        for child in _children(node):
            parents[id(child)] = node
            stack.append(child)
    if len(_PARENTS) > 64:
        _PARENTS.clear()
    _PARENTS[id(fn)] = (fn, parents)
    return parents


def _before(body: Sequence[_N], child: cst.CSTNode) -> list[_N]:
    out: list[_N] = []
    for stmt in body:
        if stmt is child:
            return out
        out.append(stmt)
    return []


def unguarded(fn: cst.CSTNode, reads: list[cst.CSTNode], names: Iterable[str]) -> list[cst.CSTNode]:
    """``reads`` (nodes under ``fn``) not under a None guard of a value named
    in ``names`` (see :class:`NoneGuards`)."""
    if not reads:
        return []
    guards = NoneGuards(fn, names)
    return [r for r in reads if not guards.guarded(r)]
