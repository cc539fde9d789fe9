"""apply's safety rule: a tree never ends an apply with needs-cpu-seq-lens (the
decision that lets spec-v2 decode drop the CPU seq_lens mirror) written while
``patchkit audit`` finds a read of the mirror unguarded (or a stale buffer) on
the tree as it would be written, in code the release ships or of unknown
origin. A read the audit knows is the vendor's own stays the vendor's to
guard: apply ends with one line counting them (``audit.vendor_line``).

Checked after the transform and before the commit, on the transformed bytes
(nothing is written yet). When the first such read sits in an attention
backend that opts out only through a patch of this apply (``OPTS_OUT_WITH``),
that patch is refused: the backend keeps the mirror and the read is safe.
Otherwise needs-cpu-seq-lens itself is refused. Either way the patches that
require the refused one are skipped with it, the others are applied, and the
refusal names the read in one line (exit 1, as any patch not applied).
"""

from __future__ import annotations

import hashlib
import re

from functools import partial
from typing import TYPE_CHECKING, Callable, Optional

from patchkit.audit.syntax import OPTS_OUT_WITH

if TYPE_CHECKING:
    from patchkit.audit import Read
    from patchkit.registry import Patch
    from patchkit.transform.parallel import HeadStart
    from patchkit.tree import Tree

DECISION = "needs-cpu-seq-lens"


def first_unsafe_read(tree: "Tree", changed: dict[str, bytes],
                      release_files: Optional[dict[str, Optional[bytes]]] = None,
                      srt: Optional[dict[str, bytes]] = None) -> Optional["Read"]:
    """The first read (by file, line) the audit finds unguarded or stale on
    the tree with ``changed`` (package-relative path -> new bytes) written;
    ``release_files``: the release's bytes of the files apply changes (its
    fetch step), which tell the release's reads there without its tree;
    ``srt``: the tree's modules under srt/ as read, when already read."""
    from dataclasses import asdict

    from patchkit import audit
    from patchkit.transform.cache import Entry, TransformCache

    srt = dict(audit.sources(tree.package) if srt is None else srt)
    srt.update({rel: data for rel, data in changed.items() if rel in srt})
    # A function of the bytes, shared like a transform: a fresh copy of a release applies without auditing again.
    shared = TransformCache.default()
    # The release's bytes place reads too (origins): the same tree audited without them
    # (a version that names no release) may refuse where it passed with them.
    release = hashlib.sha256()
    for rel, data in sorted((release_files or {}).items()):
        release.update(rel.encode() + b"\0" + (hashlib.sha256(data).digest() if data is not None else b"-"))
    given = release.hexdigest() if release_files else "none"
    key = shared.key(f"unsafe-read|{audit.fingerprint(tree.package, srt)}|{given}", [])
    entry = shared.get(key)
    if entry is not None and isinstance(entry.before.get("unsafe_read", 0), (dict, type(None))):
        found = entry.before["unsafe_read"]
        try:
            return audit.Read(**found) if found else None
        except TypeError:
            pass  # written by another shape of Read: audit again
    from patchkit.transform.parallel import no_gc

    # The vendor's own reads are the vendor's to guard: apply names them in its audit line, as before.
    with no_gc():  # ast trees hold no cycles; a collection would re-scan every node the transform left alive
        found = audit.audit_tree(tree.package, sources=srt, release_files=release_files)
    problems = [r for r in found.problems if r.origin != "vendor"]
    read = min(problems, key=lambda r: (r.file, r.line, r.column), default=None)
    shared.put(key, Entry({"unsafe_read": asdict(read) if read else None}, []))
    return read


def head_start(tree: "Tree", selected: list["Patch"], applied: set[str]) -> tuple[Optional["HeadStart"], Optional[dict]]:
    """Work the transform's worker processes can take on for the rule's audit
    (api/applying.py hands it to ``Transformer.prepare``), and the tree's
    modules under srt/ as read (``audit.sources``, for ``first_unsafe_read``);
    ``(None, None)`` when the rule will not audit (the decision neither
    selected nor applied before). Once their files are transformed, the
    workers compute the facts of every module that reads the mirror, as read
    (the modules apply leaves as they are, and the release's own bytes of
    those it changes, on a release tree) but the files the workers
    transform, in chunks taken into this process's memory; and each worker,
    the facts of the files it transformed, as read and as written (kept in
    the shared cache, where the audit finds them). So
    the audit after the transform is shared between the cores. Only a head
    start: that audit is the same call on the same bytes, and computes
    whatever is missing."""
    if DECISION not in {p.id for p in selected} and DECISION not in applied:
        return None, None
    from patchkit import audit
    from patchkit.audit import facts
    from patchkit.transform.parallel import HeadStart

    srt = audit.sources(tree.package)

    def side(transformed: frozenset) -> list:  # only when files are transformed in worker processes (a warm apply has none)
        modules = sorted(((rel, data) for rel, data in srt.items() if rel not in transformed and facts.reads_mirror(data)),
                         key=lambda m: -len(m[1]))
        chunks: list[list[tuple[str, bytes]]] = [[] for _ in range(min(8, len(modules)))]
        sizes = [0] * len(chunks)
        for rel, data in modules:  # biggest first, each to the lightest chunk: chunks of about one size
            k = sizes.index(min(sizes))
            chunks[k].append((rel, data))
            sizes[k] += len(data)
        return [partial(facts.facts_of_many, chunk) for chunk in chunks]

    def after(rel: str, source: bytes, new: bytes) -> None:
        for data in (source, new) if rel in srt else ():  # as read and as written: their ast is the transform's
            if facts.reads_mirror(data):
                facts.facts_of(rel, data)

    return HeadStart(side, facts.remember, after), srt


