"""Primitives added for the TRT-LLM MHA draft-extend v2 patch: before -> after."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from patchkit.codemods.common import primitives as p


def mod(src: str) -> cst.Module:
    return cst.parse_module(textwrap.dedent(src).lstrip("\n"))


def code(src: str) -> str:
    return textwrap.dedent(src).lstrip("\n")


FUNCS = mod(
    """
    import os


    def first():
        return 1


    def last():
        return 2
    """
)


def test_find_replace_add_function():
    assert p.find_function(FUNCS, "first").name.value == "first"
    assert p.find_function(FUNCS, "missing") is None
    renamed = p.replace_function(FUNCS, "last", lambda f: f.with_changes(name=cst.Name("final")))
    assert "def final():" in renamed.code
    with pytest.raises(p.AnchorError):
        p.replace_function(FUNCS, "missing", lambda f: f)
    added = p.add_function(FUNCS, "def mid():\n    return 0\n", after="first")
    assert added.code == code(
        """
        import os


        def first():
            return 1


        def mid():
            return 0


        def last():
            return 2
        """
    )
    at_end = p.add_function(FUNCS, "def tail():\n    pass\n")
    assert at_end.code.endswith("return 2\n\n\ndef tail():\n    pass\n")


BLOCK = mod(
    """
    def f():
        a = 1
        # about b
        b = g(
            2,
        )
        c = 3
    """
)


def _body(module):
    return list(module.body[0].body.body)


def test_guard_statements_keeps_comments_above():
    stmts = _body(BLOCK)
    guarded = p.guard_statements(stmts[1:3], "flag")
    new = BLOCK.with_changes(
        body=[BLOCK.body[0].with_changes(body=BLOCK.body[0].body.with_changes(body=[stmts[0], guarded]))]
    )
    assert new.code == code(
        """
        def f():
            a = 1
            # about b
            if flag:
                b = g(
                    2,
                )
                c = 3
        """
    )
    with pytest.raises(p.AnchorError):
        p.guard_statements([], "flag")


def test_branch_statements_new_code_first_old_in_else():
    stmts = _body(BLOCK)
    branched = p.branch_statements(stmts[1:], "mode.is_v2()", "# new path\nh(x)\n")
    new = BLOCK.with_changes(
        body=[BLOCK.body[0].with_changes(body=BLOCK.body[0].body.with_changes(body=[stmts[0], branched]))]
    )
    assert new.code == code(
        """
        def f():
            a = 1
            # about b
            if mode.is_v2():
                # new path
                h(x)
            else:
                b = g(
                    2,
                )
                c = 3
        """
    )


@pytest.mark.parametrize(
    "expr, expected",
    [
        ("isinstance(x.b, A) or isinstance(x.b, B)", ("x.b", ["A", "B"])),
        ("(isinstance(x.b, A)\n or isinstance(x.b, (B, m.C)))", ("x.b", ["A", "B", "m.C"])),
        ("isinstance(x.b, (A, B))", ("x.b", ["A", "B"])),
        ("isinstance(x.b, A)", ("x.b", ["A"])),
        ("isinstance(x.b, A) or isinstance(y, B)", None),
        ("isinstance(x.b, A) and isinstance(x.b, B)", None),
        ("issubclass(x.b, A)", None),
    ],
)
def test_isinstance_class_names(expr, expected):
    assert p.isinstance_class_names(cst.parse_expression(expr)) == expected


def test_isinstance_tuple_black_style_and_position():
    chain = cst.parse_expression(
        "(\n    isinstance(self.b, A)\n    or isinstance(self.b, B)\n    or isinstance(self.b, C)\n)"
    )
    call = p.isinstance_tuple(chain, add=["New"], after="B")
    assert cst.Module(body=[]).code_for_node(call) == code(
        """
        isinstance(
            self.b,
            (
                A,
                B,
                New,
                C,
            ),
        )"""
    ).rstrip("\n")
    again = p.isinstance_tuple(call, add=["New"], after="B")
    assert p.isinstance_class_names(again) == ("self.b", ["A", "B", "New", "C"])
    at_end = p.isinstance_tuple(cst.parse_expression("isinstance(s, A)"), add=["Z"])
    assert p.isinstance_class_names(at_end) == ("s", ["A", "Z"])
    with pytest.raises(p.AnchorError):
        p.isinstance_tuple(cst.parse_expression("a or b"), add=["Z"])


IMPORTS = mod(
    """
    import torch

    from pkg.env import envs
    from pkg.layers.attention.triton_backend import TritonBackend
    from pkg.layers.attention.trtllm_mla_backend import (
        MLABackend,
    )
    from pkg.layers.dp import group

    logger = 1
    """
)


def test_add_import_sorted_between_siblings():
    new = p.add_import_sorted(IMPORTS, "pkg.layers.attention.trtllm_mha_backend", "MHABackend")
    assert new.code == code(
        """
        import torch

        from pkg.env import envs
        from pkg.layers.attention.triton_backend import TritonBackend
        from pkg.layers.attention.trtllm_mha_backend import MHABackend
        from pkg.layers.attention.trtllm_mla_backend import (
            MLABackend,
        )
        from pkg.layers.dp import group

        logger = 1
        """
    )
    assert p.imports_name(new, "pkg.layers.attention.trtllm_mha_backend", "MHABackend")
    assert p.add_import_sorted(new, "pkg.layers.attention.trtllm_mha_backend", "MHABackend") is new


def test_add_import_sorted_after_last_sibling_and_without_siblings():
    new = p.add_import_sorted(IMPORTS, "pkg.layers.attention.zz_backend", "ZZ")
    assert (
        "    MLABackend,\n)\nfrom pkg.layers.attention.zz_backend import ZZ\nfrom pkg.layers.dp import group\n\nlogger"
        in new.code
    )
    other = p.add_import_sorted(IMPORTS, "elsewhere.mod", "X")
    assert "from pkg.layers.dp import group\nfrom elsewhere.mod import X\n\nlogger = 1\n" in other.code


def test_add_import_sorted_keeps_section_breaks_and_comments():
    src = mod(
        """
        import os

        # first-party
        from pkg.b import B
        """
    )
    new = p.add_import_sorted(src, "pkg.a", "A")
    assert new.code == "import os\n\nfrom pkg.a import A\n# first-party\nfrom pkg.b import B\n"
    grouped = mod("import os\n\nfrom pkg.b import B\n")
    assert p.add_import_sorted(grouped, "pkg.a", "A").code == "import os\n\nfrom pkg.a import A\nfrom pkg.b import B\n"


def test_imports_name_forms():
    src = mod("from a.b import (X, Y as Z)\nfrom c import *\n")
    assert p.imports_name(src, "a.b", "X")
    assert not p.imports_name(src, "a.b", "Y")  # bound as Z
    assert p.imports_name(src, "c", "anything")
    assert not p.imports_name(src, "a", "X")


@pytest.mark.parametrize(
    "before, after",
    [
        ("f(\n    a=1,\n    b=2,\n)", "f(\n    a=1,\n    b=2,\n    check=chk,\n)"),
        ("f(\n    a=1,\n)", "f(\n    a=1,\n    check=chk,\n)"),
        ("f(a, b=2)", "f(a, b=2, check=chk)"),
        ("f(a)", "f(a, check=chk)"),
        ("f()", "f(check=chk)"),
        ("f(a, check=old)", "f(a, check=chk)"),
        # wrapped without a trailing comma (black's hug): ")" keeps its own line
        ("f(\n    a, b=2\n)", "f(\n    a, b=2, check=chk\n)"),
        ("f(\n    a,\n    b=2\n)", "f(\n    a,\n    b=2,\n    check=chk\n)"),
    ],
)
def test_set_keyword_argument(before, after):
    call = p.set_keyword_argument(cst.parse_expression(before), "check", "chk")
    assert cst.Module(body=[]).code_for_node(call) == after
