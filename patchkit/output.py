"""How reports are written: text for people, JSON/JUnit/GitHub for CI."""

from __future__ import annotations

import json

from patchkit.engine import PatchReport
from patchkit.registry import Patch
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
    }


def report_dict(report: PatchReport) -> dict:
    return {
        **patch_dict(report.patch),
        "state": report.state,
        "ok": report.ok,
        "reason": report.reason,
        "notes": report.notes,
        "checks": [
            {
                "file": r.file,
                "codemod": r.codemod,
                "state": r.finding.state.value,
                "anchor": r.finding.anchor,
                "detail": r.finding.detail,
            }
            for r in report.results
        ],
    }


def status_json(tree: Tree, reports: list[PatchReport], **extra) -> str:
    doc = {"schema": STATUS_SCHEMA, "tree": tree_dict(tree), "patches": [report_dict(r) for r in reports], **extra}
    return json.dumps(doc, indent=2)


def status_text(tree: Tree, reports: list[PatchReport], verbose: bool = False) -> str:
    lines = [f"sglang {tree.version} at {tree.package} ({tree.layout} layout)"]
    width = max((len(r.patch.id) for r in reports), default=0)
    for r in reports:
        line = f"  {r.patch.id:<{width}}  {r.state}"
        if r.reason:
            line += f"  ({r.reason})"
        lines.append(line)
        for note in r.notes:
            lines.append(f"  {'':<{width}}  note: {note}")
        if verbose:
            for c in r.results:
                lines.append(f"  {'':<{width}}    {c.finding.state.value:<10} {c.file}: {c.finding.anchor} {c.finding.detail}".rstrip())
    return "\n".join(lines)
