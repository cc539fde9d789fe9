"""The commands that only read the tree (or the registry, or the release
cache): ``list``, ``status``, ``verify``, ``audit``, ``diff``, ``show``,
``export``, ``matrix`` and ``fetch``. Each parses, calls ``patchkit.api`` and
prints what it returns; :mod:`patchkit.cli` puts them in the group."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import click

from patchkit import api, listing, output, registry, terminal, verify_output
from patchkit.arguments import (
    GIT_LAYOUT,
    TREE_EPILOG,
    Ctx,
    PatchkitCommand,
    _complete_patches,
    format_option,
    tree_and_patches,
    tree_only,
)
from patchkit.errors import EXIT_CHANGES, EXIT_OK


@click.command("list", cls=PatchkitCommand)
@format_option("patches", markdown="the README's patch table, from the definitions")
def list_cmd(fmt: str) -> None:
    """List the patches: patchkit's own and those of the patch sets it loads
    (which name where they come from). An id two patch sets define is listed
    twice, with a warning: other commands refuse it until one set goes."""
    loaded = registry.load()
    patches = loaded.patches + loaded.clashes
    click.echo({"json": listing.list_json, "markdown": listing.list_markdown}.get(fmt, listing.list_text)(patches))
    for problem in loaded.problems:
        click.echo(terminal.styled(f"patchkit: warning: {problem}"), err=True)


@click.command(cls=PatchkitCommand, verbose=True, epilog=TREE_EPILOG)
@tree_and_patches
@format_option("status")
@click.pass_obj
def status(obj: Ctx, args, fmt: str) -> None:
    """Show each patch's state on TREE: absent, applied, native, partial or
    not-applicable (with the reason). The first line names the tree."""
    given, ids = args
    result = api.status(given, ids, obj.say, announce=fmt != "text")
    tree = result.where.tree
    if fmt == "json":
        obj.echo(
            output.status_json(
                tree, result.reports, result.where.given, ok=result.ok, runtime=result.runtime, notes=result.notes
            )
        )
    else:
        obj.echo(output.status_text(tree, result.reports, obj.verbose, result.runtime, result.notes, obj.quiet))


@click.command(cls=PatchkitCommand, verbose=True, epilog=TREE_EPILOG)
@tree_and_patches
@click.option(
    "--format",
    "fmt",
    type=click.Choice(verify_output.FORMATS),
    default="text",
    help="text (default), json (patchkit.status/1), junit (XML, one testcase per patch) or github "
    "(Actions annotations at the broken anchor); see docs/ci.md.",
)
@click.pass_obj
def verify(obj: Ctx, args, fmt: str) -> None:
    """Check the postconditions of every patch (or the named ones and what they
    require) on TREE: each must be applied or native upstream (or superseded
    upstream). Exit 1 otherwise. The first line names the tree."""
    given, ids = args
    result = api.verify(given, ids, obj.say, announce=fmt != "text", audit=fmt in ("text", "json"))
    tree = result.where.tree
    obj.echo(
        verify_output.render(
            fmt,
            tree,
            result.reports,
            result.where.given,
            obj.verbose,
            result.runtime,
            result.notes,
            pending=result.pending is not None,
            audit_problems=result.audit_problems,
            quiet=obj.quiet,
        )
    )
    sys.exit(EXIT_OK if result.ok else EXIT_CHANGES)


@click.command(cls=PatchkitCommand, verbose="every read, not only the unguarded and stale ones", epilog=TREE_EPILOG)
@tree_only
@format_option("audit")
@click.option("--strict", is_flag=True, help="Exit 1 when a read is unguarded or stale.")
@click.pass_obj
def audit(obj: Ctx, tree: Optional[str], fmt: str, strict: bool) -> None:
    """List every read of the CPU seq_lens mirror (seq_lens_cpu, seq_lens_sum and
    the CUDA-graph runners' CPU buffers filled from them) on the spec-v2 paths of
    TREE, each guarded, patched, safe, unguarded (reads None once the mirror is
    dropped) or stale (reads a buffer no longer refreshed). Text shows the
    unguarded and stale ones (-v: all). Works on any tree; writes nothing."""
    report = api.audit(tree, obj.say)
    found, result = report.where.tree, report.result

    def paths(rel: str) -> str:
        return found.shown_path(rel, report.where.given)

    obj.echo(result.json(output.tree_dict(found), paths) if fmt == "json" else result.text(paths, obj.verbose))
    sys.exit(EXIT_CHANGES if strict and not result.ok else EXIT_OK)


@click.command(cls=PatchkitCommand, epilog=TREE_EPILOG)
@tree_and_patches
@click.option("--stat", is_flag=True, help="A diffstat per file and in all (as git diff --stat), not the diff.")
@click.option("--name-only", is_flag=True, help="Only the paths of the changed files, one a line.")
@click.pass_obj
def diff(obj: Ctx, args, stat: bool, name_only: bool) -> None:
    """Print the unified diff between the original files and TREE now: every
    file patchkit changed or added or, given PATCHes, the files those patches
    change (a file several patches change shows all of their changes). Paths
    are a/python/sglang/srt/..., as in an sglang git checkout, whatever the
    tree's layout: `git apply` takes the diff at a checkout's root (in a
    package folder: `git apply -p3`)."""
    if stat and name_only:
        raise click.UsageError("give at most one of --stat and --name-only")
    given, ids = args
    diffs = api.diff(given, ids, obj.say).diffs
    if stat:
        obj.echo(output.diff_stat(diffs), nl=False)
    else:
        obj.echo("".join(f"{d.path}\n" if name_only else d.text for d in diffs), nl=False)


@click.command(cls=PatchkitCommand, epilog=TREE_EPILOG)
@click.argument("patch", shell_complete=_complete_patches)
@tree_only
@click.option(
    "--diff",
    "show_diff",
    is_flag=True,
    help="Also print, as a unified diff, what applying PATCH (and what it requires) changes on TREE; "
    "where patchkit applied it already, what it changed. " + GIT_LAYOUT,
)
@format_option("show")
@click.pass_obj
def show(obj: Ctx, patch: str, tree: Optional[str], show_diff: bool, fmt: str) -> None:
    """Show one patch: title, upstream PRs, what it requires, where it comes
    from, its description, and per file what each codemod does. A TREE is
    read (never written) only with --diff."""
    if tree is not None and not show_diff:
        raise click.UsageError("a TREE is read only with --diff")
    result = api.show(patch, tree, show_diff, obj.say)
    if fmt == "json":
        obj.echo(output.show_json(result.patch, result.codemods, result.runtime, result.diff))
        return
    obj.echo(output.show_text(result.patch, result.codemods, result.runtime))
    if result.diff:
        obj.echo("")
        obj.echo(result.diff, nl=False)


@click.command(cls=PatchkitCommand, epilog=TREE_EPILOG)
@tree_only
@click.option(
    "-o",
    "--out",
    "out",
    type=click.Path(file_okay=False),
    help="Folder for NNNN-<patch>.patch files and a quilt series file.",
)
@click.option("--stdout", "to_stdout", is_flag=True, help="Print the series as one mbox on stdout instead.")
@click.option(
    "--author",
    default=None,
    metavar="'NAME <EMAIL>'",
    help="From: of every patch (default: patchkit <patchkit@invalid>).",
)
@format_option("export")
@click.pass_obj
def export(obj: Ctx, tree: Optional[str], out: Optional[str], to_stdout: bool, author: Optional[str], fmt: str) -> None:
    """Write the change patchkit applied to TREE as a git format-patch series,
    one patch per patchkit patch in dependency order, with a/python/sglang/...
    paths: `git am DIR/*.patch` on a pristine checkout reproduces the patched
    tree byte for byte. Patches that are native upstream are not exported.
    The Date: is now, or SOURCE_DATE_EPOCH when set."""
    from patchkit.api.exporting import write_series

    if bool(out) == to_stdout:
        raise click.UsageError("give exactly one of --out DIR or --stdout")
    with obj.progress("export: transforming") as progress:
        result = api.export(tree, author, obj.say, progress)
    series = result.series
    if to_stdout or out is None:
        obj.echo(series.mbox(), nl=False)
        return
    written = write_series(series, Path(out), result.where.tree) if series.patches else []
    if fmt == "json":
        obj.echo(output.export_json(result.where.tree, out, series, written))
        return
    if not series.patches:
        obj.say("nothing to export: patchkit applied no patch to this tree")
    for written_path in written:
        obj.echo(str(written_path))


@click.command(cls=PatchkitCommand)
@click.argument("releases", nargs=-1, metavar="[RELEASE]...")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=1, help="Releases run in parallel processes.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["markdown", "json"]),
    default="markdown",
    help="markdown: the release x patch table (default); json: the whole result as one document.",
)
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the table here instead of stdout.")
@click.pass_obj
def matrix(obj: Ctx, releases: tuple[str, ...], jobs: int, fmt: str, output: Optional[str]) -> None:
    """Run status, apply, verify, apply again and revert of every patch on
    copies of sglang releases (default: 0.5.10 ... 0.5.23, fetched and cached)
    and print a release x patch table: state after apply, files changed, verify,
    idempotence, exact revert (sha256 of every file). A progress bar goes to
    stderr on a terminal (not with -q). Exit 1 if any release fails any of these."""
    from patchkit.api import matrix as mx

    with obj.progress("matrix") as progress:
        doc = mx.run_matrix(releases or mx.DEFAULT_RELEASES, jobs, progress)
    text = mx.to_markdown(doc) if fmt == "markdown" else mx.to_json(doc)
    if output:
        with open(output, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        click.echo(text, nl=False)
    sys.exit(EXIT_OK if doc["ok"] else EXIT_CHANGES)


@click.command(cls=PatchkitCommand)
@click.argument("version")
def fetch(version: str) -> None:
    """Download sglang==VERSION from the package registry into the cache
    ($PATCHKIT_CACHE_DIR) and print the path of its pristine package folder
    (copy it before patching)."""
    from patchkit.fetch import fetch_tree

    click.echo(fetch_tree(version, fallback=False))
