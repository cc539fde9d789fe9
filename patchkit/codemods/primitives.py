"""Reusable edit primitives: the only place patchkit navigates or edits a CST.

They navigate by name (module -> class -> method -> statement) instead of
visiting the whole module, because a full libcst visit of a 3k-line file costs
about as much as parsing it, and a patch touches a handful of nodes. Inside a
method, where code is small, they use libcst matchers.

Every per-patch codemod is written with these; none re-implements them.
"""

from __future__ import annotations

import dataclasses
import textwrap
from collections import OrderedDict
from typing import Callable, Iterator, Optional, Sequence, Union

import libcst as cst
import libcst.matchers as m
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor

Statement = cst.BaseStatement
ClassEdit = Callable[[cst.ClassDef], cst.ClassDef]
FunctionEdit = Callable[[cst.FunctionDef], cst.FunctionDef]


class AnchorError(Exception):
    """An anchor a transform relies on is not there (detect should have said so)."""


# --- parsing snippets -------------------------------------------------------


def parse_statements(source: str) -> list[Statement]:
    """Parse a (possibly indented) snippet into top-level statements."""
    return list(cst.parse_module(textwrap.dedent(source).strip("\n") + "\n").body)


def parse_statement(source: str) -> Statement:
    (stmt,) = parse_statements(source)
    return stmt


def parse_expression(source: str) -> cst.BaseExpression:
    return cst.parse_expression(textwrap.dedent(source).strip())


# --- classes ----------------------------------------------------------------


def _find_named(statements: Sequence[Statement], kind: type, name: str) -> Optional[int]:
    """Index of the ``class``/``def`` called ``name`` among ``statements``."""
    for i, stmt in enumerate(statements):
        if isinstance(stmt, kind) and stmt.name.value == name:
            return i
    return None


def _replace_named(module: cst.Module, kind: type, name: str, edit, what: str) -> cst.Module:
    body = list(module.body)
    index = _find_named(body, kind, name)
    if index is None:
        raise AnchorError(f"{what} {name}")
    body[index] = edit(body[index])
    return module.with_changes(body=body)


def find_class(module: cst.Module, name: str) -> Optional[cst.ClassDef]:
    index = _find_named(module.body, cst.ClassDef, name)
    return None if index is None else module.body[index]


def replace_class(module: cst.Module, name: str, edit: ClassEdit) -> cst.Module:
    return _replace_named(module, cst.ClassDef, name, edit, "class")


def class_body(cls: cst.ClassDef) -> Sequence[Statement]:
    body = cls.body
    return body.body if isinstance(body, cst.IndentedBlock) else ()


def _with_class_body(cls: cst.ClassDef, statements: Sequence[Statement]) -> cst.ClassDef:
    return cls.with_changes(body=cls.body.with_changes(body=list(statements)))


def base_names(cls: cst.ClassDef) -> list[str]:
    """Names of the bases as written (``Base`` or ``mod.Base`` -> ``Base``)."""
    names = []
    for arg in cls.bases:
        value = arg.value
        if m.matches(value, m.Attribute()):
            names.append(value.attr.value)
        elif m.matches(value, m.Name()):
            names.append(value.value)
    return names


# --- methods ----------------------------------------------------------------


def methods(cls: cst.ClassDef) -> Iterator[cst.FunctionDef]:
    for stmt in class_body(cls):
        if isinstance(stmt, cst.FunctionDef):
            yield stmt


def find_method(cls: cst.ClassDef, name: str) -> Optional[cst.FunctionDef]:
    return next((f for f in methods(cls) if f.name.value == name), None)


def find_first_method(cls: cst.ClassDef, names: Sequence[str]) -> Optional[cst.FunctionDef]:
    """The first of several alternative names (a method renamed across releases)."""
    for name in names:
        found = find_method(cls, name)
        if found is not None:
            return found
    return None


def replace_method(cls: cst.ClassDef, name: str, edit: FunctionEdit) -> cst.ClassDef:
    body = list(class_body(cls))
    index = _find_named(body, cst.FunctionDef, name)
    if index is None:
        raise AnchorError(f"{cls.name.value}.{name}")
    body[index] = edit(body[index])
    return _with_class_body(cls, body)


def add_method(cls: cst.ClassDef, source: str, after: Optional[str] = None) -> cst.ClassDef:
    """Add a method (given as source) after method ``after``, else at the end."""
    new = parse_statement(source)
    new = new.with_changes(leading_lines=[cst.EmptyLine(indent=False)])
    body = list(class_body(cls))
    index = len(body)
    if after is not None:
        for i, stmt in enumerate(body):
            if isinstance(stmt, cst.FunctionDef) and stmt.name.value == after:
                index = i + 1
    body.insert(index, new)
    return _with_class_body(cls, body)


