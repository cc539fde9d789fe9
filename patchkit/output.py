"""How reports are written: text for people, JSON for tools (verify's JUnit and
GitHub formats for CI are :mod:`patchkit.verify_output`'s).

The JSON shape (``patchkit.status/1``, ``docs/ci.md``) only ever grows (new keys).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Optional

from patchkit import terminal
from patchkit.findings import State
from patchkit.registry import Patch
from patchkit.results import NOT_APPLICABLE, STALE, CodemodResult, PatchReport
from patchkit.tree import Tree

STATUS_SCHEMA = "patchkit.status/1"


def tree_dict(tree: Tree) -> dict:
    return {"path": str(tree.given), "package": str(tree.package), "layout": tree.layout, "version": tree.version}


def patch_dict(patch: Patch) -> dict:
    return {
        "id": patch.id,
        "title": patch.title,
        "upstream": list(patch.upstream),
        "requires": list(patch.requires),
        "files": patch.files,
        "origin": patch.origin,
    }


# --- list, show, diff, and the documents of apply/revert/export ------------------


def show_text(patch: Patch, codemods, runtime: list[str]) -> str:
    """``patchkit show``: what a patch is and what each codemod does."""
    lines = [
        f"{patch.id}: {patch.title}",
        f"  upstream: {', '.join(patch.upstream) or '- (not an upstream change)'}",
        f"  requires: {', '.join(patch.requires) or '-'}",
        f"  from:     {patch.origin}",
    ]
    if runtime:
        lines.append(f"  runtime:  {', '.join(runtime)}")
    lines.append("")
    lines += [f"  {line}" for line in patch.description.splitlines()]
    for target in patch.targets:
        lines.append("")
        optional = f"  (optional: {target.when_missing or 'not in every release'})" if target.optional else ""
        lines.append(f"  {target.file}{optional}")
        for view in codemods:
            if view.file == target.file:
                lines.append(f"    - {view.description or view.name}")
    return "\n".join(lines)


def show_json(patch: Patch, codemods, runtime: list[str], diff: Optional[str] = None) -> str:
    doc = {
        "schema": "patchkit.show/1",
        **patch_dict(patch),
        "description": patch.description,
        "runtime": runtime,
        "targets": [
            {
                "file": t.file,
                "optional": t.optional,
                "when_missing": t.when_missing,
                "codemods": [{"name": v.name, "description": v.description} for v in codemods if v.file == t.file],
            }
            for t in patch.targets
        ],
    }
    if diff is not None:
        doc["diff"] = diff
    return json.dumps(doc, indent=2)


def diff_stat(diffs) -> str:
    """``git diff --stat``: one line per file, then the totals."""
    if not diffs:
        return ""
    width = max(len(d.path) for d in diffs)
    scale = min(1.0, 50 / (max(d.added + d.removed for d in diffs) or 1))  # bars of at most 50 columns

    def bar(count: int) -> int:
        return max(1, round(count * scale)) if count else 0  # a change never draws as nothing

    lines = []
    for d in diffs:
        graph = "+" * bar(d.added) + "-" * bar(d.removed)
        lines.append(f" {d.path:<{width}} | {d.added + d.removed:>4} {graph}")
    added, removed = sum(d.added for d in diffs), sum(d.removed for d in diffs)
    lines.append(
        f" {len(diffs)} file{'s' if len(diffs) != 1 else ''} changed, "
        f"{added} insertion{'s' if added != 1 else ''}(+), {removed} deletion{'s' if removed != 1 else ''}(-)"
    )
    return "\n".join(lines) + "\n"


PAST = {"apply": "applied", "revert": "reverted"}


def outcome_lines(verb: str, outcome, dry: bool) -> list[str]:
    """A line per patch apply or revert did (``applied: P``) or, dry, would
    do (``would apply: P``, as --check and --dry-run both say), then one per
    patch it left out with why."""
    done = f"would {verb}" if dry else PAST[verb]
    not_done = f"cannot {verb}" if dry else f"not {PAST[verb]}"
    return [f"{done}: {pid}" for pid in outcome.done] + [f"{not_done}: {pid}: {why}" for pid, why in outcome.skipped]


def outcome_json(verb: str, tree: Tree, outcome, given: str, dry: bool) -> str:
    """The ``patchkit.apply/1`` / ``patchkit.revert/1`` document (docs/ci.md);
    ``given``: the tree argument as typed (``Tree.shown_path``)."""
    doc = {
        "schema": f"patchkit.{verb}/1",
        "tree": tree_dict(tree),
        "done": outcome.done,
        "skipped": [{"id": pid, "reason": why} for pid, why in outcome.skipped],
        "changed_files": sorted(outcome.changed),
        "changed_paths": [tree.shown_path(rel, given) for rel in sorted(outcome.changed)],
        "dry_run": dry,
        "diff": outcome.diff(tree),
    }
    return json.dumps(doc, indent=2)


def export_json(tree: Tree, out: Optional[str], series, written) -> str:
    """The ``patchkit.export/1`` document (docs/ci.md)."""
    doc = {
        "schema": "patchkit.export/1",
        "tree": tree_dict(tree),
        "out": out,
        "patches": [
            {"id": p.patch.id, "number": p.number, "file": str(path), "files": p.files}
            for p, path in zip(series.patches, written)
        ],
        "notes": series.notes,
    }
    return json.dumps(doc, indent=2)


def failures(report: PatchReport) -> list[CodemodResult]:
    """The checks that make a report not ok: missing anchors, changes to do."""
    if report.ok or report.state == STALE:  # stale: every change is there; its reason says what is not
        return []
    missing = [r for r in report.results if r.finding.state is State.MISSING]
    if missing:  # not applicable here: the rest is moot until the anchor is back
        return missing
    return [r for r in report.results if r.finding.state is State.TODO] or list(report.results)


# --- JSON ---------------------------------------------------------------------


def report_dict(report: PatchReport, shown: Optional[Callable[[str], str]] = None) -> dict:
    """``shown``: a file's path as the user sees it; with it, each check says
    its ``path`` and (a failing one) its ``line``."""
    failing = {id(r) for r in failures(report)} if shown else set()
    checks = []
    for r in report.results:
        check: dict[str, object] = {
            "file": r.file,
            "codemod": r.codemod,
            "state": r.finding.state.value,
            "anchor": r.finding.anchor,
            "detail": r.finding.detail,
        }
        if shown is not None:
            check["path"] = shown(r.file)
            check["line"] = r.finding.line if id(r) in failing else None
        checks.append(check)
    return {
        **patch_dict(report.patch),
        "state": report.state,
        "ok": report.ok,
        "reason": report.reason,
        "notes": report.notes,
        "checks": checks,
    }


def summary(reports: list[PatchReport]) -> dict:
    counts: dict[str, int] = {}
    for r in reports:
        counts[r.state] = counts.get(r.state, 0) + 1
    return {
        "total": len(reports),
        "ok": sum(r.ok for r in reports),
        "failed": sum(not r.ok for r in reports),
        "states": counts,
    }


def status_json(tree: Tree, reports: list[PatchReport], given: Optional[str] = None, **extra) -> str:
    """``given``: the tree argument as typed; with it, checks say where they are."""
    shown = None if given is None else (lambda rel: tree.shown_path(rel, given))
    doc = {
        "schema": STATUS_SCHEMA,
        "tree": tree_dict(tree),
        "patches": [report_dict(r, shown) for r in reports],
        "summary": summary(reports),
        **extra,
    }
    return json.dumps(doc, indent=2)


# --- text ---------------------------------------------------------------------


def runtime_line(runtime: Optional[dict]) -> Optional[str]:
    """Where the applied patches' runtime code comes from (``Session.runtime_info``)."""
    if not runtime:
        return None
    if runtime["mode"] == "vendored":
        where = f"vendored in {runtime['folder']}/"
    else:
        where = "package: the installed patchkit.runtime, through forwarders in " + runtime["folder"] + "/"
    return (
        f"  patched by patchkit {runtime['patchkit']}; runtime {where} (API {runtime['api']}); "
        f"recorded in {runtime['recorded_in']}"
    )


