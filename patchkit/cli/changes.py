"""The two commands that write: ``patchkit apply`` and ``patchkit revert``, and what
they print (their result lines, --check's verdicts, a dry run's diffstat).

:mod:`patchkit.cli` (the group) adds these two to it, beside the commands
that only read (:mod:`patchkit.cli.reading`).
"""

from __future__ import annotations

import sys
from typing import Optional

import click

from patchkit import api, output
from patchkit.arguments import (
    TREE_EPILOG,
    Ctx,
    PatchkitCommand,
    _complete_patches,
    diff_option,
    dry_run_option,
    format_option,
    tree_and_patches,
)
from patchkit.errors import EXIT_CHANGES


@click.command(cls=PatchkitCommand, epilog=TREE_EPILOG)
@tree_and_patches
@click.option(
    "--skip",
    multiple=True,
    metavar="PATCH",
    help="Leave this patch out (repeatable).",
    shell_complete=_complete_patches,
)
@click.option("--cascade", is_flag=True, help="With --skip: also leave out the patches that require a skipped one.")
@dry_run_option("applying")
@click.option(
    "--check",
    is_flag=True,
    help="Write nothing; exit 1 if applying would change the tree, listing the patches and files "
    "(as black --check; add --diff for the diff).",
)
@diff_option("is applied (with --dry-run, --check: would be)")
@click.option(
    "--runtime",
    type=click.Choice(["vendored", "package"]),
    default=None,
    help="Where patched code finds its runtime: vendored (default on a new tree) writes it into the "
    "tree as sglang/srt/_patchkit/, so the tree runs without patchkit; package forwards to the "
    "installed patchkit.runtime. Default: the mode the tree was patched with.",
)
@click.option(
    "--accept-vendor-code-risk",
    "accept_risk",
    is_flag=True,
    help="Download nothing for the vendor-code check (offline): files whose release bytes patchkit "
    "neither ships as hashes nor has cached are patched unchecked, and code your fork added "
    "there may be lost. Without it, an apply that cannot fetch the release changes nothing.",
)
@format_option("apply")
@click.pass_obj
def apply(
    obj: Ctx,
    args,
    skip: tuple[str, ...],
    cascade: bool,
    dry_run: bool,
    check: bool,
    show_diff: bool,
    runtime: Optional[str],
    accept_risk: bool,
    fmt: str,
) -> None:
    """Apply patches (all by default) to TREE. A patch pulls in those it requires.
    Also brings the tree's runtime folder up to date (a stale runtime is rewritten)."""
    given, ids = args
    with obj.progress("apply: transforming") as progress:
        result = _changing(
            obj,
            api.apply,
            given,
            ids,
            skip,
            dry_run=dry_run or check,
            cascade=cascade,
            runtime=runtime,
            say=obj.say,
            progress=progress,
            accept_vendor_code_risk=accept_risk,
        )
    try:
        _finish(obj, result, fmt, show_diff, check)
    finally:  # the last line: unguarded reads of the mirror in the vendor's own code (patchkit audit)
        if result.vendor_line:
            obj.say(result.vendor_line)


@click.command(cls=PatchkitCommand, epilog=TREE_EPILOG)
@tree_and_patches
@click.option("--cascade", is_flag=True, help="Also revert applied patches that require the named ones.")
@click.option(
    "--force",
    is_flag=True,
    help="Discard the edits made after apply that overlap a patch (the others stay; a copy is kept).",
)
@click.option(
    "--recover",
    is_flag=True,
    help="Every file back to its original from .patchkit/blobs alone (a corrupt journal or state).",
)
@dry_run_option("reverting")
@diff_option("is reverted (with --dry-run: would be)")
@format_option("revert")
@click.pass_obj
def revert(obj: Ctx, args, cascade: bool, force: bool, recover: bool, dry_run: bool, show_diff: bool, fmt: str) -> None:
    """Revert patches patchkit applied (all by default), byte for byte. Edits
    made after apply are kept by a 3-way merge, or the revert stops."""
    given, ids = args
    result = _changing(
        obj, api.revert, given, ids, cascade=cascade, force=force, dry_run=dry_run, say=obj.say, recover=recover
    )
    _finish(obj, result, fmt, show_diff, False)


def _changing(obj: Ctx, command, *args, **kwargs) -> "api.ChangeResult":
    """Run api.apply or api.revert, keeping its result where an interrupt
    finds it: once the transaction is committed, a Ctrl-C reports what was done."""
    try:
        result = command(*args, **kwargs)
    except api.InterruptedChange as exc:
        obj.change = exc.change
        raise
    obj.change = result
    return result


def _finish(obj: Ctx, result: "api.ChangeResult", fmt: str, show_diff: bool, check: bool) -> None:
    """apply's and revert's output. --check and --dry-run word their lines
    alike (``would apply: PATCH``, ``would add: PATH``); --check's go to
    stderr (as black --check's verdict), the others to stdout. A dry run
    prints a diffstat, and the diff only with --diff."""
    from patchkit.api.views import outcome_diffs

    outcome, tree = result.outcome, result.where.tree
    for message in outcome.messages:
        obj.say(message)
    if fmt == "json":
        obj.echo(output.outcome_json(result.verb, tree, outcome, result.where.given, result.dry))
    else:
        if show_diff:
            obj.echo(outcome.diff(tree), nl=False)
        print_line = obj.say if check else obj.result
        for line in output.outcome_lines(result.verb, outcome, result.dry):
            print_line(line)
        if check:
            for rel, (old, new) in sorted(outcome.changed.items(), key=lambda item: (item[1][0] is None, item[0])):
                verb = "would add" if old is None else "would remove" if new is None else "would change"
                obj.say(f"{verb}: {tree.shown_path(rel, result.where.given)}")
        elif result.dry and not show_diff:
            stat = output.diff_stat(outcome_diffs(tree, outcome))
            if stat:
                obj.echo(stat, nl=False)
        if not result.dry:
            obj.result(result.counts())
        elif outcome.changed:
            print_line(f"{len(outcome.done)} patch(es) would be {output.PAST[result.verb]}, {result.counts()}")
        elif not outcome.skipped:
            print_line(
                f"nothing to {result.verb}: "
                + (
                    "every patch is applied, native or not applicable"
                    if result.verb == "apply"
                    else "patchkit applied nothing to revert here"
                )
            )
    if outcome.skipped or (check and outcome.changed):
        sys.exit(EXIT_CHANGES)