# --- class attributes -------------------------------------------------------


def _assigned_name(stmt: Statement) -> Optional[str]:
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    small = stmt.body[0]
    if m.matches(small, m.Assign(targets=[m.AssignTarget(target=m.Name())])):
        return small.targets[0].target.value
    if m.matches(small, m.AnnAssign(target=m.Name())):
        return small.target.value
    return None


def find_class_attribute(cls: cst.ClassDef, name: str) -> Optional[cst.BaseSmallStatement]:
    """``name = ...`` or ``name: T = ...`` directly in the class body."""
    for stmt in class_body(cls):
        if _assigned_name(stmt) == name:
            return stmt.body[0]
    return None


def _docstring_count(body: Sequence[Statement]) -> int:
    docstring = m.SimpleStatementLine(body=[m.Expr(value=m.SimpleString() | m.ConcatenatedString())])
    return 1 if body and m.matches(body[0], docstring) else 0


def add_class_attribute(cls: cst.ClassDef, source: str) -> cst.ClassDef:
    """Add ``source`` (e.g. ``flag: bool = False``) at the top of the class body,
    after the docstring, so it reads as part of the class's declaration."""
    body = list(class_body(cls))
    index = _docstring_count(body)
    body.insert(index, parse_statement(source))
    return _with_class_body(cls, body)


# --- inside a function ------------------------------------------------------


def insert_at_start(fn: cst.FunctionDef, source: str) -> cst.FunctionDef:
    """Insert statements at the start of a function body, after its docstring."""
    body = list(fn.body.body)
    index = _docstring_count(body)
    body[index:index] = parse_statements(source)
    return fn.with_changes(body=fn.body.with_changes(body=body))


def contains(node: cst.CSTNode, matcher: m.BaseMatcherNode) -> bool:
    return bool(find_all(node, matcher))


StatementEdit = Callable[[cst.BaseStatement], Union[cst.BaseStatement, cst.FlattenSentinel, cst.RemovalSentinel]]


class _StatementReplacer(cst.CSTTransformer):
    def __init__(self, matcher: m.BaseMatcherNode, edit: StatementEdit) -> None:
        super().__init__()
        self.matcher = matcher
        self.edit = edit
        self.count = 0

    def leave_SimpleStatementLine(self, original, updated):
        if m.matches(original, self.matcher):
            self.count += 1
            return self.edit(updated)
        return updated

    def leave_If(self, original, updated):
        if m.matches(original, self.matcher):
            self.count += 1
            return self.edit(updated)
        return updated


def replace_statements(node: cst.CSTNode, matcher: m.BaseMatcherNode, edit: StatementEdit) -> cst.CSTNode:
    """Replace every simple statement line (or ``if``) under ``node`` that matches."""
    replacer = _StatementReplacer(matcher, edit)
    result = node.visit(replacer)
    if replacer.count == 0:
        raise AnchorError(f"no statement matching {matcher!r}")
    return result


def guard_statement(stmt: cst.BaseStatement, condition: str) -> cst.If:
    """Wrap a statement in ``if <condition>:``, keeping its leading comments
    above the ``if``."""
    inner = stmt.with_changes(leading_lines=[])
    return cst.If(
        test=parse_expression(condition),
        body=cst.IndentedBlock(body=[inner]),
        leading_lines=stmt.leading_lines,
    )


def replace_expressions(node: cst.CSTNode, matcher: m.BaseMatcherNode, replacement) -> cst.CSTNode:
    """libcst's own matcher replace, re-exported so codemods use one spelling."""
    return m.replace(node, matcher, replacement)


# --- imports ----------------------------------------------------------------


