"""The ``patchkit`` command line."""

from __future__ import annotations

import json
import signal
import sys
from typing import Optional

import click

from patchkit import __version__, output, registry, settings
from patchkit.engine import Outcome, locked_session
from patchkit.errors import EXIT_BAD_INPUT, EXIT_CHANGES, EXIT_OK, PatchkitError
from patchkit.state import Interrupted

EXIT_CODES = """\b
Exit codes:
  0  success: everything asked for is done (or already was)
  1  verification failed, changes needed (--check), a patch was not
     applied, or a matrix release failed
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
            click.echo("patchkit: interrupted (nothing was being written)", err=True)
            sys.exit(130)
        except Interrupted as exc:
            # Raised at the end of a transaction the signal waited for.
            click.echo(f"patchkit: interrupted by {signal.Signals(exc.signum).name}", err=True)
            sys.exit(128 + exc.signum)


def _quiet_or_verbose(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        setattr(ctx.obj, param.name, True)


class PatchkitCommand(click.Command):
    """A subcommand that also takes ``-q``/``-v`` after its name, as
    ``git commit -q`` and ``ruff check -q`` do (same meaning as before it)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.params += [
            click.Option(["-q", "--quiet"], is_flag=True, expose_value=False, callback=_quiet_or_verbose,
                         help="Print only results and errors."),
            click.Option(["-v", "--verbose"], is_flag=True, expose_value=False, callback=_quiet_or_verbose,
                         help="Show every check of every patch."),
        ]


PatchkitGroup.command_class = PatchkitCommand

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
    settings.check()
    # SIGTERM ends a run like Ctrl-C does (exit 143, not a bare kill); inside
    # a transaction both wait for its end (patchkit.state.held_signals).
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminate)


def _terminate(signum: int, frame) -> None:
    raise Interrupted(signum)


def _refuse_pending(session) -> None:
    """Commands that read the tree's content refuse a half-written one."""
    if session.snapshot.pending is not None:
        raise PatchkitError(session.snapshot.pending.line())


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
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              help="json: the patchkit.status/1 document verify writes (docs/ci.md).")
@click.pass_obj
def status(obj: Ctx, tree: str, ids: tuple[str, ...], fmt: str) -> None:
    """Show each patch's state on TREE: absent, applied, native, partial or
    not-applicable (with the reason)."""
    with locked_session(tree, obj.say) as session:
        reports = session.reports(registry.select(ids) if ids else None)
    if fmt == "json":
        locator = output.Locator(session.tree, tree)
        click.echo(output.status_json(session.tree, reports, locator, ok=_ok(session, reports),
                                      runtime=session.runtime_info(), notes=session.snapshot.notes()))
    else:
        click.echo(output.status_text(session.tree, reports, obj.verbose, session.runtime_info(), session.snapshot.notes()))


@main.command(epilog=EXIT_CODES)
@tree_argument
@ids_argument
@click.option("--skip", multiple=True, metavar="PATCH", help="Leave this patch out (repeatable).")
@click.option("--dry-run", is_flag=True, help="Write nothing; print the unified diff.")
@click.option("--check", is_flag=True,
              help="Write nothing; exit 1 if applying would change anything, listing the patches and files "
                   "(like black --check; add --diff for the diff).")
