"""``patchkit export``: the change patchkit applied to a tree, as a patch series
that ``git am`` (or ``git apply``, or quilt) takes, one patch per patchkit
patch, in registry (dependency) order.

Patch k's diff is "original with patches[:k+1] applied" minus "original with
patches[:k] applied", computed by re-running the engine's transform on the
original bytes kept in ``.patchkit`` (through the transform cache and the
parallel preparation an apply uses); for each file, the last patch that touches
it ends exactly at the bytes patchkit wrote, so applying the whole series to
the pristine tree reproduces the patched tree byte for byte.
"""

from __future__ import annotations

import email.header
import email.utils
import hashlib
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from patchkit import __version__, fetch, registry
from patchkit.engine import Session
from patchkit.errors import PatchkitError
from patchkit.registry import Patch
from patchkit.results import NATIVE, unified_diff
from patchkit.state import vendoring
from patchkit.transform.parallel import Progress
from patchkit.transform.transformer import Transformer
from patchkit.tree import Tree

DEFAULT_AUTHOR = "patchkit <patchkit@invalid>"
ZERO_SHA = "0" * 40


@dataclass
class ExportedPatch:
    patch: Patch
    number: int
    total: int
    files: list[str]  # repo paths (python/sglang/...)
    diff: str
    text: str = ""
    name: str = ""


@dataclass
class Series:
    patches: list[ExportedPatch] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def mbox(self) -> str:
        return "".join(p.text for p in self.patches)


def build_series(
    session: Session, author: str = DEFAULT_AUTHOR, date: Optional[float] = None, progress: Optional[Progress] = None
) -> Series:
    """The series for the patches patchkit applied to ``session``'s tree;
    ``progress`` is told of each transform computed (none the cache had)."""
    record = session.record
    series = Series()
    applied: list[Patch] = []
    for patch in registry.all_patches():
        if patch.id in record.applied:
            applied.append(patch)
    # Notes for what is not exported (native upstream, not applied, ...).
    reports = {
        r.patch.id: r for r in session.reports([p for p in registry.all_patches() if p.id not in record.applied])
    }
    for pid, report in reports.items():
        why = "native upstream in this tree" if report.state == NATIVE else f"{report.state}, not applied by patchkit"
        series.notes.append(f"skipped {pid}: {why}")
    for pid in record.applied:
        if all(p.id != pid for p in registry.all_patches()):
            series.notes.append(f"skipped {pid}: applied by patchkit but unknown to this version (not exported)")

    # Files patchkit changed; the ones it created (runtime folder, manifest) follow below.
    files = record.changed()
    # Current (cumulative) text of each touched file as the series goes.
    originals = {rel: session.backup(rel) for rel in files}
    current: dict[str, Optional[bytes]] = dict(originals)
    last_touch: dict[str, int] = {}
    for k, patch in enumerate(applied):
        for target in patch.targets:
            if target.file in files:
                last_touch[target.file] = k
    tree = session.tree
    steps = [
        (rel, k)
        for k, patch in enumerate(applied)
        for rel in dict.fromkeys(t.file for t in patch.targets if t.file in files)
    ]
    pristine = fetch.release_sources(tree, dict.fromkeys(rel for rel, _ in steps))
    transformer = Transformer(tree, session.findings, session.modules, pristine=pristine)
    transformed = transformer.transform_prefixes(originals, steps, applied, progress)
    for k, patch in enumerate(applied):
        diffs, paths = [], []
        for rel in dict.fromkeys(t.file for t in patch.targets if t.file in files):
            if last_touch[rel] == k:
                new = session.written(rel)
                if transformed[rel, k] != new:
                    series.notes.append(
                        f"{tree.repo_path(rel)}: re-running the codemods does not give the bytes patchkit wrote "
                        "(applied in several steps?); the last patch touching it carries the difference"
                    )
            else:
                new = transformed[rel, k]
            if new != current[rel]:
                diffs.append(_git_diff(tree, rel, current[rel], new))
                paths.append(tree.repo_path(rel))
                current[rel] = new
        # The runtime folder grows with the patches that need it; the manifest
        # comes with the last patch, so a tree built by `git am` is one that
        # patchkit recognises as patched.
        created = vendoring.runtime_files(applied[: k + 1], session.runtime_mode)
        if k == len(applied) - 1:
            created = _as_written(session, created, series)
        for rel in sorted(created.keys() | {r for r in current if r not in files}):
            made = created.get(rel)
            if made != current.get(rel):
                diffs.append(_git_diff(tree, rel, current.get(rel), made))
                paths.append(tree.repo_path(rel))
                current[rel] = made
        series.patches.append(ExportedPatch(patch, 0, 0, paths, "".join(diffs)))
    for rel in current:
        on_disk = session.read(rel)
        if on_disk is not None and on_disk != current[rel]:
            series.notes.append(f"{tree.repo_path(rel)}: edited after apply; the series carries patchkit's change only")

    exported = [p for p in series.patches if p.diff]
    for p in series.patches:
        if not p.diff:
            series.notes.append(f"skipped {p.patch.id}: applied, but changes no file of its own (nothing to export)")
    when = _date(date)
    for n, p in enumerate(exported, 1):
        p.number, p.total = n, len(exported)
        p.name = f"{n:04d}-{p.patch.id}.patch"
        p.text = format_patch(p, author, when)
    series.patches = exported
    return series


def _as_written(session: Session, computed: dict[str, bytes], series: Series) -> dict[str, bytes]:
    """The runtime files and manifest as patchkit wrote them into the tree."""
    out = dict(computed)
    for rel in session.record.created():
        on_disk = session.read(rel)
        if on_disk is not None and hashlib.sha256(on_disk).hexdigest() == session.record.files[rel].patched:
            out[rel] = on_disk
        elif rel not in out:
            series.notes.append(f"{session.tree.repo_path(rel)}: edited or missing since apply; not exported")
    return out


