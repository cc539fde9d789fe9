"""At the keyboard: colour on state words, errors and warnings (only on a
terminal, never with NO_COLOR, the text the same without it), -q and -v alike
on every command, --check and --dry-run worded alike, progress bars."""

from __future__ import annotations

import importlib.resources
import io

import click
import pytest
from click.testing import CliRunner

from patchkit import registry, terminal
from patchkit.cli import QUIET_HELP, main

HOOK = "trtllm-mha-overlap-hook"
COMMANDS = ("list", "status", "apply", "revert", "verify", "audit", "diff", "show", "export", "matrix", "fetch")


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


def test_state_and_styled_colour_words_only():
    assert terminal.state("absent") == click.style("absent", fg="yellow")
    assert terminal.state("todo") == "todo"  # not a state word: as is
    assert terminal.styled("patchkit: error: x") == "patchkit: " + click.style("error", fg="red", bold=True) + ": x"
    assert terminal.styled("not applied: x: why") == "not applied: x: why"
    assert click.unstyle(terminal.styled("verify: FAILED (a)")) == "verify: FAILED (a)"


def test_q_and_v_mean_the_same_on_every_command():
    group = invoke("--help").stdout
    assert QUIET_HELP in " ".join(group.split())
    for command in COMMANDS:
        text = " ".join(invoke(command, "--help").stdout.split())
        assert f"-q, --quiet {QUIET_HELP}" in text, command
        assert "-v, --verbose Add detail to the results" in text, command
    assert "every check of every patch" in " ".join(invoke("status", "--help").stdout.split())
    assert "accepted, no effect" in " ".join(invoke("list", "--help").stdout.split())
    # Accepted harmlessly where there is no detail to add, before or after the name.
    assert invoke("list", "-v").stdout == invoke("-v", "list").stdout == invoke("list").stdout


@pytest.mark.trees
def test_q_prints_only_results_and_errors(make_tree, only_hook):
    tree = make_tree()
    quiet = invoke("apply", "-q", tree)  # the results (what was applied) on stdout; no diagnostics
    assert quiet.exit_code == 0 and quiet.stderr == "", quiet.stderr
    assert quiet.stdout.splitlines()[-1].startswith("1 file(s) changed") and "applied: " in quiet.stdout
    loud = invoke("status", tree)
    # The results stay; the tree line and the "patched by" line go (docs/ci.md, issue 54).
    kept = [
        x
        for x in loud.stdout.splitlines(keepends=True)
        if not x.startswith("sglang ") and not x.startswith("  patched by patchkit")
    ]
    assert len(kept) == len(loud.stdout.splitlines()) - 2
    assert invoke("-q", "status", tree).stdout == "".join(kept)
    assert invoke("status", "-v", tree).stdout.startswith(loud.stdout.splitlines()[0])
    assert len(invoke("status", "-v", tree).stdout) > len(loud.stdout)
    error = invoke("-q", "apply", "no-such-patch")
    assert error.exit_code == 2 and error.stderr.startswith("patchkit: error:")


def test_check_and_dry_run_worded_alike():
    def option_help(command: str, option: str) -> str:
        text = " ".join(invoke(command, "--help").stdout.split())
        return text.split(f" {option} ", 1)[1].split(" --", 1)[0]

    apply_dry, revert_dry, check = (
        option_help("apply", "--dry-run"),
        option_help("revert", "--dry-run"),
        option_help("apply", "--check"),
    )
    assert apply_dry.replace("applying", "reverting") == revert_dry
    assert apply_dry.startswith("Write nothing; ") and check.startswith("Write nothing; ")
    assert "applying would change" in apply_dry and "applying would change" in check


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