@click.option("--diff", "show_diff", is_flag=True, help="Also print the unified diff of what is applied.")
@click.option("--runtime", type=click.Choice(["vendored", "package"]), default=None,
              help="Where patched code finds its runtime: vendored (default on a new tree) writes it into the "
                   "tree as sglang/srt/_patchkit/, so the tree runs without patchkit; package forwards to the "
                   "installed patchkit.runtime. Default: the mode the tree was patched with.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@click.pass_obj
def apply(obj: Ctx, tree: str, ids: tuple[str, ...], skip: tuple[str, ...], dry_run: bool, check: bool,
          show_diff: bool, runtime: Optional[str], fmt: str) -> None:
    """Apply patches (all by default) to TREE. A patch pulls in those it requires.
    Also brings the tree's runtime folder up to date (a stale runtime is rewritten)."""
    from patchkit.apply import apply_patches

    selected = registry.select(ids, skip)
    write = not (dry_run or check)
    with locked_session(tree, obj.say, "apply" if write else None) as session:
        _refuse_pending(session)
        outcome = apply_patches(session, selected, dry_run=not write, runtime=runtime)
    _finish(obj, session.tree, outcome, "apply", fmt, show_diff or dry_run, check, not write, tree)


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
    from patchkit.revert import revert_patches

    with locked_session(tree, obj.say, None if dry_run else "revert") as session:
        _refuse_pending(session)
        outcome = revert_patches(session, list(ids), cascade=cascade, force=force, dry_run=dry_run)
    _finish(obj, session.tree, outcome, "revert", fmt, dry_run, False, dry_run, tree)


@main.command(epilog=EXIT_CODES)
@tree_argument
@ids_argument
@click.option("--format", "fmt", type=click.Choice(output.FORMATS), default="text",
              help="json (patchkit.status/1), junit (XML, one testcase per patch) or github "
                   "(Actions annotations at the broken anchor); see docs/ci.md.")
@click.pass_obj
def verify(obj: Ctx, tree: str, ids: tuple[str, ...], fmt: str) -> None:
    """Check the postconditions of every patch (or the named ones and what they
    require) on TREE: each must be applied or native upstream (or superseded
    upstream). Exit 1 otherwise."""
    with locked_session(tree, obj.say) as session:
        reports = session.reports(registry.select(ids) if ids else None)
    if session.snapshot.pending is not None:
        obj.say(f"verify: {session.snapshot.pending.line()}")
    click.echo(output.render(fmt, session.tree, reports, output.Locator(session.tree, tree), obj.verbose,
                             session.runtime_info(), session.snapshot.notes(), pending=session.snapshot.pending is not None))
    sys.exit(EXIT_OK if _ok(session, reports) else EXIT_CHANGES)


def _ok(session, reports) -> bool:
    """Every patch applied or native, and no transaction half-done."""
    return session.snapshot.pending is None and all(r.ok for r in reports)


@main.command(epilog=EXIT_CODES)
@tree_argument
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              help="json: the patchkit.audit/1 document (docs/ci.md).")
@click.option("--strict", is_flag=True, help="Exit 1 when a read is unguarded or stale.")
@click.pass_obj
def audit(obj: Ctx, tree: str, fmt: str, strict: bool) -> None:
    """List every read of the CPU seq_lens mirror (seq_lens_cpu, seq_lens_sum and
    the CUDA-graph runners' CPU buffers filled from them) on the spec-v2 paths of
    TREE, each guarded, patched, safe, unguarded (reads None once the mirror is
    dropped) or stale (reads a buffer no longer refreshed). Text shows the
    unguarded and stale ones (-v: all). Works on any tree; writes nothing."""
    from patchkit.audit import audit_tree, to_json, to_text
    from patchkit.tree import find_tree

    found = find_tree(tree)
    result = audit_tree(found.package)
    paths = output.Locator(found, tree).path
    click.echo(to_json(result, output.tree_dict(found), paths) if fmt == "json" else to_text(result, paths, obj.verbose))
    sys.exit(EXIT_CHANGES if strict and not result.ok else EXIT_OK)


@main.command(epilog=EXIT_CODES)
@tree_argument
@click.pass_obj
def diff(obj: Ctx, tree: str) -> None:
    """Print the unified diff between the original files and TREE now."""
    with locked_session(tree, obj.say) as session:
        _refuse_pending(session)
        click.echo(session.diff_against_original(), nl=False)