def add_needed_imports(module: cst.Module, context: CodemodContext) -> cst.Module:
    """Run libcst's AddImportsVisitor on the module's import header only.

    Visiting a whole 3k-line module costs as much as parsing it, and new imports
    belong among the existing ones, so the visitor only sees the block of
    imports that starts at the first ordinary import. Starting after
    ``from __future__`` imports also keeps a module string that follows them
    (sglang has such files) above the new import, where a reader expects it.
    """
    if not context.scratch.get(AddImportsVisitor.CONTEXT_KEY):
        return module
    body = list(module.body)
    is_import = m.SimpleStatementLine(body=[m.ZeroOrMore(), m.Import() | m.ImportFrom(), m.ZeroOrMore()])
    future = m.SimpleStatementLine(body=[m.ImportFrom(module=m.Name("__future__"))])
    imports = [i for i, s in enumerate(body) if m.matches(s, is_import)]
    ordinary = [i for i in imports if not m.matches(body[i], future)]
    first = ordinary[0] if ordinary else len(body)
    last = first
    # The import block that starts there (AddImportsVisitor adds after it);
    # imports further down (late, conditional) are not needed to place ours.
    while last + 1 < len(body) and m.matches(body[last + 1], is_import):
        last += 1
    if not ordinary:  # nothing but __future__ imports (or none): visit the whole top
        first, last = 0, (imports[-1] if imports else -1)
    header = module.with_changes(body=body[first : last + 1])
    header = AddImportsVisitor(context).transform_module(header)
    return module.with_changes(body=body[:first] + list(header.body) + body[last + 1 :])


# --- module-level functions ---------------------------------------------------


def find_function(module: cst.Module, name: str) -> Optional[cst.FunctionDef]:
    """A top-level ``def name(...)``."""
    index = _find_named(module.body, cst.FunctionDef, name)
    return None if index is None else module.body[index]


def replace_function(module: cst.Module, name: str, edit: FunctionEdit) -> cst.Module:
    return _replace_named(module, cst.FunctionDef, name, edit, "function")


def add_function(module: cst.Module, source: str, after: Optional[str] = None) -> cst.Module:
    """Add a top-level function (given as source) after function ``after``,
    else at the end, with the two blank lines PEP 8 puts around it."""
    new = parse_statement(source).with_changes(leading_lines=[cst.EmptyLine(indent=False)] * 2)
    body = list(module.body)
    index = len(body)
    if after is not None:
        for i, stmt in enumerate(body):
            if isinstance(stmt, cst.FunctionDef) and stmt.name.value == after:
                index = i + 1
    if index < len(body) and len(body[index].leading_lines) < 2:
        following = body[index]
        body[index] = following.with_changes(
            leading_lines=[cst.EmptyLine(indent=False)] * (2 - len(following.leading_lines)) + list(following.leading_lines)
        )
    body.insert(index, new)
    return module.with_changes(body=body)


# --- wrapping runs of statements ------------------------------------------------


def guard_statements(stmts: Sequence[cst.BaseStatement], condition: str) -> cst.If:
    """Wrap consecutive statements in one ``if <condition>:``; the first
    statement's leading comments/blank lines stay above the ``if``."""
    if not stmts:
        raise AnchorError("guard_statements needs at least one statement")
    inner = [stmts[0].with_changes(leading_lines=[])] + list(stmts[1:])
    return cst.If(
        test=parse_expression(condition),
        body=cst.IndentedBlock(body=inner),
        leading_lines=stmts[0].leading_lines,
    )


def branch_statements(stmts: Sequence[cst.BaseStatement], condition: str, then_source: str) -> cst.If:
    """``if <condition>: <then_source> else: <stmts>``: new code for one case,
    the existing statements unchanged for the others. Leading comments of the
    first statement stay above the ``if``."""
    if not stmts:
        raise AnchorError("branch_statements needs at least one statement")
    inner = [stmts[0].with_changes(leading_lines=[])] + list(stmts[1:])
    # Parsed as a block (not a module) so its leading comments stay in it.
    then = parse_statement("if _:\n" + textwrap.indent(textwrap.dedent(then_source).strip("\n"), "    ") + "\n")
    return cst.If(
        test=parse_expression(condition),
        body=then.body,
        orelse=cst.Else(body=cst.IndentedBlock(body=inner)),
        leading_lines=stmts[0].leading_lines,
    )


# --- isinstance(x, (A, B, ...)) ---------------------------------------------------


def _strip_parens(node: cst.BaseExpression) -> cst.BaseExpression:
    return node.with_changes(lpar=[], rpar=[]) if getattr(node, "lpar", None) else node


def _isinstance_parts(node: cst.BaseExpression) -> Optional[tuple[cst.BaseExpression, list[cst.BaseExpression]]]:
    """(subject, classes) of ``isinstance(s, C)`` / ``isinstance(s, (C, D))``."""
    if not m.matches(node, m.Call(func=m.Name("isinstance"), args=[m.Arg(keyword=None), m.Arg(keyword=None)])):
        return None
    subject, classes = node.args[0].value, node.args[1].value
    if isinstance(classes, cst.Tuple):
        return subject, [e.value for e in classes.elements if not isinstance(e, cst.StarredElement)]
    return subject, [classes]


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
    return parse_expression(f"isinstance(\n    {subject},\n    (\n{lines}    ),\n)")


