"""primitives.matchers (and the expression edit built on it): the None-guard
test, the isinstance disjunction finder, ``add_isinstance_classes``, ``line_of``."""

from __future__ import annotations

import textwrap

import libcst as cst
import libcst.matchers as m
import pytest

from patchkit.codemods.common import primitives

_code = cst.Module(body=[]).code_for_node


def _function(src: str) -> cst.FunctionDef:
    return cst.parse_module(textwrap.dedent(src)).body[0]


def _reads(fn: cst.FunctionDef) -> dict[int, bool]:
    """{n: guarded?} for each `READ<n>.seq_lens_cpu` read in ``fn`` (the
    receiver's name numbers the read)."""
    guards = primitives.NoneGuards(fn, ["seq_lens_cpu", "seq_lens_sum"])
    reads = primitives.find_all(fn, primitives.attr("seq_lens_cpu", m.Name(value=m.MatchRegex(r"READ\d+"))))
    return {int(r.value.value[4:]): guards.guarded(r) for r in reads}


GUARDED = {
    "if-not-none": """
        def f(batch):
            if batch.seq_lens_cpu is not None:
                use(READ1.seq_lens_cpu)
    """,
    "else-of-is-none": """
        def f(batch):
            if batch.seq_lens_cpu is None:
                pass
            else:
                use(READ1.seq_lens_cpu)
    """,
    "early-return": """
        def f(batch):
            if batch.seq_lens_cpu is None:
                return 0
            use(READ1.seq_lens_cpu)
    """,
    "early-continue": """
        def f(batches):
            for batch in batches:
                if batch.seq_lens_cpu is None:
                    continue
                use(READ1.seq_lens_cpu)
    """,
    "raise-in-a-suite": """
        def f(batch):
            if batch.seq_lens_sum is None or flag: raise ValueError()
            use(READ1.seq_lens_cpu)
    """,
    "and": """
        def f(batch):
            return batch.seq_lens_cpu is not None and READ1.seq_lens_cpu.max()
    """,
    "or-of-is-none": """
        def f(batch):
            return batch.seq_lens_cpu is None or READ1.seq_lens_cpu.max()
    """,
    "conditional-expression": """
        def f(batch):
            return READ1.seq_lens_cpu.sum() if batch.seq_lens_cpu is not None else 0
    """,
    "conditional-expression-inverted": """
        def f(batch):
            return 0 if batch.seq_lens_cpu is None else READ1.seq_lens_cpu.sum()
    """,
    "not-none-in-an-and-test": """
        def f(self, batch):
            if self.enabled and (batch.seq_lens_cpu is not None):
                use(READ1.seq_lens_cpu)
    """,
    "not-of-is-none": """
        def f(batch):
            if not batch.seq_lens_cpu is None:
                use(READ1.seq_lens_cpu)
    """,
    "the-test-itself": """
        def f(batch):
            return READ1.seq_lens_cpu is None
    """,
}

UNGUARDED = {
    "no-test": """
        def f(batch):
            use(READ1.seq_lens_cpu)
    """,
    "body-of-is-none": """
        def f(batch):
            if batch.seq_lens_cpu is None:
                use(READ1.seq_lens_cpu)
    """,
    "early-return-after-the-read": """
        def f(batch):
            use(READ1.seq_lens_cpu)
            if batch.seq_lens_cpu is None:
                return
    """,
    "early-exit-that-does-not-exit": """
        def f(batch):
            if batch.seq_lens_cpu is None:
                log("no mirror")
            use(READ1.seq_lens_cpu)
    """,
    "or-with-not-none": """
        def f(self, batch):
            if self.enabled or batch.seq_lens_cpu is not None:
                use(READ1.seq_lens_cpu)
    """,
    "other-value": """
        def f(batch):
            if batch.extend_lens is not None:
                use(READ1.seq_lens_cpu)
    """,
}


@pytest.mark.parametrize("src", GUARDED.values(), ids=GUARDED.keys())
def test_reads_under_a_none_guard_of_any_form(src):
    assert _reads(_function(src)) == {1: True}


@pytest.mark.parametrize("src", UNGUARDED.values(), ids=UNGUARDED.keys())
def test_reads_not_under_a_none_guard(src):
    assert _reads(_function(src)) == {1: False}


