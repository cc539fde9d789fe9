"""Expressions: libcst matcher replace, rewrites from a template, ``isinstance`` tuples and
call keyword arguments."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Optional

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common.primitives.matchers import (
    _isinstance_parts,
    _strip_parens,
    find_isinstance_disjunction,
    is_node,
    isinstance_subject,
    or_terms,
)
from patchkit.codemods.common.primitives.search import _N, NodeMatcher, find_all, paths_to, visit_below
from patchkit.codemods.common.primitives.snippets import AnchorError, parse_expression, parse_statement


def replace_expressions(node: _N, matcher: NodeMatcher, replacement) -> _N:
    """libcst's ``m.replace(node, matcher, replacement)``, visiting only the
    paths to the matches (``search.paths_to``): ``m.replace`` visits, and
    rebuilds, every node of ``node`` (a whole method) for a few matches.
    ``replacement(updated node, captures)`` as there: the captures of the
    match on the original node, as updated below it (a capture that was
    itself replaced is no match, as there)."""
    hits = find_all(node, matcher)
    if not hits:
        return node
    return visit_below(node, _Replacer(matcher, replacement, hits, paths_to(node, hits)))


class _Replacer(cst.CSTTransformer):
    def __init__(self, matcher, replacement, hits: list[cst.CSTNode], visit: set[int]) -> None:
        super().__init__()
        self.matcher, self.replacement = matcher, replacement
        self.hits, self.visit = {id(h) for h in hits}, visit
        self.updated: dict[int, cst.CSTNode] = {}  # id(original) -> updated, where they differ
        self.replaced: set[int] = set()

    def on_visit(self, node: cst.CSTNode) -> bool:
        return id(node) in self.visit

    def on_leave(self, original, updated):
        if updated is not original:
            self.updated[id(original)] = updated
        if id(original) not in self.hits:
            return updated
        captures = {} if isinstance(self.matcher, m.MatchIfTrue) else m.extract(original, self.matcher)
        if captures is None or any(id(c) in self.replaced for c in _captured(captures)):
            return updated
        self.replaced.add(id(original))
        return self.replacement(updated, {name: self._now(value) for name, value in captures.items()})

    def _now(self, value):
        if isinstance(value, Sequence) and not isinstance(value, cst.CSTNode):
            return tuple(self.updated.get(id(v), v) for v in value)
        return self.updated.get(id(value), value)


def replace_node(node: _N, old: cst.CSTNode, new: cst.CSTNode) -> _N:
    """``node`` with its subtree ``old`` (that very node) replaced by ``new``."""
    return visit_below(node, _Replacer(is_node(old), lambda _old, _found: new, [old], paths_to(node, [old])))


def _captured(captures: dict) -> list:
    return [v for value in captures.values() for v in (value if isinstance(value, Sequence) else (value,))]


def isinstance_class_names(node: cst.BaseExpression) -> Optional[tuple[str, list[str]]]:
    """For ``isinstance(s, A) or isinstance(s, B) ...`` (same subject, any
    parentheses) or ``isinstance(s, (A, B))``: (code of s, [code of A, B, ...]).
    None for any other shape."""
    node = _strip_parens(node)
    if isinstance(node, cst.BooleanOperation) and isinstance(node.operator, cst.Or):
        left, right = isinstance_class_names(node.left), isinstance_class_names(node.right)
        if left is None or right is None or left[0] != right[0]:
            return None
        return left[0], left[1] + right[1]
    parts = _isinstance_parts(node)
    if parts is None:
        return None
    code = cst.Module(body=[]).code_for_node
    return code(parts[0]), [code(c) for c in parts[1]]


def isinstance_tuple(node: cst.BaseExpression, add: Sequence[str] = (), after: Optional[str] = None) -> cst.Call:
    """Rewrite an ``isinstance`` check (see :func:`isinstance_class_names`) as
    one ``isinstance(s, (A, B, ...))`` call, black-formatted one class a line,
    with the ``add`` classes inserted after class ``after`` (else at the end);
    classes already listed are not repeated."""
    found = isinstance_class_names(node)
    if found is None:
        raise AnchorError("not an isinstance check (or a chain of them on one subject)")
    subject, classes = found
    index = classes.index(after) + 1 if after in classes else len(classes)
    new = [c for c in add if c not in classes]
    classes = classes[:index] + new + classes[index:]
    lines = "".join(f"        {c},\n" for c in classes)
    return cst.ensure_type(parse_expression(f"isinstance(\n    {subject},\n    (\n{lines}    ),\n)"), cst.Call)


def add_isinstance_classes(
    expr: cst.BaseExpression, subject: str, add: Sequence[str], after: Optional[str] = None
) -> cst.BaseExpression:
    """``expr`` with the ``add`` classes accepted by its isinstance disjunction
    on ``subject`` (see :func:`find_isinstance_disjunction`), wherever that sits.
    The isinstance checks of ``subject`` in it become one ``isinstance(s, (A,
    B, ...))`` tuple (see :func:`isinstance_tuple`) at the place of the first;
    other terms (plain names, calls) stay, in order."""
    found = find_isinstance_disjunction(expr, subject)
    if found is None:
        raise AnchorError(f"no isinstance check of {subject} in an `or`")
    terms = or_terms(found)
    checks = [t for t in terms if isinstance_subject(t) == subject]
    chain = checks[0]
    for check in checks[1:]:
        chain = cst.BooleanOperation(left=chain, operator=cst.Or(), right=check)
    merged = isinstance_tuple(chain, add=add, after=after)
    new: cst.BaseExpression
    if len(checks) == len(terms):
        new = merged  # the tuple alone: its own parentheses are enough
    else:
        # Black's layout of a parenthesised `or`: one term a line.
        code = cst.Module(body=[]).code_for_node
        kept = [merged if t is checks[0] else t for t in terms if not any(t is c for c in checks[1:])]
        lines = [textwrap.indent(code(t), "    ")[4:] for t in kept]
        new = parse_expression("(\n    " + "\n    or ".join(lines) + "\n)")
    return replace_node(expr, found, new)


def keyword_argument(call: cst.Call, name: str) -> Optional[cst.Arg]:
    """The argument ``name=...`` of ``call``, or None."""
    return next((a for a in call.args if a.keyword is not None and a.keyword.value == name), None)


def set_keyword_argument(call: cst.Call, name: str, value_source: str) -> cst.Call:
    """``call`` with ``name=<value_source>``: the value replaced when the keyword
    is there, else appended in the call's own layout (one a line with a
    trailing comma stays so; a one-line call stays one line)."""
    value = parse_expression(value_source)
    args = list(call.args)
    for i, arg in enumerate(args):
        if arg.keyword is not None and arg.keyword.value == name:
            args[i] = arg.with_changes(value=value)
            return call.with_changes(args=args)
    new = cst.Arg(
        keyword=cst.Name(name),
        value=value,
        equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
    )
    if not args:
        return call.with_changes(args=[new])
    last = args[-1]
    if isinstance(last.comma, cst.Comma):  # trailing comma: the new arg takes it
        between: Optional[cst.Comma]
        if len(args) >= 2 and isinstance(args[-2].comma, cst.Comma):
            between = args[-2].comma
        else:
            between = cst.Comma(whitespace_after=call.whitespace_before_args)
        args[-1] = last.with_changes(comma=between)
        args.append(new.with_changes(comma=last.comma))
    else:
        between = args[-2].comma if len(args) >= 2 and isinstance(args[-2].comma, cst.Comma) else None
        # The space before ``)`` (a line break in a wrapped call) stays before ``)``: the new arg takes it.
        args[-1] = last.with_changes(
            comma=between or cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")),
            whitespace_after_arg=cst.SimpleWhitespace(""),
        )
        args.append(new.with_changes(whitespace_after_arg=last.whitespace_after_arg))
    return call.with_changes(args=args)


class _TemplateFiller(cst.CSTTransformer):
    """Puts ``nodes[NAME]`` wherever the bare name NAME occurs; attribute
    names (``x.NAME``) and keyword names (``f(NAME=...)``) are left alone."""

    def __init__(self, nodes: dict[str, cst.CSTNode]) -> None:
        super().__init__()
        self.nodes = nodes

    def leave_Name(self, original: cst.Name, updated: cst.Name):
        return self.nodes.get(updated.value, updated)

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.Attribute:
        return updated.with_changes(attr=original.attr)

    def leave_Arg(self, original: cst.Arg, updated: cst.Arg) -> cst.Arg:
        return updated.with_changes(keyword=original.keyword)


def fill_template(template: str, nodes: dict[str, cst.CSTNode]) -> cst.CSTNode:
    """Parse ``template`` -- an expression, or else one small statement such as
    ``T = f(T, V)`` -- and replace each bare name that is a key of ``nodes``
    with that node (use UPPERCASE keys so they cannot clash with real names)."""
    try:
        parsed: cst.CSTNode = parse_expression(template)
    except cst.ParserSyntaxError:
        stmt = parse_statement(template)
        if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
            raise ValueError(f"template is neither an expression nor one small statement: {template!r}") from None
        parsed = stmt.body[0]
    return visit_below(parsed, _TemplateFiller(dict(nodes)))


class _TemplateRewriter(cst.CSTTransformer):
    def __init__(self, matcher, template, within, nodes, visit: set[int]) -> None:
        super().__init__()
        self.matcher, self.template, self.within, self.nodes = matcher, template, within, nodes
        self.inside = 0 if within is not None else 1
        self.count = 0
        self.visit = visit  # only subtrees holding a match (see search.paths_to)

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.within is not None and m.matches(node, self.within):
            self.inside += 1
        return id(node) in self.visit

    def on_leave(self, original, updated):
        result = updated
        if self.inside > 0:
            captures = m.extract(updated, self.matcher)
            if captures is not None:
                self.count += 1
                nodes = dict(self.nodes)
                for name, node in captures.items():
                    if not isinstance(node, cst.CSTNode):  # a capture of a sequence (m.ZeroOrMore)
                        raise ValueError(f"template name {name!r} captured a sequence of nodes, not one node")
                    nodes[name] = node
                result = fill_template(self.template, nodes)
                if isinstance(updated, cst.BaseExpression) and isinstance(result, cst.BaseExpression):
                    # Parentheses around the rewritten expression stay.
                    result = result.with_changes(lpar=updated.lpar, rpar=updated.rpar)
        if self.within is not None and m.matches(original, self.within):
            self.inside -= 1
        return result


def rewrite_expressions(
    node: _N,
    matcher: m.BaseMatcherNode,
    template: str,
    *,
    within: Optional[m.BaseMatcherNode] = None,
    **nodes: cst.CSTNode | Sequence[cst.CSTNode],
) -> _N:
    """Rewrite every expression (or small statement) under ``node`` that
    matches ``matcher`` as ``template`` (see :func:`fill_template`), filled with
    the matcher's ``m.SaveMatchedNode`` captures and the extra ``nodes``.

    ``within`` limits the rewrite to the inside of nodes matching it (e.g. only
    the argument of one call). Example: ``X.seq_lens_sum + N`` ->
    ``add_or_none(X.seq_lens_sum, N)`` with
    ``m.BinaryOperation(left=m.SaveMatchedNode(m.Attribute(...), "X"), operator=m.Add(), right=m.SaveMatchedNode(m.DoNotCare(), "N"))``
    and template ``"add_or_none(X, N)"``. Raises AnchorError when nothing matched.
    """
    rewriter = _TemplateRewriter(matcher, template, within, nodes, paths_to(node, find_all(node, matcher)))
    result = visit_below(node, rewriter)
    if rewriter.count == 0:
        raise AnchorError(f"no expression matching {matcher!r}")
    return result
