"""Running one codemod on a snippet the way the engine runs it, for codemod tests.

``assert_codemod(cls, before, after)``: TODO on ``before``, the whole output is
``after``, DONE on it (and on its reparse), and a second run changes nothing.
``assert_state(cls, src, state)``: the detector says ``state`` and, unless it
is TODO, running leaves ``src`` untouched. ``run``/``apply``/``detect`` for the
tests that look at parts of the output; ``run_all`` for several codemods of one
file. Snippets are dedented (``code``).

Imported as ``from codemod_testing import ...`` (tests/ is on sys.path).
"""

from __future__ import annotations

import textwrap
from typing import Optional

import libcst as cst
from libcst.codemod import CodemodContext

from patchkit.codemods.base import Finding, State
from patchkit.codemods.primitives import add_needed_imports


def code(src: str) -> str:
    """A snippet written indented in a test, as file text."""
    return textwrap.dedent(src).lstrip("\n")


def detect(codemod: type, src: str, filename: Optional[str] = None) -> Finding:
    """The finding on ``src``; with ``filename``, as the engine names the file
    (messages then say FILE:LINE)."""
    return codemod(CodemodContext(filename=filename)).detect(cst.parse_module(code(src)))


def run(codemod: type, src: str) -> tuple[State, str, State]:
    """(state before, code after, state after), as the engine runs a codemod:
    detect, transform when TODO, add the imports it asked for, detect again."""
    module = cst.parse_module(code(src))
    before = codemod().detect(module).state
    if before is State.TODO:
        context = CodemodContext()
        module = add_needed_imports(codemod(context).transform_module(module), context)
    return before, module.code, codemod().detect(module).state


def run_all(codemods: list[type], src: str) -> tuple[str, list[State]]:
    """Several codemods of one file, as the engine runs them: each TODO one
    transforms in order, the imports are added once, then every one detects.
    Returns (code after, [state after of each])."""
    module = cst.parse_module(code(src))
    context = CodemodContext()
    for codemod in codemods:
        if codemod().detect(module).state is State.TODO:
            module = codemod(context).transform_module(module)
    module = add_needed_imports(module, context)
    return module.code, [codemod().detect(module).state for codemod in codemods]


def apply(codemod: type, src: str) -> str:
    """The output of one TODO -> DONE run (DONE again on its reparse: idempotent)."""
    before, out, after = run(codemod, src)
    assert (before, after) == (State.TODO, State.DONE), (before, after)
    assert codemod().detect(cst.parse_module(out)).state is State.DONE
    return out


def assert_codemod(codemod: type, before: str, after: str) -> None:
    """``before`` becomes exactly ``after`` (the whole file), which is DONE and
    stays as it is when run again."""
    out = apply(codemod, before)
    assert out == code(after), "\n" + out
    assert_state(codemod, out, State.DONE)


def assert_state(codemod: type, src: str, state: State, detail: Optional[str] = None) -> Finding:
    """The detector says ``state`` (and ``detail`` is in its detail); a
    codemod that is not TODO leaves the source as it is."""
    finding = detect(codemod, src)
    assert finding.state is state, finding
    if detail is not None:
        assert detail in finding.detail, finding.detail
    if state is not State.TODO:
        again, out, after = run(codemod, src)
        assert (again, after) == (state, state) and out == code(src)
    return finding