def test_unguarded_keeps_only_the_unguarded_reads():
    fn = _function(
        """
        def f(batch):
            a = READ1.seq_lens_cpu
            if batch.seq_lens_cpu is not None:
                b = READ2.seq_lens_cpu
        """
    )
    reads = primitives.find_all(fn, primitives.attr("seq_lens_cpu", m.Name(value=m.MatchRegex(r"READ\d+"))))
    assert [_code(r) for r in primitives.unguarded(fn, reads, ["seq_lens_cpu"])] == ["READ1.seq_lens_cpu"]


SUBJECT = "self.backend"


@pytest.mark.parametrize(
    "expr, expected",
    [
        ("isinstance(self.backend, A)", "isinstance(self.backend, A)"),
        (
            "cuda and (isinstance(self.backend, A) or isinstance(self.backend, B))",
            "isinstance(self.backend, A) or isinstance(self.backend, B)",
        ),
        (
            "cuda and (extra or (isinstance(self.backend, (A, B))) or f())",
            "extra or (isinstance(self.backend, (A, B))) or f()",
        ),
        ("(cuda or hip) and ((isinstance(self.backend, A)) or nsa)", "(isinstance(self.backend, A)) or nsa"),
        ("cuda and isinstance(other, A)", None),
        ("cuda and supported", None),
    ],
)
def test_find_isinstance_disjunction(expr, expected):
    found = primitives.find_isinstance_disjunction(cst.parse_expression(expr), SUBJECT)
    assert (None if found is None else _code(found.with_changes(lpar=[], rpar=[]))) == expected


@pytest.mark.parametrize(
    "expr, expected",
    [
        # All terms isinstance checks: one tuple, as before.
        (
            "cuda and (isinstance(self.backend, A) or isinstance(self.backend, B))",
            "cuda and isinstance(\n    self.backend,\n    (\n        A,\n        C,\n        B,\n    ),\n)",
        ),
        # Extra terms first or last stay, in order; the checks become one tuple where the first was.
        (
            "cuda and (nsa or isinstance(self.backend, A) or isinstance(self.backend, (B,)))",
            "cuda and (\n    nsa\n    or isinstance(\n        self.backend,\n        (\n            A,\n            C,\n            B,\n        ),\n    )\n)",
        ),
        (
            "isinstance(self.backend, (A, B)) or f(x)",
            "(\n    isinstance(\n        self.backend,\n        (\n            A,\n            C,\n            B,\n        ),\n    )\n    or f(x)\n)",
        ),
        # Already accepted: not repeated.
        (
            "isinstance(self.backend, (A, C))",
            "isinstance(\n    self.backend,\n    (\n        A,\n        C,\n    ),\n)",
        ),
    ],
)
def test_add_isinstance_classes(expr, expected):
    out = primitives.add_isinstance_classes(cst.parse_expression(expr), SUBJECT, ["C"], after="A")
    assert _code(out) == expected
    cst.parse_expression(_code(out))  # valid as written


def test_add_isinstance_classes_without_a_disjunction_is_an_anchor_error():
    with pytest.raises(primitives.AnchorError):
        primitives.add_isinstance_classes(cst.parse_expression("cuda and supported"), SUBJECT, ["C"])


def test_line_of():
    module = cst.parse_module("import x\n\n\nclass A:\n    def f(self):\n        return 1\n")
    fn = primitives.find_method(primitives.find_class(module, "A"), "f")
    assert primitives.line_of(module, fn) == 5
    assert primitives.line_of(module, primitives.find_all(fn, m.Return())[0]) == 6
    assert primitives.line_of(module, cst.Name("elsewhere")) is None


def test_line_of_is_libcsts_position_for_every_node():
    """line_of generates code only up to the node; it must agree with
    PositionProvider for every node, whitespace and hoisted starts included."""
    from libcst.metadata import MetadataWrapper, PositionProvider

    source = textwrap.dedent('''\
        # a comment
        import os


        @decorator(1)
        class A(Base):
            """doc"""

            x: int = (1 +
                      2)

            def f(self, a, *, b=[1, 2]):  # trailing
                if a and not b:
                    return {k: v for k, v in os.environ.items()}
                return lambda y: y.attr[0](b)
        ''')
    module = cst.parse_module(source)
    positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    nodes = list(positions)  # every node, whitespace too (searches never walk it: below)
    assert len(nodes) > 150
    assert [primitives.line_of(module, n) for n in nodes] == [positions[n].start.line for n in nodes]
    walked = list(primitives.search._walk(module))
    assert 50 < len(walked) < len(nodes) and not primitives.find_all(module, m.Comma() | m.Comment())
