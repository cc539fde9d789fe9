"""Each edit primitive on small snippets: before -> after."""

from __future__ import annotations

import textwrap

import libcst as cst
import libcst.matchers as m
import pytest
from libcst.codemod import CodemodContext
from support import libcst_add_imports

from patchkit.codemods.common import primitives as p


def mod(src: str) -> cst.Module:
    return cst.parse_module(textwrap.dedent(src).lstrip("\n"))


def code(src: str) -> str:
    return textwrap.dedent(src).lstrip("\n")


SAMPLE = mod(
    '''
    import os

    class A(pkg.Base, Other):
        """Doc."""

        x = 1

        def first(self):
            return 1

        def second(self):
            """Doc."""
            y = compute()
            return y
    '''
)


def test_find_class_and_method_and_bases():
    cls = p.find_class(SAMPLE, "A")
    assert cls is not None and p.find_class(SAMPLE, "B") is None
    assert p.base_names(cls) == ["Base", "Other"]
    assert p.find_method(cls, "second").name.value == "second"
    assert p.find_first_method(cls, ["missing", "first"]).name.value == "first"
    assert p.find_class_attribute(cls, "x") is not None
    assert p.find_class_attribute(cls, "y") is None


def test_add_method_after_named_method():
    new = p.replace_class(SAMPLE, "A", lambda c: p.add_method(c, "def mid(self):\n    pass\n", after="first"))
    assert new.code == code(
        '''
        import os

        class A(pkg.Base, Other):
            """Doc."""

            x = 1

            def first(self):
                return 1

            def mid(self):
                pass

            def second(self):
                """Doc."""
                y = compute()
                return y
        '''
    )


def test_add_class_attribute_goes_after_docstring():
    new = p.replace_class(SAMPLE, "A", lambda c: p.add_class_attribute(c, "flag: bool = False"))
    assert '"""Doc."""\n    flag: bool = False\n\n    x = 1' in new.code


def test_insert_at_start_keeps_docstring_first():
    new = p.replace_class(SAMPLE, "A", lambda c: p.replace_method(c, "second", lambda f: p.insert_at_start(f, "z = 0")))
    assert '"""Doc."""\n        z = 0\n        y = compute()' in new.code


def test_replace_statements_and_guard_keep_comments():
    src = mod(
        """
        def f(batch):
            # keep me
            batch.a = batch.b.cpu()
            return batch
        """
    )
    matcher = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=m.Attribute(attr=m.Name("a")))])])
    new = p.replace_statements(src, matcher, lambda s: p.guard_statement(s, "need"))
    assert new.code == code(
        """
        def f(batch):
            # keep me
            if need:
                batch.a = batch.b.cpu()
            return batch
        """
    )
    with pytest.raises(p.AnchorError):
        p.replace_statements(src, m.SimpleStatementLine(body=[m.Pass()]), lambda s: s)


def test_replace_expressions_and_contains():
    src = mod("if mode.is_draft_extend():\n    pass\n")
    call = m.Call(func=m.Attribute(attr=m.Name("is_draft_extend")), args=[])
    new = p.replace_expressions(src, call, lambda node, _: node.with_changes(args=[cst.Arg(cst.Name("x"))]))
    assert new.code == "if mode.is_draft_extend(x):\n    pass\n"
    assert p.contains(src, call) and not p.contains(new, call)


def test_add_needed_imports_touches_only_the_header():
    src = mod(
        """
        import os
        from a import b

        def f():
            import late
        """
    )
    context = CodemodContext()
    assert p.add_needed_imports(src, context) is src  # nothing requested: no work
    p.require_import(context, "patchkit.runtime", "helper")
    new = p.add_needed_imports(src, context)
    assert new.code == code(
        """
        import os
        from a import b
        from patchkit.runtime import helper

        def f():
            import late
        """
    )


