"""The ``patchkit`` command line."""

from __future__ import annotations

import json
import sys
from typing import Optional

import click

from patchkit import __version__, output, registry
from patchkit.engine import Outcome, locked_session
from patchkit.errors import EXIT_BAD_INPUT, EXIT_CHANGES, EXIT_OK, PatchkitError

EXIT_CODES = """\b
Exit codes:
  0  success: everything asked for is done (or already was)
  1  verification failed, changes needed (--check), or a patch was not applied
  2  bad input: not an sglang tree, unknown patch, syntax error, read-only
     file, corrupt state, lock timeout ... (one line on stderr, nothing changed)"""


class Ctx:
    def __init__(self, quiet: bool, verbose: bool) -> None:
        self.quiet, self.verbose = quiet, verbose

    def say(self, message: str) -> None:
        if not self.quiet:
            click.echo(message, err=True)


class PatchkitGroup(click.Group):
    """Turn every PatchkitError into one line on stderr and its exit code."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except PatchkitError as exc:
            click.echo(f"patchkit: error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("patchkit: interrupted", err=True)
            sys.exit(130)


tree_argument = click.argument("tree", type=click.Path(file_okay=True, dir_okay=True))
ids_argument = click.argument("ids", nargs=-1, metavar="[PATCH]...")


@click.group(cls=PatchkitGroup, epilog=EXIT_CODES, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-q", "--quiet", is_flag=True, help="Print only results and errors.")
@click.option("-v", "--verbose", is_flag=True, help="Show every check of every patch.")
@click.version_option(__version__, prog_name="patchkit")
@click.pass_context
def main(ctx: click.Context, quiet: bool, verbose: bool) -> None:
    """Carry upstream sglang speculative-decoding and TRT-LLM attention changes
    onto older releases and forks, with libcst codemods that revert exactly."""
    ctx.obj = Ctx(quiet, verbose)


@main.command("list", epilog=EXIT_CODES)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
def list_cmd(fmt: str) -> None:
    """List the patches patchkit carries."""
    patches = registry.all_patches()
    if fmt == "json":
        click.echo(json.dumps([output.patch_dict(p) for p in patches], indent=2))
        return
    width = max(len(p.id) for p in patches)
    for p in patches:
        req = f"  (requires {', '.join(p.requires)})" if p.requires else ""
        click.echo(f"{p.id:<{width}}  {', '.join(p.upstream):<24} {p.title}{req}")


@main.command(epilog=EXIT_CODES)
@tree_argument
@ids_argument
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@click.pass_obj
def status(obj: Ctx, tree: str, ids: tuple[str, ...], fmt: str) -> None:
    """Show each patch's state on TREE: absent, applied, native, partial or
    not-applicable (with the reason)."""
    with locked_session(tree, obj.say, write=False) as session:
        reports = session.reports(registry.select(ids) if ids else None)
    if fmt == "json":
        click.echo(output.status_json(session.tree, reports))
    else:
        click.echo(output.status_text(session.tree, reports, obj.verbose))


@main.command(epilog=EXIT_CODES)
@tree_argument
@ids_argument
@click.option("--skip", multiple=True, metavar="PATCH", help="Leave this patch out (repeatable).")
@click.option("--dry-run", is_flag=True, help="Write nothing; print the unified diff.")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if applying would change anything.")
@click.option("--diff", "show_diff", is_flag=True, help="Also print the unified diff of what is applied.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@click.pass_obj
def apply(obj: Ctx, tree: str, ids: tuple[str, ...], skip: tuple[str, ...], dry_run: bool, check: bool,
          show_diff: bool, fmt: str) -> None:
    """Apply patches (all by default) to TREE. A patch pulls in those it requires."""
    selected = registry.select(ids, skip)
    write = not (dry_run or check)
    with locked_session(tree, obj.say, write=write) as session:
        outcome = session.apply(selected, dry_run=not write)
    _finish(obj, session.tree, outcome, "apply", fmt, show_diff or dry_run, check, not write)


@main.command(epilog=EXIT_CODES)
@tree_argument
@ids_argument
@click.option("--cascade", is_flag=True, help="Also revert applied patches that require the named ones.")
@click.option("--force", is_flag=True, help="Discard edits made after apply that conflict with the revert.")
@click.option("--dry-run", is_flag=True, help="Write nothing; print the unified diff.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@click.pass_obj
def revert(obj: Ctx, tree: str, ids: tuple[str, ...], cascade: bool, force: bool, dry_run: bool, fmt: str) -> None:
    """Revert patches patchkit applied (all by default), byte for byte. Edits
    made after apply are kept by a 3-way merge, or the revert stops."""
    with locked_session(tree, obj.say) as session:
        outcome = session.revert(list(ids), cascade=cascade, force=force, dry_run=dry_run)
    _finish(obj, session.tree, outcome, "revert", fmt, dry_run, False, dry_run)


@main.command(epilog=EXIT_CODES)
@tree_argument
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@click.pass_obj
def verify(obj: Ctx, tree: str, fmt: str) -> None:
    """Check every patch's postconditions on TREE: each must be applied or
    native upstream. Exit 1 otherwise."""
    with locked_session(tree, obj.say, write=False) as session:
        reports = session.reports()
    failed = [r for r in reports if not r.ok]
    if fmt == "json":
        click.echo(output.status_json(session.tree, reports, ok=not failed))
    else:
        click.echo(output.status_text(session.tree, reports, obj.verbose))
        click.echo("verify: OK" if not failed else f"verify: FAILED ({', '.join(r.patch.id for r in failed)})")
    sys.exit(EXIT_CHANGES if failed else EXIT_OK)


@main.command(epilog=EXIT_CODES)
@tree_argument
@click.pass_obj
def diff(obj: Ctx, tree: str) -> None:
    """Print the unified diff between the original files and TREE now."""
    with locked_session(tree, obj.say, write=False) as session:
        click.echo(session.diff_against_original(), nl=False)


@main.command(epilog=EXIT_CODES)
@click.argument("version")
def fetch(version: str) -> None:
    """Download sglang==VERSION from the package registry into the cache and
    print the path of its pristine package folder (copy it before patching)."""
    from patchkit.fetch import fetch_tree

    click.echo(fetch_tree(version))


def _finish(obj: Ctx, tree, outcome: Outcome, verb: str, fmt: str, show_diff: bool, check: bool, dry: bool) -> None:
    for message in outcome.messages:
        obj.say(message)
    if fmt == "json":
        doc = {
            "schema": f"patchkit.{verb}/1",
            "tree": output.tree_dict(tree),
            "done": outcome.done,
            "skipped": [{"id": pid, "reason": why} for pid, why in outcome.skipped],
            "changed_files": sorted(outcome.changed),
            "diff": outcome.diff(tree),
        }
        click.echo(json.dumps(doc, indent=2))
    else:
        if show_diff:
            click.echo(outcome.diff(tree), nl=False)
        past = "applied" if verb == "apply" else "reverted"
        for pid in outcome.done:
            obj.say(f"{'would be ' if dry else ''}{past}: {pid}")
        for pid, why in outcome.skipped:
            obj.say(f"not {past}: {pid}: {why}")
        obj.say(f"{len(outcome.changed)} file(s) {'would change' if dry else 'changed'}")
    if outcome.skipped or (check and outcome.changed):
        sys.exit(EXIT_CHANGES)
