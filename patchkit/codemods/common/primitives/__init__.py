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

from patchkit.codemods.common.primitives.classes import (  # noqa: F401
    _assigned_name,
    _docstring_count,
    _starts_blank,
    _with_class_body,
    add_class_attribute,
    add_dataclass_field,
    add_method,
    base_names,
    class_body,
    decorators_defined_beside,
    find_class_attribute,
    find_first_method,
    find_method,
    methods,
    replace_method,
    space_class_attribute,
)
from patchkit.codemods.common.primitives.expressions import (  # noqa: F401
    _TemplateFiller,
    _TemplateRewriter,
    add_isinstance_classes,
    fill_template,
    isinstance_class_names,
    isinstance_tuple,
    keyword_argument,
    replace_expressions,
    replace_node,
    rewrite_expressions,
    set_keyword_argument,
)
from patchkit.codemods.common.primitives.function_body import (  # noqa: F401
    StatementEdit,
    _StatementReplacer,
    append_parameters,
    branch_statements,
    find_statement_index,
    guard_statement,
    guard_statements,
    has_plain_parameters,
    insert_above_holder,
    insert_at_end,
    insert_at_start,
    insert_before,
    remove_statements,
    replace_block_statements,
    replace_statements,
)
from patchkit.codemods.common.primitives.imports import (  # noqa: F401
    _FUTURE,
    _IS_IMPORT,
    IMPORTS_KEY,
    _dotted,
    _import_header,
    _is_module_string,
    _single_import,
    _top_level_import_from,
    add_import_sorted,
    add_imports,
    add_needed_imports,
    imports_name,
    require_import,
)
from patchkit.codemods.common.primitives.lines import line_of, remember_starts  # noqa: F401
from patchkit.codemods.common.primitives.matchers import (  # noqa: F401
    ANY,
    Expr,
    Field,
    Item,
    NoneGuards,
    _isinstance_parts,
    _strip_parens,
    assigns_attr,
    assigns_name,
    attr,
    call,
    dotted,
    find_isinstance_disjunction,
    is_node,
    isinstance_subject,
    line,
    method_call,
    mode_branch,
    names,
    none_comparison,
    none_test,
    or_terms,
    plus,
    save,
    super_call,
    unguarded,
)
from patchkit.codemods.common.primitives.module import (  # noqa: F401
    ClassEdit,
    FunctionEdit,
    Verbatim,
    _find_named,
    _replace_named,
    add_function,
    find_class,
    find_function,
    is_definition,
    replace_class,
    replace_function,
)
from patchkit.codemods.common.primitives.search import (  # noqa: F401
    _FIELD_NAMES,
    _FIELD_ORDER,
    _INDEX,
    _ChildOrder,
    _children,
    _index,
    _walk,
    children,
    contains,
    find_all,
    find_all_of,
    paths_to,
    sole_call_in,
    visit_below,
)
from patchkit.codemods.common.primitives.snippets import (  # noqa: F401
    AnchorError,
    Statement,
    block_statements,
    parse_expression,
    parse_statement,
    parse_statements,
    parse_statements_with_comments,
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
