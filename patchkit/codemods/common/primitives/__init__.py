"""Reusable edit primitives: the only place patchkit navigates or edits a CST.

They navigate by name (module -> class -> method -> statement) instead of
visiting the whole module, because a full libcst visit of a 3k-line file costs
about as much as parsing it, and a patch touches a handful of nodes. Inside a
method, where code is small, they use libcst matchers.

Find a primitive by where it acts:

- ``snippets``: parse code given as text (``parse_statement`` ...), ``AnchorError``,
  ``Statement`` and ``block_statements`` (a block's statements, typed)
- ``module``: top-level classes and functions (``find_class``, ``add_function`` ...), and
  ``Verbatim``, a definition no codemod reads kept as its source lines
- ``classes``: a class's body, methods and attributes (``find_method``, ``add_method``,
  ``add_class_attribute`` ...)
- ``function_body``: statements inside a function (``insert_at_start``,
  ``insert_before``, ``replace_statements``, ``guard_statement`` ...)
- ``expressions``: expressions and calls (``rewrite_expressions``, ``isinstance_tuple``,
  ``set_keyword_argument`` ...)
- ``imports``: what is imported, and adding imports (``require_import`` /
  ``add_imports``, ``add_import_sorted``)
- ``search``: ``find_all``, ``find_all_of`` (its hits typed as one node kind), ``contains``,
  ``visit_below`` (a transformer's result typed as the node it was given)
- ``values``: a value by meaning, through its spellings (parentheses, casts, batch
  slices ``x[:bs]``, temporaries, operand order): ``peel``, ``sum_of``, ``Locals``;
  as matchers keeping captures: ``spelled``, ``host_scalar``, ``added``
- ``lines``: ``line_of`` (the line a finding points at)
- ``matchers``: what codemods look for: ``attr``, ``call``, ``assigns_attr``, ``none_test``
  (typed with ``Expr`` / ``Field`` / ``Item``: what a libcst matcher field takes),
  ``find_isinstance_disjunction``, and ``NoneGuards`` / ``unguarded`` (is a read only reached
  when its value is not None?)

Codemods use them as ``from patchkit.codemods.common import primitives`` +
``primitives.name``; every per-patch codemod is written with these, none
re-implements them.
"""

from __future__ import annotations

from patchkit.codemods.common.primitives.snippets import (  # noqa: F401
    Statement,
    AnchorError,
    parse_statements,
    block_statements,
    parse_statement,
    parse_expression,
    parse_statements_with_comments,
)
from patchkit.codemods.common.primitives.lines import line_of, remember_starts  # noqa: F401
from patchkit.codemods.common.primitives.search import (  # noqa: F401
    paths_to,
    children,
    contains,
    find_all,
    find_all_of,
    visit_below,
    _INDEX,
    _index,
    _ChildOrder,
    _FIELD_ORDER,
    _FIELD_NAMES,
    _children,
    _walk,
)
from patchkit.codemods.common.primitives.module import (  # noqa: F401
    ClassEdit,
    FunctionEdit,
    _find_named,
    _replace_named,
    find_class,
    replace_class,
    find_function,
    replace_function,
    add_function,
    Verbatim,
    is_definition,
)
from patchkit.codemods.common.primitives.classes import (  # noqa: F401
    class_body,
    _with_class_body,
    base_names,
    methods,
    find_method,
    find_first_method,
    replace_method,
    add_method,
    _assigned_name,
    find_class_attribute,
    _docstring_count,
    add_class_attribute,
    space_class_attribute,
    _starts_blank,
)
from patchkit.codemods.common.primitives.function_body import (  # noqa: F401
    insert_at_start,
    StatementEdit,
    _StatementReplacer,
    replace_statements,
    guard_statement,
    guard_statements,
    branch_statements,
    insert_at_end,
    find_statement_index,
    insert_before,
    replace_block_statements,
)
from patchkit.codemods.common.primitives.matchers import (  # noqa: F401
    ANY,
    Expr,
    Field,
    Item,
    save,
    names,
    attr,
    dotted,
    call,
    method_call,
    super_call,
    plus,
    assigns_attr,
    assigns_name,
    line,
    is_node,
    none_comparison,
    none_test,
    _strip_parens,
    _isinstance_parts,
    isinstance_subject,
    or_terms,
    find_isinstance_disjunction,
    NoneGuards,
    unguarded,
)
from patchkit.codemods.common.primitives.expressions import (  # noqa: F401
    replace_expressions,
    replace_node,
    isinstance_class_names,
    isinstance_tuple,
    add_isinstance_classes,
    set_keyword_argument,
    _TemplateFiller,
    fill_template,
    _TemplateRewriter,
    rewrite_expressions,
)
from patchkit.codemods.common.primitives.imports import (  # noqa: F401
    IMPORTS_KEY,
    require_import,
    add_needed_imports,
    _IS_IMPORT,
    _FUTURE,
    _import_header,
    _single_import,
    _is_module_string,
    add_imports,
    _dotted,
    _top_level_import_from,
    imports_name,
    add_import_sorted,
)
from patchkit.codemods.common.primitives.values import (  # noqa: F401
    Locals,
    Peeled,
    Sum,
    added,
    host_scalar,
    operands,
    peel,
    spelled,
    strip_casts,
    sum_of,
)
