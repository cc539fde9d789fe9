"""verify's output in each of its FORMATS: text and JSON (built in
:mod:`patchkit.output`, which status shares), JUnit XML and GitHub Actions
workflow commands for CI, and ``render``, which picks one.

Kept apart from ``output`` (the documents every command prints) because only
verify's CI formats need these; ``output`` stays under the house's 400 lines.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

from patchkit import terminal
from patchkit.audit import verify_line
from patchkit.findings import State
from patchkit.output import failure_text, failures, status_json, status_text, summary
from patchkit.results import NOT_APPLICABLE, STALE, PatchReport
from patchkit.tree import Tree

FORMATS = ("text", "json", "junit", "github")


# --- JUnit XML ----------------------------------------------------------------


def _skipped(report: PatchReport) -> bool:
    """ok, but the change is not in the tree: upstream superseded it."""
    return report.ok and report.state == NOT_APPLICABLE


def status_junit(tree: Tree, reports: list[PatchReport], given: str, suite: str = "patchkit verify") -> str:
    """One <testcase> per patch: <failure> when not ok, <skipped> when upstream
    superseded it (nothing to carry), plain pass when applied or native."""
    counts = summary(reports)
    skipped = sum(_skipped(r) for r in reports)
    import xml.etree.ElementTree as ET  # junit only: not paid by every status/verify

    root = ET.Element(
        "testsuites",
        name="patchkit",
        tests=str(len(reports)),
        failures=str(counts["failed"]),
        errors="0",
        skipped=str(skipped),
    )
    ts = ET.SubElement(
        root,
        "testsuite",
        name=f"{suite}: sglang {tree.version}",
        tests=str(len(reports)),
        failures=str(counts["failed"]),
        errors="0",
        skipped=str(skipped),
    )
    props = ET.SubElement(ts, "properties")
    for key, value in (
        ("tree", given),
        ("package", str(tree.package)),
        ("layout", tree.layout),
        ("version", tree.version),
    ):
        ET.SubElement(props, "property", name=key, value=value)
    for r in reports:
        case = ET.SubElement(ts, "testcase", classname=f"patchkit.sglang-{tree.version}", name=r.patch.id)
        first = next(iter(failures(r) or r.results), None)
        if first is not None:
            case.set("file", tree.shown_path(first.file, given))
        if not r.ok:
            message = f"{r.state}: {r.reason}" if r.reason else r.state
            if r.state == "absent":
                message = "absent: not applied (run patchkit apply)"
            fail = ET.SubElement(case, "failure", message=message, type=r.state)
            fail.text = failure_text(r, tree, given)
            if first is not None and first.finding.line:
                case.set("line", str(first.finding.line))
        elif _skipped(r):
            ET.SubElement(case, "skipped", message=f"not applicable: {r.reason}")
        out = [f"{r.patch.title}", f"state: {r.state}"] + [f"note: {n}" for n in r.notes]
        ET.SubElement(case, "system-out").text = "\n".join(out)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode")


# --- GitHub Actions workflow commands -----------------------------------------


def _gh_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _gh_prop(text: str) -> str:
    return _gh_data(text).replace(":", "%3A").replace(",", "%2C")


def github_annotation(
    level: str, message: str, file: Optional[str] = None, line: Optional[int] = None, title: Optional[str] = None
) -> str:
    props = []
    if file:
        props.append(f"file={_gh_prop(file)}")
    if line:
        props.append(f"line={line}")
    if title:
        props.append(f"title={_gh_prop(title)}")
    return f"::{level}{' ' + ','.join(props) if props else ''}::{_gh_data(message)}"


def status_github(tree: Tree, reports: list[PatchReport], given: str) -> str:
    """``::error file=...,line=...::`` for every missing or broken anchor (one
    per patch that is simply not applied), ``::warning`` for notes."""
    out = []
    for r in reports:
        title = f"patchkit: {r.patch.id}"
        bad = failures(r)
        if r.state == STALE:
            out.append(
                github_annotation(
                    "error", f"{r.patch.id}: stale runtime: {r.reason}; run `patchkit apply`", title=title
                )
            )
        if r.state == "absent" and bad:
            first = bad[0]
            files = sorted({tree.shown_path(c.file, given) for c in bad})
            message = (
                f"{r.patch.id} ({', '.join(r.patch.upstream)}) is not applied: {len(bad)} change(s) to make in "
                f"{', '.join(files)}; run `patchkit apply`"
            )
            out.append(
                github_annotation("error", message, tree.github_path(first.file, given), first.finding.line, title)
            )
        else:
            for c in bad:
                what = "missing anchor" if c.finding.state is State.MISSING else f"{r.state}, still to do"
                message = f"{r.patch.id}: {what}: {c.finding.anchor}: {c.finding.detail}".rstrip(": ")
                out.append(github_annotation("error", message, tree.github_path(c.file, given), c.finding.line, title))
        for note in r.notes:
            out.append(github_annotation("warning", f"{r.patch.id}: {note}", title=title))
    out = list(dict.fromkeys(out))  # two codemods, one missing anchor: one annotation
    failed = [r.patch.id for r in reports if not r.ok]
    out.append(f"patchkit verify: sglang {tree.version}: " + ("OK" if not failed else f"FAILED ({', '.join(failed)})"))
    return "\n".join(out)


def render(
    fmt: str,
    tree: Tree,
    reports: list[PatchReport],
    given: str,
    verbose: bool = False,
    runtime: Optional[dict] = None,
    notes: Sequence[str] = (),
    pending: bool = False,
    audit_problems: Optional[int] = None,
    quiet: bool = False,
) -> str:
    """verify's output in one of FORMATS; ``given``: the tree argument as
    typed (paths are shown from it); ``pending``: an interrupted
    transaction (one of the ``notes``) fails the verdict; ``audit_problems``:
    the audit's count of unguarded or stale reads, named in one text line
    (json: ``audit.problems``)."""
    failed = [r for r in reports if not r.ok]
    if fmt == "json":
        extra = {} if audit_problems is None else {"audit": {"problems": audit_problems}}
        return status_json(
            tree, reports, given, ok=not failed and not pending, runtime=runtime, notes=list(notes), **extra
        )
    if fmt == "junit":
        return status_junit(tree, reports, given)
    if fmt == "github":
        return status_github(tree, reports, given)
    text = status_text(tree, reports, verbose, runtime, notes, quiet)
    # Where a partial or not-applicable patch breaks (an absent one is simply
    # not applied: its status line says all there is to say).
    broken = [r for r in failed if r.state != "absent"]
    if broken:
        text += "\n" + "\n".join(
            f"  {r.patch.id}: {line}" for r in broken for line in failure_text(r, tree, given, quiet).splitlines()
        )
    if audit_problems is not None:
        text += "\n  " + verify_line(audit_problems)
    if pending:
        return text + "\n" + terminal.styled("verify: FAILED (an interrupted transaction is pending)")
    return (
        text
        + "\n"
        + terminal.styled(
            "verify: OK" if not failed else f"verify: FAILED ({', '.join(f'{r.patch.id}: {r.state}' for r in failed)})"
        )
    )
