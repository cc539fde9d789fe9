"""Primitives added for the needs-cpu-seq-lens patch: before -> after."""

from __future__ import annotations

import textwrap

import libcst as cst
import libcst.matchers as m
import pytest

from patchkit.codemods.common import primitives as p


def code(src: str) -> str:
    return textwrap.dedent(src).lstrip("\n")


def rewrite(src: str, matcher, template: str, **kw) -> str:
    return p.rewrite_expressions(cst.parse_module(code(src)), matcher, template, **kw).code


SUM = m.SaveMatchedNode(m.Attribute(attr=m.Name("seq_lens_sum")), "LEFT")
PLUS = m.BinaryOperation(left=SUM, operator=m.Add(), right=m.SaveMatchedNode(m.DoNotCare(), "RIGHT"))


def test_fill_template_puts_nodes_for_bare_names_only():
    x = cst.parse_expression("batch.seq_lens_sum")
    out = p.fill_template("f(X, y.X, g(X), X=1)", {"X": x})
    assert cst.Module(body=[]).code_for_node(out) == "f(batch.seq_lens_sum, y.X, g(batch.seq_lens_sum), X=1)"


def test_fill_template_small_statement():
    t = cst.parse_expression("self.seq_lens_sum")
    out = p.fill_template("T = add_or_none(T, V)", {"T": t, "V": cst.parse_expression("other.n")})
    assert isinstance(out, cst.Assign)
    assert cst.Module(body=[]).code_for_node(out) == "self.seq_lens_sum = add_or_none(self.seq_lens_sum, other.n)"


def test_fill_template_rejects_compound_statements():
    with pytest.raises(ValueError):
        p.fill_template("if X:\n    pass\n", {})


def test_rewrite_expressions_binary_operation():
    out = rewrite(
        """
        def f(self, bs, raw_bs):
            g(
                bs,
                forward_batch.seq_lens_sum + (bs - raw_bs) * self.fill,  # pad
                x,
            )
        """,
        PLUS,
        "add_or_none(LEFT, RIGHT)",
    )
    assert out == code(
        """
        def f(self, bs, raw_bs):
            g(
                bs,
                add_or_none(forward_batch.seq_lens_sum, (bs - raw_bs) * self.fill),  # pad
                x,
            )
        """
    )


def test_rewrite_expressions_keeps_parentheses_and_extra_nodes():
    out = rewrite(
        "y = (a.seq_lens_sum + 1)\n",
        PLUS,
        "h(LEFT, RIGHT, EXTRA)",
        EXTRA=cst.parse_expression("self.bound"),
    )
    assert out == "y = (h(a.seq_lens_sum, 1, self.bound))\n"


def test_rewrite_expressions_aug_assign_becomes_assign():
    site = m.AugAssign(
        target=m.SaveMatchedNode(m.Attribute(attr=m.Name("seq_lens_sum")), "T"),
        operator=m.AddAssign(),
        value=m.SaveMatchedNode(m.DoNotCare(), "V"),
    )
    out = rewrite("self.seq_lens_sum += other.seq_lens_sum  # merge\n", site, "T = add_or_none(T, V)")
    assert out == "self.seq_lens_sum = add_or_none(self.seq_lens_sum, other.seq_lens_sum)  # merge\n"


def test_rewrite_expressions_within_limits_the_scope():
    src = """
    for sl in batch.seq_lens_cpu:
        use(sl, batch.seq_lens_cpu)
    total = batch.seq_lens_cpu
    """
    out = rewrite(
        src,
        m.SaveMatchedNode(m.Attribute(attr=m.Name("seq_lens_cpu")), "X"),
        "mirror(X)",
        within=m.For(iter=m.Attribute(attr=m.Name("seq_lens_cpu"))),
    )
    # Only inside the loop; its body too (the caller's `within` decides).
    assert out == code(
        """
        for sl in mirror(batch.seq_lens_cpu):
            use(sl, mirror(batch.seq_lens_cpu))
        total = batch.seq_lens_cpu
        """
    )


def test_rewrite_expressions_without_a_match_raises():
    with pytest.raises(p.AnchorError):
        rewrite("x = 1\n", PLUS, "f(LEFT)")


def test_find_all_with_and_without_within():
    module = cst.parse_module("a.seq_lens_sum + 1\nf(b.seq_lens_sum + 2)\n")
    assert len(p.find_all(module, PLUS)) == 2
    assert len(p.find_all(module, PLUS, within=m.Call(func=m.Name("f")))) == 1


def test_space_class_attribute_after_docstring_and_before_method():
    module = cst.parse_module(
        code(
            '''
            class A:
                """Doc."""

                def f(self):
                    pass


            class B:
                def f(self):
                    pass
            '''
        )
    )

    def edit(c):
        c = p.add_class_attribute(c, "flag: bool = False")
        return p.space_class_attribute(c, "flag", "Why it is False,\non two lines.")

    module = p.replace_class(p.replace_class(module, "A", edit), "B", edit)
    assert module.code == code(
        '''
        class A:
            """Doc."""

            # Why it is False,
            # on two lines.
            flag: bool = False

            def f(self):
                pass


        class B:
            # Why it is False,
            # on two lines.
            flag: bool = False

            def f(self):
                pass
        '''
    )


def test_space_class_attribute_missing_name():
    cls = p.find_class(cst.parse_module("class A:\n    x = 1\n"), "A")
    with pytest.raises(p.AnchorError):
        p.space_class_attribute(cls, "flag")