@main.command(epilog=EXIT_CODES)
@tree_argument
@click.option("-o", "--out", "out", type=click.Path(file_okay=False), help="Folder for NNNN-<patch>.patch files and a quilt series file.")
@click.option("--stdout", "to_stdout", is_flag=True, help="Print the series as one mbox on stdout instead.")
@click.option("--author", default=None, metavar="'NAME <EMAIL>'",
              help="From: of every patch (default: patchkit <patchkit@invalid>).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@click.pass_obj
def export(obj: Ctx, tree: str, out: Optional[str], to_stdout: bool, author: Optional[str], fmt: str) -> None:
    """Write the change patchkit applied to TREE as a git format-patch series,
    one patch per patchkit patch in dependency order, with a/python/sglang/...
    paths: `git am DIR/*.patch` on a pristine checkout reproduces the patched
    tree byte for byte. Patches that are native upstream are not exported.
    The Date: is now, or SOURCE_DATE_EPOCH when set."""
    from patchkit.export import DEFAULT_AUTHOR, build_series, write_series

    if bool(out) == to_stdout:
        raise click.UsageError("give exactly one of --out DIR or --stdout")
    with locked_session(tree, obj.say) as session:
        _refuse_pending(session)
        series = build_series(session, author or DEFAULT_AUTHOR)
    for note in series.notes:
        obj.say(f"note: {note}")
    if to_stdout:
        click.echo(series.mbox(), nl=False)
        return
    from pathlib import Path

    written = write_series(series, Path(out)) if series.patches else []
    if fmt == "json":
        doc = {
            "schema": "patchkit.export/1",
            "tree": output.tree_dict(session.tree),
            "out": out,
            "patches": [{"id": p.patch.id, "number": p.number, "file": str(path), "files": p.files}
                        for p, path in zip(series.patches, written)],
            "notes": series.notes,
        }
        click.echo(json.dumps(doc, indent=2))
        return
    if not series.patches:
        obj.say("nothing to export: patchkit applied no patch to this tree")
    for path in written:
        click.echo(str(path))


@main.command(epilog=EXIT_CODES)
@click.argument("releases", nargs=-1, metavar="[RELEASE]...")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=1, help="Releases run in parallel processes.")
@click.option("--format", "fmt", type=click.Choice(["markdown", "json"]), default="markdown")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the table here instead of stdout.")
@click.pass_obj
def matrix(obj: Ctx, releases: tuple[str, ...], jobs: int, fmt: str, output: Optional[str]) -> None:
    """Run status, apply, verify, apply again and revert of every patch on
    copies of sglang releases (default: 0.5.10 ... 0.5.23, fetched and cached)
    and print a release x patch table: state after apply, files changed, verify,
    idempotence, exact revert (sha256 of every file). Progress goes to stderr on
    a terminal (not with -q). Exit 1 if any release fails any of these."""
    from patchkit import matrix as mx

    doc = mx.run_matrix(releases or mx.DEFAULT_RELEASES, jobs, mx.progress_printer(obj.quiet))
    text = mx.to_markdown(doc) if fmt == "markdown" else mx.to_json(doc)
    if output:
        with open(output, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        click.echo(text, nl=False)
    sys.exit(EXIT_OK if doc["ok"] else EXIT_CHANGES)


@main.command(epilog=EXIT_CODES)
@click.argument("version")
def fetch(version: str) -> None:
    """Download sglang==VERSION from the package registry into the cache and
    print the path of its pristine package folder (copy it before patching)."""
    from patchkit.fetch import fetch_tree

    click.echo(fetch_tree(version))


def _counts(outcome: Outcome, verb: str) -> str:
    """'12 file(s) changed, 7 added': files patchkit created (its runtime
    folder, the manifest) or removed are counted apart."""
    kinds = [(old is None, new is None) for old, new in outcome.changed.values()]
    text = f"{kinds.count((False, False))} file(s) {verb}"
    if kinds.count((True, False)):
        text += f", {kinds.count((True, False))} {'would be ' if verb.startswith('would') else ''}added"
    if kinds.count((False, True)):
        text += f", {kinds.count((False, True))} {'would be ' if verb.startswith('would') else ''}removed"
    return text


def _finish(obj: Ctx, tree, outcome: Outcome, verb: str, fmt: str, show_diff: bool, check: bool, dry: bool,
            given: Optional[str] = None) -> None:
    for message in outcome.messages:
        obj.say(message)
    locator = output.Locator(tree, given)
    if fmt == "json":
        doc = {
            "schema": f"patchkit.{verb}/1",
            "tree": output.tree_dict(tree),
            "done": outcome.done,
            "skipped": [{"id": pid, "reason": why} for pid, why in outcome.skipped],
            "changed_files": sorted(outcome.changed),
            "changed_paths": [locator.path(rel) for rel in sorted(outcome.changed)],
            "dry_run": dry,
            "diff": outcome.diff(tree),
        }
        click.echo(json.dumps(doc, indent=2))
    elif check:
        # black --check style: the diff (if asked) on stdout, the verdict on stderr.
        if show_diff:
            click.echo(outcome.diff(tree), nl=False)
        for pid in outcome.done:
            obj.say(f"would apply: {pid}")
        for rel in sorted(outcome.changed):
            obj.say(f"would change: {locator.path(rel)}")
        for pid, why in outcome.skipped:
            obj.say(f"cannot apply: {pid}: {why}")
        if outcome.changed:
            obj.say(f"{len(outcome.done)} patch(es) would be applied, {_counts(outcome, 'would change')}")
        elif not outcome.skipped:
            obj.say("nothing to apply: every patch is applied, native or not applicable")
    else:
        if show_diff:
            click.echo(outcome.diff(tree), nl=False)
        past = "applied" if verb == "apply" else "reverted"
        for pid in outcome.done:
            obj.say(f"{'would be ' if dry else ''}{past}: {pid}")
        for pid, why in outcome.skipped:
            obj.say(f"not {past}: {pid}: {why}")
        obj.say(_counts(outcome, "would change" if dry else "changed"))
    if outcome.skipped or (check and outcome.changed):
        sys.exit(EXIT_CHANGES)