def status_text(
    tree: Tree,
    reports: list[PatchReport],
    verbose: bool = False,
    runtime: Optional[dict] = None,
    notes: Sequence[str] = (),
    quiet: bool = False,
) -> str:
    """``notes``: lines about the tree as a whole (a pending transaction,
    leftovers of an earlier base), printed under its first line. ``quiet``
    (-q): no tree line, no runtime line, no per-patch ``note:`` lines: the
    states and reasons only (docs/ci.md)."""
    lines = [] if quiet else [f"sglang {tree.version} at {tree.package} ({tree.layout} layout)"]
    if (line := runtime_line(runtime)) and not quiet:
        lines.append(line)
    lines += [f"  {note}" for note in notes]
    width = max((len(r.patch.id) for r in reports), default=0)
    for r in reports:
        line = f"  {r.patch.id:<{width}}  {terminal.state(r.state)}"
        if r.reason:
            # verify fails on a patch this tree cannot carry (it names each with its state): status says so.
            line += f"  ({r.reason}{'; verify fails on it' if r.state == NOT_APPLICABLE and not r.ok else ''})"
        lines.append(line)
        for note in () if quiet else r.notes:
            lines.append(f"  {'':<{width}}  note: {note}")
        if verbose:
            for c in r.results:
                lines.append(f"  {'':<{width}}    {c.finding.state.value:<10} {c.file}: {_anchored(c, ' ')}".rstrip())
    return "\n".join(lines)


# --- failures, as text ----------------------------------------------------------


def _anchored(result: CodemodResult, between: str = ": ") -> str:
    """``anchor: detail``; a missing file's anchor is its path, which the
    line names already: the detail alone."""
    if result.finding.anchor == result.file:
        return result.finding.detail
    return f"{result.finding.anchor}{between}{result.finding.detail}"


def failure_text(report: PatchReport, tree: Tree, given: str, quiet: bool = False) -> str:
    out = []
    for r in failures(report):
        path = tree.shown_path(r.file, given)
        where = f"{path}:{r.finding.line}" if r.finding.line else path
        out.append(f"{where}: {r.finding.state.value}: {_anchored(r)}".rstrip(": "))
    out = list(dict.fromkeys(out))
    out.extend(f"note: {n}" for n in ([] if quiet else report.notes))
    return "\n".join(out)
