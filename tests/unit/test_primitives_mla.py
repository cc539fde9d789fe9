"""Primitives added for the TRT-LLM MLA spec-v2 patch: before -> after."""

from __future__ import annotations

import textwrap

import libcst as cst
import libcst.matchers as m
import pytest

from patchkit.codemods.common import primitives as p


def code(src: str) -> str:
    return textwrap.dedent(src).lstrip("\n")


def method(src: str) -> tuple[cst.Module, cst.FunctionDef]:
    module = cst.parse_module(code(src))
    return module, p.find_method(p.find_class(module, "C"), "f")


def rebuilt(module: cst.Module, fn: cst.FunctionDef) -> str:
    return p.replace_class(module, "C", lambda c: p.replace_method(c, "f", lambda _: fn)).code


SUPER_CALL = m.Call(func=m.Attribute(value=m.Call(func=m.Name("super")), attr=m.Name("f")))


def test_insert_at_end():
    module, fn = method(
        '''
        class C:
            def f(self):
                """Doc."""
                self.a = 1
                # trailing comment
        '''
    )
    out = rebuilt(module, p.insert_at_end(fn, "self.b = None\nself.c = 2"))
    assert out == code(
        '''
        class C:
            def f(self):
                """Doc."""
                self.a = 1
                self.b = None
                self.c = 2
                # trailing comment
        '''
    )


def test_insert_before_keeps_comments_on_the_anchor():
    module, fn = method(
        """
        class C(B):
            def f(self, n):
                x = 1

                # hand over to the parent
                super().f(n)
                y = 2
        """
    )
    out = rebuilt(module, p.insert_before(fn, SUPER_CALL, "self.m = n\nself.k = 0"))
    assert out == code(
        """
        class C(B):
            def f(self, n):
                x = 1

                self.m = n
                self.k = 0

                # hand over to the parent
                super().f(n)
                y = 2
        """
    )


def test_insert_before_matches_a_statement_containing_the_call():
    module, fn = method(
        """
        class C(B):
            def f(self, n):
                x = 1
                return super().f(n)
        """
    )
    assert p.find_statement_index(fn, SUPER_CALL) == 1
    out = rebuilt(module, p.insert_before(fn, SUPER_CALL, "self.m = n"))
    assert out == code(
        """
        class C(B):
            def f(self, n):
                x = 1
                self.m = n

                return super().f(n)
        """
    )


def test_insert_before_missing_anchor():
    _, fn = method(
        """
        class C:
            def f(self):
                pass
        """
    )
    assert p.find_statement_index(fn, SUPER_CALL) is None
    with pytest.raises(p.AnchorError):
        p.insert_before(fn, SUPER_CALL, "x = 1")


def test_inserted_code_keeps_its_leading_comments():
    module, fn = method(
        """
        class C(B):
            def f(self, n):
                x = 1
                super().f(n)
        """
    )
    fn = p.insert_before(fn, SUPER_CALL, "# why\n# and how\nself.m = n")
    fn = p.insert_at_end(fn, "# last\nself.z = 0")
    assert rebuilt(module, fn) == code(
        """
        class C(B):
            def f(self, n):
                x = 1
                # why
                # and how
                self.m = n

                super().f(n)
                # last
                self.z = 0
        """
    )
    assert len(p.parse_statements_with_comments("# c\nx = 1\ny = 2")) == 2