def _date(date: Optional[float]) -> str:
    if date is None:
        epoch = os.environ.get("SOURCE_DATE_EPOCH")
        date = float(epoch) if epoch and epoch.isdigit() else time.time()
    return email.utils.formatdate(date, localtime=False)


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _git_diff(tree, rel: str, old: Optional[bytes], new: Optional[bytes]) -> str:
    """A git-style diff: full blob ids on the index line, so ``git am -3`` can
    fall back to a 3-way merge on a fork that drifted. None: no such file
    (a created or removed file)."""
    name = tree.repo_path(rel)
    body = unified_diff(tree, rel, old, new)
    try:
        mode = "100755" if os.stat(tree.path(rel)).st_mode & 0o111 else "100644"
    except OSError:
        mode = "100644"
    if old is None:
        assert new is not None, rel  # a file neither before nor after has no diff
        return f"diff --git a/{name} b/{name}\nnew file mode {mode}\nindex {ZERO_SHA}..{git_blob_id(new)}\n{body}"
    if new is None:
        return f"diff --git a/{name} b/{name}\ndeleted file mode {mode}\nindex {git_blob_id(old)}..{ZERO_SHA}\n{body}"
    return f"diff --git a/{name} b/{name}\nindex {git_blob_id(old)}..{git_blob_id(new)} {mode}\n{body}"


def _subject(text: str) -> str:
    text = " ".join(text.split())
    if text.isascii():
        return text
    return email.header.Header(text, "utf-8").encode()


def _body_line(line: str) -> str:
    # Lines git mailinfo would take for the end of the message or a new mail.
    if re.match(r"(---|diff -|Index: |From )", line):
        return " " + line
    return line


def _diffstat(diff: str) -> str:
    stats: list[tuple[str, int, int]] = []
    for chunk in diff.split("diff --git ")[1:]:
        name = chunk.split("\n", 1)[0].split(" b/", 1)[-1]
        lines = chunk.splitlines()
        plus = sum(1 for ln in lines if ln.startswith("+") and not ln.startswith("+++ "))
        minus = sum(1 for ln in lines if ln.startswith("-") and not ln.startswith("--- "))
        stats.append((name, plus, minus))
    width = max((len(n) for n, _, _ in stats), default=0)
    out = [f" {n:<{width}} | {p + m:>3} {'+' * min(p, 40)}{'-' * min(m, 40)}" for n, p, m in stats]
    plus, minus = sum(s[1] for s in stats), sum(s[2] for s in stats)
    out.append(
        f" {len(stats)} file{'s' if len(stats) != 1 else ''} changed, {plus} insertion{'s' if plus != 1 else ''}(+), "
        f"{minus} deletion{'s' if minus != 1 else ''}(-)"
    )
    return "\n".join(out) + "\n"


def _pr_url(ref: str) -> str:
    repo, _, number = ref.partition("#")
    if repo == "sglang" and number.isdigit():
        return f"https://github.com/sgl-project/sglang/pull/{number} ({ref})"
    return ref


def format_patch(p: ExportedPatch, author: str, date: str) -> str:
    """One mail in ``git format-patch`` form."""
    patch = p.patch
    body = [*patch.description.splitlines()]
    if patch.upstream:
        body.append("")
        body += [f"Upstream: {_pr_url(u)}" for u in patch.upstream]
    if patch.requires:
        body.append(f"Requires: {', '.join(patch.requires)}")
    body.append(f"Patchkit-Patch: {patch.id}")
    body = [_body_line(line.rstrip()) for line in body]
    while body and not body[0]:
        body.pop(0)
    head = [
        f"From {ZERO_SHA} Mon Sep 17 00:00:00 2001",
        f"From: {author}",
        f"Date: {date}",
        f"Subject: {_subject(f'[PATCH {p.number}/{p.total}] {patch.title}')}",
        "MIME-Version: 1.0",
        "Content-Type: text/plain; charset=UTF-8",
        "Content-Transfer-Encoding: 8bit",
        "",
    ]
    return "\n".join(head + body) + "\n---\n" + _diffstat(p.diff) + "\n" + p.diff + f"-- \npatchkit {__version__}\n\n"


def write_series(series: Series, out: Path, tree: Tree) -> list[Path]:
    """Write ``NNNN-<id>.patch`` files and a quilt ``series`` file to ``out``.
    Files a previous export listed in ``out/series`` are removed first, so
    ``git am out/*.patch`` never picks up a stale patch. Never into patchkit's
    own folders of ``tree`` (the exported tree): a series in ``srt/_patchkit``
    made every later apply refuse a runtime folder it had not written."""
    for own in (tree.package / vendoring.FOLDER, tree.state_dir):
        if out.resolve() == own.resolve() or own.resolve() in out.resolve().parents:
            raise PatchkitError(
                f"{out}: inside {own}, which patchkit keeps for itself; export somewhere else (nothing was written)"
            )
    if out.exists() and not out.is_dir():
        raise PatchkitError(f"{out}: exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        old = out / "series"
        if old.is_file():
            for name in old.read_text(encoding="utf-8").split():
                if re.fullmatch(r"\d{4}-[\w.-]+\.patch", name) and (out / name).is_file():
                    (out / name).unlink()
        written = []
        for p in series.patches:
            path = out / p.name
            path.write_text(p.text, encoding="utf-8", newline="\n")
            written.append(path)
        (out / "series").write_text("".join(f"{p.name}\n" for p in series.patches), encoding="utf-8")
    except OSError as exc:
        raise PatchkitError(f"{out}: cannot write the series ({exc.strerror})") from None
    return written