# --- imports next to their siblings ---------------------------------------------


def _dotted(node: Optional[cst.BaseExpression]) -> str:
    if node is None:
        return ""
    return cst.Module(body=[]).code_for_node(node)


def _top_level_import_from(stmt: cst.BaseStatement) -> Optional[cst.ImportFrom]:
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.ImportFrom):
        imp = stmt.body[0]
        if not imp.relative and imp.module is not None:
            return imp
    return None


def imports_name(module: cst.Module, module_name: str, name: str) -> bool:
    """Does the module bind ``name`` with a top-level ``from module_name import ...``?"""
    for stmt in module.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.ImportFrom) and not small.relative and _dotted(small.module) == module_name:
                    if isinstance(small.names, cst.ImportStar):
                        return True
                    for alias in small.names:
                        bound = alias.asname.name.value if alias.asname else _dotted(alias.name)
                        if bound == name and _dotted(alias.name) == name:
                            return True
    return False


def add_import_sorted(module: cst.Module, module_name: str, name: str) -> cst.Module:
    """Add ``from module_name import name`` among the top-level from-imports
    closest to it (longest common dotted prefix), in isort order (case-folded
    module names), so the new line sits where a formatter would put it. No-op
    when the name is already imported from there. Without any sibling it goes
    after the last top-level import (or at the top)."""
    if imports_name(module, module_name, name):
        return module
    target = module_name.split(".")
    body = list(module.body)
    best, group = -1, []
    for i, stmt in enumerate(body):
        imp = _top_level_import_from(stmt)
        if imp is None:
            continue
        parts = _dotted(imp.module).split(".")
        common = next((k for k, (a, b) in enumerate(zip(parts, target)) if a != b), min(len(parts), len(target)))
        if common > best:
            best, group = common, [(i, _dotted(imp.module))]
        elif common == best:
            group.append((i, _dotted(imp.module)))
    new = parse_statement(f"from {module_name} import {name}")
    later: list[int] = []
    if group and best > 0:
        later = [i for i, mod_name in group if mod_name.lower() > module_name.lower()]
        index = later[0] if later else group[-1][0] + 1
    else:
        is_import = m.SimpleStatementLine(body=[m.ZeroOrMore(), m.Import() | m.ImportFrom(), m.ZeroOrMore()])
        index = max((i + 1 for i, s in enumerate(body) if m.matches(s, is_import)), default=0)
    if later:
        # Blank lines above the statement we go before (a section break) move
        # above us; comments stay with the statement they describe.
        following = body[index]
        lines = list(following.leading_lines)
        blank = next((k for k, line in enumerate(lines) if line.comment is not None), len(lines))
        new = new.with_changes(leading_lines=lines[:blank])
        body[index] = following.with_changes(leading_lines=lines[blank:])
    body.insert(index, new)
    return module.with_changes(body=body)


# --- inside a function: at the end, before an anchor statement ----------------
# (added for the TRT-LLM MLA spec-v2 patch)


def parse_statements_with_comments(source: str) -> list[Statement]:
    """Like ``parse_statements``, but comment lines above the first statement
    stay with it (``parse_statements`` leaves them in the module header)."""
    module = cst.parse_module(textwrap.dedent(source).strip("\n") + "\n")
    body = list(module.body)
    comments = [line for line in module.header if line.comment is not None]
    if body and comments:
        body[0] = body[0].with_changes(leading_lines=[*comments, *body[0].leading_lines])
    return body


def insert_at_end(fn: cst.FunctionDef, source: str) -> cst.FunctionDef:
    """Append statements (leading comments kept) at the end of a function body
    (after its last statement; a trailing comment block stays last)."""
    body = list(fn.body.body)
    body.extend(parse_statements_with_comments(source))
    return fn.with_changes(body=fn.body.with_changes(body=body))


def find_statement_index(fn: cst.FunctionDef, matcher: m.BaseMatcherNode) -> Optional[int]:
    """Index of the first top-level statement of ``fn``'s body that matches, or
    that contains a node matching ``matcher`` (e.g. the line of a call)."""
    for i, stmt in enumerate(fn.body.body):
        if find_all(stmt, matcher):
            return i
    return None


