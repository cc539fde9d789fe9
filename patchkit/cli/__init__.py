"""The ``patchkit`` command line: parse, call ``patchkit.api``, print what it
returns. This is the group (its options, the registry it loads, SIGTERM);
the commands are ``patchkit.cli.reading`` (those that only read) and
``patchkit.cli.changes`` (apply and revert, the commands that write).
Documents are built in ``patchkit.output``; the shared arguments, options
and error handling are ``patchkit.arguments``."""

from __future__ import annotations

import signal

import click

from patchkit import __version__, registry, settings
from patchkit.arguments import COMPLETION, QUIET_HELP, TREE_EPILOG, VERBOSE_HELP, Ctx, PatchkitGroup
from patchkit.cli import changes, reading
from patchkit.errors import Interrupted


@click.group(
    cls=PatchkitGroup,
    epilog=f"{TREE_EPILOG}\n\n{settings.epilog()}\n\n{COMPLETION}",
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.option("-q", "--quiet", is_flag=True, help=QUIET_HELP)
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    help=VERBOSE_HELP.format(
        detail=" (status, verify: every check of every patch; audit: every read; other commands: none)"
    ),
)
@click.option(
    "--patches",
    "patch_dirs",
    multiple=True,
    type=click.Path(file_okay=False),
    metavar="DIR",
    help="Also load the patch set in DIR: its *.toml and their codemod modules (repeatable). Installed "
    "sets (entry points in patchkit.patches) load too; sets named by [tool.patchkit] patches in a "
    "pyproject.toml of the tree's repository load on apply and revert only; see docs/writing-a-patch.md.",
)
@click.version_option(__version__, prog_name="patchkit")
@click.pass_context
def main(ctx: click.Context, quiet: bool, verbose: bool, patch_dirs: tuple[str, ...]) -> None:
    """Carry upstream sglang speculative-decoding and TRT-LLM attention changes
    onto older releases and forks, with libcst codemods that revert exactly."""
    ctx.obj = Ctx(quiet, verbose)
    settings.check()
    for note in settings.deprecations():
        ctx.obj.say(f"patchkit: note: {note}")
    registry.reset()
    registry.use_folders(patch_dirs, "--patches")
    # A caller that runs commands in-process (tests, a Python host) gets the
    # registry back as it was: the next library call sees no set a command named.
    ctx.call_on_close(registry.reset)
    # SIGTERM ends a run like Ctrl-C does (exit 143, not a bare kill); inside
    # a transaction both wait for its end (patchkit.state.held_signals).
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminate)


def _terminate(signum: int, frame) -> None:
    raise Interrupted(signum)


for command in (
    changes.apply,
    changes.revert,
    reading.list_cmd,
    reading.status,
    reading.verify,
    reading.audit,
    reading.diff,
    reading.show,
    reading.export,
    reading.matrix,
    reading.fetch,
):
    main.add_command(command)
