"""Snippet tests of tests/trees/test_transform_partial.py (no release read; the quick loop runs them)."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from patchkit import transform
from patchkit.codemods.common import base, method_guards, primitives
from patchkit.codemods.common.reads import Methods
from patchkit.findings import State
from patchkit.transform import partial

SOURCE = (
    b'''"""A module."""
import os


class A:
    def f(self):
        return 1


@decorated
class B:
    x = 1

    def keep(self):
        return os.sep

    @property
    def left(self):
        return 2
        # a comment of left's body


def helper():
'''
    + b"".join(b"    x%d = %d\n" % (i, i) for i in range(400))
    + b"""    return 3


class C:
  def g(self):
    return 4

  # indented comments at the end of the file: libcst's parser drops these
  # when they follow a statement at the top level (the skeleton's placeholder)
"""
)


def test_what_no_codemod_reads_is_kept_verbatim_and_the_bytes_are_the_files():
    module = partial.parse(SOURCE, {"B": _named("keep")})
    assert module is not None and module.bytes == SOURCE
    kinds = [type(s).__name__ for s in module.body]
    assert kinds == ["SimpleStatementLine", "SimpleStatementLine", "Verbatim", "ClassDef", "Verbatim", "Verbatim"]
    b = primitives.find_class(module, "B")
    assert [type(s).__name__ for s in b.body.body] == ["SimpleStatementLine", "FunctionDef", "Verbatim"]
    assert primitives.find_method(b, "keep") is not None and primitives.find_method(b, "left") is None
    assert primitives.find_class(module, "A") is None and primitives.find_function(module, "helper") is None
    # Lines are the file's: `keep` is at line 14 either way.
    whole = cst.parse_module(SOURCE)
    assert (
        primitives.line_of(module, primitives.find_method(b, "keep"))
        == 14
        == primitives.line_of(whole, primitives.find_method(primitives.find_class(whole, "B"), "keep"))
    )


def test_a_method_holding_a_word_read_is_parsed_and_the_others_are_kept_verbatim():
    module = partial.parse(SOURCE, {"B": Methods(words=frozenset({"os.sep"}))})
    assert module is not None and module.bytes == SOURCE
    b = primitives.find_class(module, "B")
    assert [type(s).__name__ for s in b.body.body] == ["SimpleStatementLine", "FunctionDef", "Verbatim"]
    assert primitives.is_definition(b.body.body[2])  # a layout that asks "is a def next?" sees one


def test_a_whole_parse_where_the_kept_code_is_indented_unlike_the_files_first_block():
    # The file's first block (A's, 4 spaces) is left out, and the kept class C
    # indents by 2: libcst would take 2 for the file's indentation (new code, and
    # every block it calls default-indented), so the whole file is parsed.
    assert partial.parse(SOURCE, {"C": None}) is None
    module = partial.parse(SOURCE, {"A": None})
    assert module is not None and module.default_indent == cst.parse_module(SOURCE).default_indent == "    "


@pytest.mark.parametrize(
    "source, reads",
    [
        (SOURCE, None),  # a codemod reads the whole module
        (SOURCE.replace(b"\n", b"\r\n"), {"B": None}),
        (SOURCE[:-1], {"B": None}),  # no final newline
        (b"\xef\xbb\xbf" + SOURCE, {"B": None}),
        (b"class A:\n    def f(self):\n        return 1\n", {}),  # too little left out to be worth it
        (b"class A(:\n", {}),  # the whole parse reports it
    ],
)
def test_a_whole_parse_where_the_shortcut_is_not_plainly_right(source, reads):
    assert partial.parse(source, reads) is None


class _Plain(base.MethodCodemod):
    CLASS, METHOD, RENAMED = "B", "keep", ("kept",)


class _WholeClass(base.ClassCodemod):
    CLASS = "B"

    def detect_in_class(self, cls):  # says nothing of what it reads: all of the class
        return super().detect_in_class(cls)


class _Declared(base.ClassCodemod):
    CLASS = "B"
    METHODS_READ, WORDS_READ = ("__init__",), ("os.sep",)

    def detect_in_class(self, cls):
        return super().detect_in_class(cls)


class _OverridesBelow(_Declared):
    def transform_class(self, cls):  # a hook of its own, undeclared: all of the class again
        return cls


class _Mixin:
    METHODS_READ = ("left",)

    def detect_in_class(self, cls):
        return super().detect_in_class(cls)


class _MixedIn(_Mixin, base.MethodCodemod):
    CLASS, METHOD = "B", "keep"


class _OwnDetect(base.ClassCodemod):
    CLASS = "B"

    def detect(self, module):
        return super().detect(module)


class _OwnFind(base.MethodCodemod):
    CLASS, METHOD = "B", "keep"

    def find_method(self, cls):
        return super().find_method(cls)


class _Guards(method_guards.MethodGuards):
    CLASS, METHOD, UPSTREAM_FUNCTION = "B", "keep", "moved_here"


def _named(*names: str) -> Methods:
    return Methods(frozenset(names))


def test_what_each_kind_of_codemod_reads():
    assert _Plain.reads() == {"B": _named("keep", "kept")}
    assert _WholeClass.reads() == {"B": None} and _OwnFind.reads() == {"B": None}
    assert _Declared.reads() == {"B": Methods(frozenset({"__init__"}), frozenset({"os.sep"}))}
    assert _OverridesBelow.reads() == {"B": None}
    assert type("Below", (_WholeClass,), {"METHODS_READ": ()}).reads() == {"B": None}  # _WholeClass's hook, undeclared
    assert _MixedIn.reads() == {"B": _named("left", "keep")}  # the mixin's and the method's
    assert _OwnDetect.reads() is None and base.PatchCodemod.reads() is None
    assert _Guards.reads() == {"B": _named("keep"), "moved_here": None}
    assert partial.names_read([_Plain, _Guards]) == {"B": _named("keep", "kept"), "moved_here": None}
    assert partial.names_read([_Plain, _WholeClass]) == {"B": None}
    assert partial.names_read([_Plain, _OwnDetect]) is None


def test_the_audit_parses_only_modules_that_may_load_a_mirror_attribute():
    from patchkit.audit.facts import reads_mirror

    for loads in (
        b"x.seq_lens_cpu",
        b"x . seq_lens_sum += 1",
        b"(x.\n  # why\n  seq_lens_cpu)",
        b"x.\\\n  seq_lens_cpu",
        b"# x.seq_lens_cpu  (a comment: a superset is fine)",
    ):
        assert reads_mirror(loads), loads
    for names in (b"seq_lens_cpu = batch", b"f(seq_lens_cpu=x)", b"x.seq_lens_cpu_copy", b"'seq_lens_cpu'"):
        assert not reads_mirror(names), names


def test_one_ast_parse_is_shared_and_only_where_bytes_and_text_parse_alike():
    from patchkit import python_ast

    data = b"def f():\n    return 1\n"
    assert python_ast.parse(data) is python_ast.parse(data)
    assert python_ast.plain_utf8(data) and python_ast.plain_utf8("x = 'é'\n".encode())
    for other in (
        b"# -*- coding: latin-1 -*-\nx = 1\n",
        b"#!/usr/bin/env python\n# coding=utf-8\n",
        b"\xef\xbb\xbfx = 1\n",
        b"x = '\xff'\n",
    ):
        assert not python_ast.plain_utf8(other), other
    with pytest.raises(SyntaxError):
        python_ast.parse(b"def (:\n")


class _Counting(base.MethodCodemod):
    CLASS, METHOD = "B", "keep"
    calls = 0

    def detect_in_method(self, fn):
        type(self).calls += 1
        return base.Finding.todo(self.anchor, f"first at {self.where(fn)}")


def test_between_two_edits_a_codemod_whose_class_is_untouched_is_not_asked_again(monkeypatch):
    module = cst.parse_module(SOURCE)
    other = module.with_changes(
        body=[
            s.with_changes(leading_lines=()) if type(s) is cst.ClassDef and s.name.value == "A" else s
            for s in module.body
        ]
    )
    assert transform._reads_unchanged(_Counting, module, other)  # only A changed
    changed_b = module.with_changes(
        body=[
            s.with_changes(leading_lines=()) if type(s) is cst.ClassDef and s.name.value == "B" else s
            for s in module.body
        ]
    )
    assert not transform._reads_unchanged(_Counting, module, changed_b)
    assert not transform._reads_unchanged(_OwnDetect, module, other)  # reads the whole module
    from libcst.codemod import CodemodContext

    codemod = _Counting(CodemodContext(filename="x.py"))
    assert codemod.detect(module).detail == "first at x.py:14"
    monkeypatch.setattr(primitives, "line_of", lambda *a: pytest.fail("a line computed for the state alone"))
    assert codemod.state_of(module) is State.TODO


class _AddsAMethod(base.AddMethodCodemod):
    CLASS, METHOD, SOURCE = "B", "added", "def added(self):\n    return 0\n"


def test_indented_comments_ending_a_file_are_never_lost():
    """libcst's parser drops indented comments that end a file after a
    top-level statement: the transform refuses rather than write the file
    without them."""
    from patchkit.errors import PatchkitError

    source = b"class B:\n    def keep(self):\n        return 1\n\n\nx = 1\n    # old code, kept as a comment\n"
    if cst.parse_module(source).bytes == source:  # a libcst that keeps them (1.9 does; 1.0 did not)
        new = transform.run("x.py", Path("x.py"), cst.parse_module(source), [_AddsAMethod], source=source).new
        assert b"def added" in new and new.endswith(b"x = 1\n    # old code, kept as a comment\n")
    else:
        with pytest.raises(PatchkitError, match=r"x.py:7: the indented comments that end this file would be lost"):
            transform.run("x.py", Path("x.py"), cst.parse_module(source), [_AddsAMethod], source=source)
    assert transform._trailing_comments_kept(source, b"x = 1\n") == 7  # what the refusal checks
    fine = source.replace(b"\n    # old", b"\n# old")
    assert b"def added" in transform.run("x.py", Path("x.py"), cst.parse_module(fine), [_AddsAMethod], source=fine).new
