"""The command line's shared parts: help texts, the per-run ``Ctx`` (where
diagnostics and results go), the group and command classes (every error one
line with its exit code; ``-q``/``-v`` on every command), the
``[TREE] [PATCH]...`` arguments with their shell completion, and the options
several commands share. ``patchkit.cli`` defines the commands with them."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import Any

import click

from patchkit import registry, terminal
from patchkit.errors import Interrupted, PatchkitError, interrupt_in

EXIT_CODES = """\b
Exit codes:
  0  success: everything asked for is done (or already was)
  1  verification failed, changes needed (--check), a patch was not
     applied, or a matrix release failed
  2  bad input: not an sglang tree, unknown patch, syntax error, read-only
     file, corrupt state, lock timeout ... (one line on stderr, nothing changed)
  130, 143  interrupted by Ctrl-C (SIGINT), SIGTERM: the tree as before, or
     fully changed if a transaction was writing it"""

TREE_HELP = """\b
TREE (optional; default: the current folder) is an sglang git checkout, its
python/ folder, the sglang/ package folder, an installed site-packages/sglang,
or any folder inside one: patchkit looks upward, as git looks for .git.
A first argument that exists on disk or reads as a path (., ~/x, a/b) is the
TREE; otherwise every argument is a PATCH id."""

COMPLETION = """\b
Shell completion (bash; zsh and fish alike, with zsh_source / fish_source):
  eval "$(_PATCHKIT_COMPLETE=bash_source patchkit)\""""

TREE_EPILOG = f"{EXIT_CODES}\n\n{TREE_HELP}"


class Say:
    """Where a command's diagnostics go (stderr; none with -q). The tree
    line (``patchkit.api.locate``'s "sglang X at P") is held, not printed:
    it goes out just before the command's first other output, so a command
    that fails prints its one error line alone."""

    def __init__(self, ctx: "Ctx") -> None:
        self.ctx = ctx
        self.held: str | None = None

    def __call__(self, message: str) -> None:
        self.release()
        if not self.ctx.quiet:
            click.echo(terminal.styled(message), err=True)

    def tree_line(self, message: str) -> None:
        if not self.ctx.quiet:
            self.held = message

    def release(self) -> None:
        """Print the held tree line, if any (before any other output)."""
        held, self.held = self.held, None
        if held is not None:
            click.echo(terminal.styled(held), err=True)

    def drop(self) -> None:
        """An error ends the command: its line stands alone."""
        self.held = None


class Ctx:
    def __init__(self, quiet: bool, verbose: bool) -> None:
        self.quiet, self.verbose = quiet, verbose
        self.say = Say(self)
        # apply/revert's ChangeResult once its transaction is committed: what
        # a Ctrl-C after that point reports (report_interrupt).
        self.change: Any = None  # a patchkit.api.ChangeResult: named loosely, the CLI's helpers stand below the api

    def result(self, message: str) -> None:
        """A result line (what was applied, reverted): stdout, also with -q."""
        self.say.release()
        click.echo(terminal.styled(message))

    def echo(self, text: str, nl: bool = True) -> None:
        """A command's main output (a document, a diff) on stdout, after the tree line."""
        self.say.release()
        click.echo(text, nl=nl)

    def progress(self, label: str):
        """A progress bar's ``(done, total)`` callback, as a context manager:
        None where there is nothing to draw (stderr not a terminal, -q)."""
        return terminal.progress_bar(label, self.quiet)


def _usage_error(exc: click.UsageError):
    """A usage error as one line naming the argument, exit 2 (click prints
    usage lines and a blank one); ``patchkit`` alone still shows the help."""
    if isinstance(exc, getattr(click.exceptions, "NoArgsIsHelpError", ())):  # click 8.2+
        raise exc
    path = exc.ctx.command_path if exc.ctx is not None else "patchkit"
    message = " ".join(exc.format_message().split())
    click.echo(terminal.styled(f"patchkit: error: {message} (see `{path} -h`)"), err=True, color=terminal.color())
    sys.exit(exc.exit_code)