def insert_before(fn: cst.FunctionDef, matcher: m.BaseMatcherNode, source: str) -> cst.FunctionDef:
    """Insert statements (leading comments kept) just above the first top-level
    statement of ``fn`` that matches (or contains a match of) ``matcher``. The anchor's blank lines
    go above the new code and one blank line separates the new code from the
    anchor; the anchor's own comments stay attached to it."""
    index = find_statement_index(fn, matcher)
    if index is None:
        raise AnchorError(f"{fn.name.value}: no statement matching {matcher!r}")
    body = list(fn.body.body)
    anchor = body[index]
    lines = list(anchor.leading_lines)
    first_comment = next((k for k, line in enumerate(lines) if line.comment is not None), len(lines))
    new = parse_statements_with_comments(source)
    new[0] = new[0].with_changes(leading_lines=[*lines[:first_comment], *new[0].leading_lines])
    body[index] = anchor.with_changes(leading_lines=[cst.EmptyLine(indent=False)] + lines[first_comment:])
    body[index:index] = new
    return fn.with_changes(body=fn.body.with_changes(body=body))


# --- call arguments ---------------------------------------------------------------


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
        if len(args) >= 2 and isinstance(args[-2].comma, cst.Comma):
            between = args[-2].comma
        else:
            between = cst.Comma(whitespace_after=call.whitespace_before_args)
        args[-1] = last.with_changes(comma=between)
        args.append(new.with_changes(comma=last.comma))
    else:
        between = args[-2].comma if len(args) >= 2 and isinstance(args[-2].comma, cst.Comma) else None
        args[-1] = last.with_changes(comma=between or cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        args.append(new)
    return call.with_changes(args=args)


# --- expressions rewritten from a template ----------------------------------------
# (added for the needs-cpu-seq-lens patch: every None guard there is one of these)


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
    return parsed.visit(_TemplateFiller(dict(nodes)))


class _TemplateRewriter(cst.CSTTransformer):
    def __init__(self, matcher, template, within, nodes) -> None:
        super().__init__()
        self.matcher, self.template, self.within, self.nodes = matcher, template, within, nodes
        self.inside = 0 if within is not None else 1
        self.count = 0

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.within is not None and m.matches(node, self.within):
            self.inside += 1
        return True

    def on_leave(self, original, updated):
        result = updated
        if self.inside > 0:
            captures = m.extract(updated, self.matcher)
            if captures is not None:
                self.count += 1
                result = fill_template(self.template, {**self.nodes, **captures})
                if isinstance(updated, cst.BaseExpression) and isinstance(result, cst.BaseExpression):
                    # Parentheses around the rewritten expression stay.
                    result = result.with_changes(lpar=updated.lpar, rpar=updated.rpar)
        if self.within is not None and m.matches(original, self.within):
            self.inside -= 1
        return result


def rewrite_expressions(
    node: cst.CSTNode,
    matcher: m.BaseMatcherNode,
    template: str,
    *,
    within: Optional[m.BaseMatcherNode] = None,
    **nodes: cst.CSTNode,
) -> cst.CSTNode:
    """Rewrite every expression (or small statement) under ``node`` that
    matches ``matcher`` as ``template`` (see :func:`fill_template`), filled with
    the matcher's ``m.SaveMatchedNode`` captures and the extra ``nodes``.

    ``within`` limits the rewrite to the inside of nodes matching it (e.g. only
    the argument of one call). Example: ``X.seq_lens_sum + N`` ->
    ``add_or_none(X.seq_lens_sum, N)`` with
    ``m.BinaryOperation(left=m.SaveMatchedNode(m.Attribute(...), "X"), operator=m.Add(), right=m.SaveMatchedNode(m.DoNotCare(), "N"))``
    and template ``"add_or_none(X, N)"``. Raises AnchorError when nothing matched.
    """
    rewriter = _TemplateRewriter(matcher, template, within, nodes)
    result = node.visit(rewriter)
    if rewriter.count == 0:
        raise AnchorError(f"no expression matching {matcher!r}")
    return result


def find_all(node: cst.CSTNode, matcher: m.BaseMatcherNode, within: Optional[m.BaseMatcherNode] = None) -> list[cst.CSTNode]:
    """Nodes under ``node`` (itself included) matching ``matcher``, in source
    order; only inside ``within`` nodes when given. Same result as libcst's
    ``m.findall``, which rebuilds every node it visits and so costs about as
    much as a parse; this walks the dataclass fields and only calls
    ``m.matches`` on nodes of the matcher's type."""
    if within is not None:
        return [hit for outer in find_all(node, within) for hit in find_all(outer, matcher)]
    wanted = getattr(cst, type(matcher).__name__, None)
    nodes, by_type = _index(node)
    if isinstance(wanted, type) and issubclass(wanted, cst.CSTNode):
        candidates = by_type.get(wanted, ())
    else:
        candidates = nodes  # OneOf, MatchIfTrue, ...: test every node
    return [n for n in candidates if m.matches(n, matcher)]


# Codemods query the same method many times (detect, transform, postcondition):
# remember the walk of the last few subtrees. CST nodes are immutable, so a
# node's walk never changes; the cache holds the node itself, so its id stays valid.
_INDEX: "OrderedDict[int, tuple]" = OrderedDict()


def _index(node: cst.CSTNode) -> tuple[list[cst.CSTNode], dict[type, list[cst.CSTNode]]]:
    hit = _INDEX.get(id(node))
    if hit is not None and hit[0] is node:
        _INDEX.move_to_end(id(node))
        return hit[1], hit[2]
    nodes = list(_walk(node))
    by_type: dict[type, list[cst.CSTNode]] = {}
    for n in nodes:
        by_type.setdefault(type(n), []).append(n)
    _INDEX[id(node)] = (node, nodes, by_type)
    if len(_INDEX) > 256:
        _INDEX.popitem(last=False)
    return nodes, by_type


class _ChildOrder(cst.CSTVisitor):
    """Records the order in which libcst visits a node's direct children."""

    def __init__(self, root: cst.CSTNode) -> None:
        self.root, self.seen = root, {}

    def on_visit(self, node: cst.CSTNode) -> bool:
        if node is self.root:
            return True
        self.seen.setdefault(id(node), len(self.seen))
        return False


# (node type, fields holding nodes) -> those fields in libcst's visit order,
# which is source order (dataclass field order is not, e.g. Arg, FunctionDef).
_FIELD_ORDER: dict[tuple, tuple[str, ...]] = {}


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _children(node: cst.CSTNode) -> list[cst.CSTNode]:
    node_type = type(node)
    names = _FIELD_NAMES.get(node_type)
    if names is None:
        names = _FIELD_NAMES[node_type] = tuple(f.name for f in dataclasses.fields(node))
    fields = {}
    for name in names:
        value = getattr(node, name)
        if isinstance(value, cst.CSTNode):
            fields[name] = (value,)
        elif value and isinstance(value, (list, tuple)):
            items = [v for v in value if isinstance(v, cst.CSTNode)]
            if items:
                fields[name] = items
    if len(fields) <= 1:
        return [child for items in fields.values() for child in items]
    key = (node_type, *fields)
    order = _FIELD_ORDER.get(key)
    if order is None:
        recorder = _ChildOrder(node)
        node.visit(recorder)
        first = {name: recorder.seen.get(id(items[0]), len(recorder.seen)) for name, items in fields.items()}
        order = _FIELD_ORDER[key] = tuple(sorted(first, key=first.__getitem__))
    return [child for name in order for child in fields[name]]


def _walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """Pre-order walk over a CST in source order, without rebuilding it."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(_children(current)))


# --- class attributes laid out like hand-written ones --------------------------------


def space_class_attribute(cls: cst.ClassDef, name: str, comment: str = "") -> cst.ClassDef:
    """Lay out the class attribute ``name`` as black would, plus optional
    ``# comment`` lines right above it: a blank line separates it from a
    docstring above it and from a method or class right after it."""
    body = list(class_body(cls))
    index = next((i for i, stmt in enumerate(body) if _assigned_name(stmt) == name), None)
    if index is None:
        raise AnchorError(f"{cls.name.value}.{name}")
    stmt = body[index]
    lines = list(stmt.leading_lines)
    if comment:
        lines += [cst.EmptyLine(comment=cst.Comment(f"# {text}".rstrip())) for text in comment.splitlines()]
    if index == 1 and _docstring_count(body) and not _starts_blank(lines):
        lines.insert(0, cst.EmptyLine(indent=False))
    body[index] = stmt.with_changes(leading_lines=lines)
    following = body[index + 1] if index + 1 < len(body) else None
    if isinstance(following, (cst.FunctionDef, cst.ClassDef)) and not _starts_blank(following.leading_lines):
        body[index + 1] = following.with_changes(leading_lines=[cst.EmptyLine(indent=False), *following.leading_lines])
    return _with_class_body(cls, body)


def _starts_blank(lines: Sequence[cst.EmptyLine]) -> bool:
    return bool(lines) and lines[0].comment is None