def test_require_import_among_siblings_waits_for_the_engine():
    """One way to ask for an import: placed among its siblings (isort order)
    or into the block, both added once every codemod ran, each only once."""
    src = mod(
        """
        import os
        from pkg.layers import attention
        from pkg.model import runner
        """
    )
    context = CodemodContext()
    p.require_import(context, "pkg.layers.backends", "helper", among_siblings=True)
    p.require_import(context, "pkg.layers.backends", "helper", among_siblings=True)
    p.require_import(context, "patchkit.runtime", "flag")
    assert p.add_needed_imports(src, context).code == code(
        """
        import os
        from pkg.layers import attention
        from pkg.layers.backends import helper
        from pkg.model import runner
        from patchkit.runtime import flag
        """
    )
    with pytest.raises(ValueError):
        p.require_import(context, "pkg", among_siblings=True)


def test_parse_statements_dedents():
    stmts = p.parse_statements(
        """
            a = 1
            b = 2
        """
    )
    assert len(stmts) == 2


# --- add_imports gives what libcst's AddImportsVisitor gave on the import block


IMPORT_CASES = [
    "import os\nfrom a import b\n\ndef f():\n    import late\n",
    'from __future__ import annotations\n\n"""Doc."""\n\nimport os\nfrom x.y import z\n# comment\nX = 1\n',
    '"""Doc."""\nX = 1\n',
    '"""Doc."""\nfrom __future__ import annotations\n',
    "",
    "import os, sys\nimport re\nfrom patchkit.runtime import a as b\nfrom patchkit.runtime import (\n    c,\n    d,\n)\n\nY = 2\n",
    "from .rel import x\nfrom patchkit.backends.m import *\nimport patchkit.runtime\n\n\nclass A:\n    pass\n",
    "import a; import b\nfrom patchkit.runtime import q\n",
    "import os\nfrom patchkit.runtime import needs_cpu_seq_lens\nif True:\n    import late\n# trailing comment\nZ = 3\n",
]
IMPORT_WANTED = [
    [("patchkit.runtime", "helper")],
    [("patchkit.runtime", "zeta"), ("patchkit.runtime", "alpha"), ("patchkit.backends.m", "f"), ("a.b", "c")],
    [("patchkit.runtime", "needs_cpu_seq_lens"), ("patchkit.runtime", "c")],
    [("os", None), ("zz", None), ("patchkit.runtime", "b"), ("patchkit.runtime", "a")],
    [("patchkit.runtime", "q"), ("patchkit.runtime", "q")],
]


@pytest.mark.parametrize("source", IMPORT_CASES)
@pytest.mark.parametrize("wanted", IMPORT_WANTED)
def test_add_imports_matches_libcst_add_imports_visitor(source, wanted):
    module = cst.parse_module(source)
    assert p.add_imports(module, wanted).code == libcst_add_imports(module, wanted).code


def test_replace_block_statements_in_a_nested_block():
    fn = cst.parse_module("def f(x):\n    a()\n    if x:\n        b()\n        c()\n        d()\n").body[0]
    block = p.find_all(fn, m.IndentedBlock())[1]  # the `if x:` body
    out = p.replace_block_statements(fn, block, 0, 2, lambda run: p.guard_statements(run, "ready"))
    assert cst.Module(body=[out]).code == (
        "def f(x):\n    a()\n    if x:\n        if ready:\n            b()\n            c()\n        d()\n"
    )


def test_insert_above_holder_and_append_parameters():
    fn = cst.ensure_type(cst.parse_module("def f(self, a):\n    x = 1\n    g(a)\n").body[0], cst.FunctionDef)
    call = p.find_all_of(cst.Call, fn, m.Call())[0]
    block = cst.ensure_type(fn.body, cst.IndentedBlock)
    edited = p.insert_above_holder(block, call, "# why\ny = 2\n", p.parse_expression("h(a)"))
    fn = p.append_parameters(p.replace_node(fn, block, edited), "b=None, c: int = 0")
    assert cst.Module([fn]).code == "def f(self, a, b=None, c: int = 0):\n    x = 1\n    # why\n    y = 2\n    h(a)\n"
    starred = cst.ensure_type(cst.parse_module("def f(self, *a):\n    pass\n").body[0], cst.FunctionDef)
    assert not p.has_plain_parameters(starred)
    with pytest.raises(p.AnchorError):
        p.append_parameters(starred, "b=None")