def map_line(src: bytes, dst: bytes, line: int, code: Optional[bytes] = None) -> int:
    """Line ``line`` of ``src`` in ``dst`` (another version of the file):
    lines both have map one to one; in a run that changed, the line of
    ``dst``'s run that holds ``code`` (default: the line's own text), else
    the run's first."""
    if src == dst:
        return line
    from difflib import SequenceMatcher

    old, new = src.splitlines(), dst.splitlines()
    at = line - 1
    code = (old[at].strip() if at < len(old) else b"") if code is None else code
    for tag, i1, i2, j1, j2 in SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if i1 <= at < i2 or (i1 == i2 == at):
            if tag == "equal":
                return j1 + (at - i1) + 1
            return next((j + 1 for j in range(j1, j2) if code and code in new[j]), j1 + 1 if j2 > j1 else max(j1, 1))
    return line


def disk_line(read: "Read", written: Optional[bytes], on_disk: Optional[bytes]) -> int:
    """The line of ``read`` (a read of ``written``, the file as apply would
    write it) in the file as it is on disk (``on_disk``): where the
    maintainer finds it."""
    if written is None or on_disk is None:
        return read.line
    return map_line(written, on_disk, read.line, read.code.encode("utf-8", "surrogateescape"))


_REFUSED_AT = re.compile(r"^refused: ([^:\s]+):(\d+): ")


def lines_after(why: str, before: dict[str, bytes], after: dict[str, bytes]) -> str:
    """A refusal line (``refused: FILE:LINE: ...``) naming the line of the file
    as the apply leaves it (``after``: the files it writes; ``before``: as
    they were), when the other patches change that file too."""
    found = _REFUSED_AT.match(why)
    if not found or found.group(1) not in after or found.group(1) not in before:
        return why
    rel, line = found.group(1), int(found.group(2))
    return f"refused: {rel}:{map_line(before[rel], after[rel], line)}: {why[found.end():]}"


def refusal(read: "Read", line: Optional[int] = None, patch: str = DECISION) -> str:
    """One line: what is refused and why, and what the maintainer can do
    (``line``: the read's line on disk, :func:`disk_line`)."""
    return (f"refused: {read.file}:{line or read.line}: {read.function} reads `{read.code}` {read.verdict} once the "
            f"mirror is dropped, so nothing of {patch} is written: guard that line with a None test "
            f"(`if ... is None:`), or `--skip {patch}` (the other patches still apply; `patchkit audit` lists every read)")


def _read(tree: "Tree", rel: str) -> Optional[bytes]:
    try:
        return tree.path(rel).read_bytes()
    except OSError:
        return None


def _dependents(pid: str, todo: list["Patch"]) -> list["Patch"]:
    """The patches of ``todo`` that require ``pid``, directly or not."""
    out, names = [], {pid}
    changed = True
    while changed:
        changed = False
        for p in todo:
            if p.id not in names and names.intersection(p.requires):
                names.add(p.id)
                out.append(p)
                changed = True
    return out


def enforce(tree: "Tree", todo: list["Patch"], applied: set[str],
            transform: Callable[[list["Patch"]], dict[str, bytes]],
            release_files: Optional[dict[str, Optional[bytes]]] = None,
            srt: Optional[dict[str, bytes]] = None) -> tuple[list["Patch"], dict[str, bytes], list]:
    """``todo`` less what the rule refuses, the files they change
    (``transform(todo)``) and the skipped ``(patch id, why)``. Checked only
    when the decision is in ``todo`` or applied before."""
    skipped: list[tuple[str, str]] = []
    changed = transform(todo)
    if not todo:  # nothing written: nothing this apply could make unsafe
        return todo, changed, skipped
    while True:
        ids = {p.id for p in todo}
        if DECISION not in ids and DECISION not in applied:
            return todo, changed, skipped
        read = first_unsafe_read(tree, changed, release_files, srt)
        if read is None:
            return todo, changed, skipped
        culprit = OPTS_OUT_WITH.get(read.file)
        if culprit not in ids:
            culprit = DECISION if DECISION in ids else None
        if culprit is None:  # not this apply's doing: audit and verify report it
            return todo, changed, skipped
        dropped = _dependents(culprit, todo)
        on_disk = srt.get(read.file) if srt is not None else _read(tree, read.file)
        skipped.append((culprit, refusal(read, disk_line(read, changed.get(read.file), on_disk), culprit)))
        skipped.extend((p.id, f"requires {culprit}, which is refused") for p in dropped)
        gone = {culprit, *(p.id for p in dropped)}
        todo = [p for p in todo if p.id not in gone]
        changed = transform(todo)
