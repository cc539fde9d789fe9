"""At the keyboard: colour on state words, errors and warnings (only on a
terminal, never with NO_COLOR, the text the same without it), progress bars."""

from __future__ import annotations

import importlib.resources
import io

import click
import pytest
from click.testing import CliRunner

from patchkit import registry, terminal
from patchkit.cli import main

HOOK = "trtllm-mha-overlap-hook"


@pytest.fixture
def only_hook(monkeypatch):
    text = (importlib.resources.files("patchkit.patches") / f"{HOOK}.toml").read_text(encoding="utf-8")
    patches = (registry._parse(text, f"{HOOK}.toml"),)
    monkeypatch.setattr(registry, "all_patches", lambda: patches)


def invoke(*args, color: bool = False):
    return CliRunner().invoke(main, [str(a) for a in args], color=color, catch_exceptions=False)


@pytest.mark.trees
def test_colour_only_on_state_words_and_never_with_no_color(make_tree, monkeypatch, only_hook):
    tree, twin = make_tree(), make_tree()  # the same steps on each: plain on one, coloured on the other
    for command in ("status", "apply", "status", "verify"):
        plain, coloured = invoke(command, tree), invoke(command, twin, color=True)
        assert "\x1b[" not in plain.stdout + plain.stderr, command  # piped: click drops it
        assert "\x1b[" in coloured.stdout + coloured.stderr, command
        # Colour is only ever added around words: stripped, the text is the same.
        stripped = [click.unstyle(text).replace(str(twin), str(tree)) for text in (coloured.stdout, coloured.stderr)]
        assert stripped == [plain.stdout, plain.stderr], command
        if command != "apply":  # read-only: run again under NO_COLOR
            monkeypatch.setenv("NO_COLOR", "1")
            again = invoke(command, twin, color=True)
            assert click.unstyle(coloured.stdout) == again.stdout and "\x1b[" not in again.stderr
            monkeypatch.delenv("NO_COLOR")
    assert click.style("applied", fg="green") in invoke("status", twin, color=True).stdout
    error = invoke("apply", "no-such-patch", color=True).stderr
    assert error.startswith("patchkit: " + click.style("error", fg="red", bold=True) + ": no-such-patch")
    monkeypatch.setenv("NO_COLOR", "1")
    assert "\x1b[" not in invoke("apply", "no-such-patch", color=True).stderr
    monkeypatch.setenv("NO_COLOR", "")  # no-color.org: set but empty is not set
    assert "\x1b[" in invoke("apply", "no-such-patch", color=True).stderr


def test_state_and_styled_pad_and_colour_words_only():
    assert terminal.state("absent", 10) == click.style("absent", fg="yellow") + "    "
    assert terminal.state("todo", 6) == "todo  "  # not a state word: as is
    assert terminal.styled("patchkit: error: x") == "patchkit: " + click.style("error", fg="red", bold=True) + ": x"
    assert terminal.styled("not applied: x: why") == "not applied: x: why"
    assert click.unstyle(terminal.styled("verify: FAILED (a)")) == "verify: FAILED (a)"


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_only_on_a_terminal_and_not_with_q():
    with terminal.progress_bar("work", quiet=False, file=io.StringIO()) as update:
        assert update is None
    with terminal.progress_bar("work", quiet=True, file=Tty()) as update:
        assert update is None
    stream = Tty()
    with terminal.progress_bar("work", quiet=False, file=stream) as update:
        assert stream.getvalue() == ""  # opened by the first call: cached work draws nothing
        update(0, 3)
        update(3, 3, "last")
    assert "work" in stream.getvalue() and "3/3" in stream.getvalue() and "last" in stream.getvalue()