class PatchkitGroup(click.Group):
    """Turn every PatchkitError and usage error into one line on stderr and its exit code."""

    def make_context(self, info_name, args, parent=None, **extra):
        extra.setdefault("color", terminal.color())  # NO_COLOR: every echo below drops colour
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as exc:
            _usage_error(exc)

    def invoke(self, ctx: click.Context):
        try:
            result = super().invoke(ctx)
        except click.UsageError as exc:
            _drop_tree_line(ctx)
            _usage_error(exc)
        except PatchkitError as exc:
            _drop_tree_line(ctx)
            click.echo(terminal.styled(f"patchkit: error: {exc}"), err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("patchkit: interrupted (nothing was being written)", err=True)
            sys.exit(130)
        except Interrupted as exc:
            # Raised by patchkit's handlers, or at the end of a transaction the signal waited for.
            report_interrupt(ctx.obj, exc.signum)
            sys.exit(128 + exc.signum)
        except Exception as exc:
            interrupt = interrupt_in(exc)  # wrapped on its way (errors.interrupt_in)
            if interrupt is None:
                raise
            report_interrupt(ctx.obj, interrupt.signum)
            sys.exit(128 + interrupt.signum)
        except SystemExit:
            _release_tree_line(ctx)
            raise
        _release_tree_line(ctx)
        return result


def report_interrupt(obj: Any, signum: int) -> None:
    """Say what a SIGINT or SIGTERM left: an apply or revert whose
    transaction was committed before it (the signal waited for the commit, or
    came after) prints its results and that all was done; otherwise nothing
    was changed (a transaction never ends half-written)."""
    from patchkit.output import PAST, outcome_lines

    name = signal.Signals(signum).name
    change = getattr(obj, "change", None)
    if change is None or change.dry or not (change.outcome.changed or change.outcome.done):
        click.echo(f"patchkit: interrupted by {name}: nothing changed", err=True)
        return
    for line in outcome_lines(change.verb, change.outcome, False):
        obj.result(line)
    obj.result(change.counts())
    done, past = change.outcome.done, PAST[change.verb]
    what = (
        f"all {len(done)} patches were {past}"
        if len(done) > 1
        else f"{done[0]} was {past}"
        if done
        else "the tree was fully updated"
    )
    click.echo(f"patchkit: interrupted by {name}: {what} before the interrupt", err=True)


def _drop_tree_line(ctx: click.Context) -> None:
    if isinstance(ctx.obj, Ctx):
        ctx.obj.say.drop()


def _release_tree_line(ctx: click.Context) -> None:
    if isinstance(ctx.obj, Ctx):
        ctx.obj.say.release()


def _quiet_or_verbose(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        setattr(ctx.obj, param.name, True)


# -q and -v mean one thing on every command, before its name or after it.
QUIET_HELP = "Print only results and errors: no notes, no progress bar."
VERBOSE_HELP = "Add detail to the results{detail}."
VERBOSE_DETAIL = {True: ": every check of every patch", False: " (this command has none to add: accepted, no effect)"}


class PatchkitCommand(click.Command):
    """A subcommand that also takes ``-q`` and ``-v`` after its name, as
    ``git commit -q`` and ``ruff check -q`` do (same meaning as before it).
    ``verbose``: True where -v shows every check of every patch, or what it
    adds in words; False (it adds nothing) still accepts it."""

    def __init__(self, *args, verbose: bool | str = False, **kwargs) -> None:
        kwargs.setdefault("epilog", EXIT_CODES)
        super().__init__(*args, **kwargs)
        detail = f": {verbose}" if isinstance(verbose, str) else VERBOSE_DETAIL[verbose]
        self.params.append(
            click.Option(
                ["-q", "--quiet"], is_flag=True, expose_value=False, callback=_quiet_or_verbose, help=QUIET_HELP
            )
        )
        self.params.append(
            click.Option(
                ["-v", "--verbose"],
                is_flag=True,
                expose_value=False,
                callback=_quiet_or_verbose,
                help=VERBOSE_HELP.format(detail=detail),
            )
        )


PatchkitGroup.command_class = PatchkitCommand


def _complete_patches(ctx: click.Context, param: click.Parameter, incomplete: str):
    """Shell completion (bash, zsh, fish) of patch ids not given yet; the
    first ``[TREE] [PATCH]...`` argument also completes folders: by the
    shell where it reads as a path (``./``, ``~/``, ``a/``), else as names."""
    from click.shell_completion import CompletionItem

    value: Any = ctx.params.get(param.name or "") or ()
    if param.name == "args":  # (TREE or None, ids), as _split_tree left it
        tree, ids = value if len(value) == 2 and not isinstance(value[1], str) else (None, value)
        given, first = set(ids), tree is None and not ids
    else:
        given, first = set(value) if param.multiple else set(), False
    if first and (os.sep in incomplete or incomplete.startswith((".", "~"))):
        return [CompletionItem(incomplete, type="dir")]
    try:  # the sets a command would load (click completes without running main)
        registry.use_folders(ctx.find_root().params.get("patch_dirs") or (), "--patches")
        ids = [p.id for p in registry.load().patches]
    except PatchkitError:  # completion never prints an error
        ids = []
    finally:
        registry.reset()
    items = [CompletionItem(i) for i in ids if i.startswith(incomplete) and i not in given]
    if first:
        with contextlib.suppress(OSError):
            items += [
                CompletionItem(f"{e.name}/")
                for e in sorted(os.scandir("."), key=lambda e: e.name)
                if e.name.startswith(incomplete) and not e.name.startswith(".") and e.is_dir()
            ]
    return items


def _split_tree(ctx: click.Context, param: click.Parameter, args: tuple[str, ...]):
    """``[TREE] [PATCH]...``: the first argument is the TREE when it names
    something on disk or reads as a path (``.``, ``~/x``, has a ``/``);
    otherwise all are patch ids and the tree is found from the current folder."""
    if args and (os.path.exists(args[0]) or os.sep in args[0] or args[0].startswith((".", "~"))):
        return args[0], args[1:]
    if args and not ctx.resilient_parsing and args[0] not in {p.id for p in registry.all_patches()}:
        raise PatchkitError(
            f"{args[0]}: no tree there (no such file or folder) and no patch of that name "
            f"(patches: {', '.join(p.id for p in registry.all_patches())})"
        )
    return None, args


tree_and_patches = click.argument(
    "args", nargs=-1, metavar="[TREE] [PATCH]...", callback=_split_tree, shell_complete=_complete_patches
)
tree_only = click.argument("tree", required=False, metavar="[TREE]", type=click.Path())


GIT_LAYOUT = (
    "Diffs name files as an sglang git checkout has them (a/python/sglang/srt/...), whatever the "
    "tree's layout, so that `git apply` takes them at a checkout's root (in a package folder: "
    "`git apply -p3`)."
)


def dry_run_option(doing: str):
    """--dry-run, worded as --check is: what it writes, then what it prints."""
    return click.option(
        "--dry-run",
        is_flag=True,
        help=f"Write nothing; print what {doing} would change in the tree: a line per patch, "
        "a diffstat and the counts (--diff: the unified diff instead of the diffstat).",
    )


def diff_option(what: str):
    return click.option(
        "--diff", "show_diff", is_flag=True, help=f"Also print the unified diff of what {what}. {GIT_LAYOUT}"
    )


def format_option(schema: str, *, markdown: str = ""):
    """``--format text|json``; ``markdown`` (its help) adds a third choice."""
    choices = ["text", "json"] + (["markdown"] if markdown else [])
    extra = f"; markdown: {markdown}" if markdown else ""
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(choices),
        default="text",
        help=f"text for people (default) or json: the patchkit.{schema}/1 document (docs/ci.md){extra}.",
    )
