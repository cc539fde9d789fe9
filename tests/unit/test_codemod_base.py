"""The method-level codemod base (MethodCodemod): finding the method under any
of its names, why it may be absent, and messages that say where."""

from __future__ import annotations

import libcst as cst

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import Finding, MethodCodemod, State
from patchkit.testing import assert_codemod, assert_state, detect


class AddsReturnNone(MethodCodemod):
    """A toy change: ``step`` (``run`` in older releases) ends with ``return None``."""

    DESCRIPTION = "Worker.step ends with return None"
    CLASS = "Worker"
    METHOD = "step"
    RENAMED = ("run",)

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        if primitives.contains(fn, cst.matchers.Return()):
            return Finding.done(self.anchor_of(fn))
        if primitives.contains(fn, cst.matchers.Pass()):
            return self.missing_in(fn, "a bare `pass`", "a statement to append to", fn.body.body[0])
        return Finding.todo(self.anchor_of(fn), "no return")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        return primitives.insert_at_end(fn, "return None")


class OptionalStep(AddsReturnNone):
    WHY_ABSENT = "no step in releases before 1.0"


def test_the_method_under_its_older_name():
    assert_codemod(
        AddsReturnNone,
        """
        class Worker:
            def run(self):
                self.go()
        """,
        """
        class Worker:
            def run(self):
                self.go()
                return None
        """,
    )


def test_an_absent_method_is_missing_or_superseded_with_its_reason():
    src = "import os\n\nclass Worker:\n    def other(self):\n        pass\n"
    finding = detect(AddsReturnNone, src, filename="srt/worker.py")
    assert finding == Finding.missing("Worker.step", "srt/worker.py:3: class Worker defines none of step, run").at(3)
    assert_state(OptionalStep, src, State.SUPERSEDED, detail="no step in releases before 1.0")
    assert detect(AddsReturnNone, "class Other:\n    pass\n").detail == "class Worker not found"


def test_missing_inside_the_method_names_file_line_shape_and_need():
    src = "class Worker:\n    def step(self):\n        pass\n"
    assert detect(AddsReturnNone, src, filename="srt/worker.py").detail == (
        "srt/worker.py:3: a bare `pass`; the patch needs a statement to append to"
    )
    assert detect(AddsReturnNone, src).detail == "line 3: a bare `pass`; the patch needs a statement to append to"


def test_cached_findings_of_earlier_versions_still_read():
    assert Finding.from_list(["done", "A.b", "why"]) == Finding.done("A.b", "why")
    assert Finding.from_list(["todo", "A.b", "why", False]) == Finding.todo("A.b", "why")
    finding = Finding.superseded("A.b", "fork", by_tree=True)
    assert Finding.from_list(finding.as_list()) == finding


def test_a_cached_finding_keeps_its_line():
    finding = detect(AddsReturnNone, "import os\n\nclass Worker:\n    def step(self):\n        self.go()\n")
    assert finding.line == 4
    assert finding.as_list() == ["todo", "Worker.step", "no return", False, 4]
    assert Finding.from_list(finding.as_list()) == finding
    moot = Finding.superseded("A.b", "never runs here", moots_patch=True)
    assert Finding.from_list(moot.as_list()) == moot


SRC = """\
import os


class Worker:
    # steps

    @staticmethod
    def step(self):
        {body}
"""


def test_findings_carry_the_line_of_their_anchor():
    # To do: the method's line (its def, not its decorator or comments).
    assert detect(AddsReturnNone, SRC.format(body="self.go()")).line == 8
    # Missing inside the method: the method, as for the old anchor lookup.
    assert detect(AddsReturnNone, SRC.format(body="pass")).line == 8
    # An absent method: the class it should be in; no class: no line.
    assert detect(AddsReturnNone, SRC.replace("def step", "def other").format(body="pass")).line == 4
    assert detect(AddsReturnNone, "class Other:\n    pass\n").line is None
    # Done: never reported at a line, so none is computed.
    assert detect(AddsReturnNone, SRC.format(body="return 1")).line is None
