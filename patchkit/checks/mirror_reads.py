"""needs-cpu-seq-lens's postcondition (``patches/needs-cpu-seq-lens.toml``):
no read of the CPU seq_lens mirror unguarded on the decode path. A tree never
ends an apply with that patch (the decision that lets spec-v2 decode drop
the mirror) written while ``patchkit audit`` finds a read of the mirror
unguarded (or a stale buffer) on the tree as it would be written, in code
the release ships or of unknown origin. A read the audit knows is the
vendor's own stays the vendor's to guard: apply ends with one line counting
them (``audit.vendor_line``).

Checked after the transform and before the commit, on the transformed bytes
(nothing is written yet; ``patchkit.transform.checked`` runs it). When the first
such read sits in an attention backend that opts out only through a patch
of this apply (``OPTS_OUT_WITH``), that patch is refused: the backend keeps
the mirror and the read is safe. Otherwise the owner itself is refused.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from functools import partial
from typing import TYPE_CHECKING, ClassVar

from patchkit.audit.reads import OPTS_OUT_WITH, Read
from patchkit.postconditions import HeadStart, Postcondition, Proposed, Violation, map_line

if TYPE_CHECKING:
    from patchkit.audit import Audit
    from patchkit.tree import Tree


class MirrorReadsGuarded(Postcondition):
    """No read of the CPU seq_lens mirror unguarded or stale once it is dropped."""

    def __init__(self) -> None:
        self.srt: dict[str, bytes] | None = None  # the tree's modules under srt/ as read (head_start)

    def head_start(self, tree: Tree) -> HeadStart:
        """Work the transform's worker processes can take on for the audit
        (and the tree's modules under srt/ as read, kept for ``check``).
        Once their files are transformed, the workers compute the facts of
        every module that reads the mirror, as read (the modules apply
        leaves as they are, and the release's own bytes of those it changes,
        on a release tree) but the files the workers transform, in chunks
        taken into this process's memory; and each worker, the facts of the
        files it transformed, as read and as written (kept in the shared
        cache, where the audit finds them). So the audit after the transform
        is shared between the cores. Only a head start: that audit is the
        same call on the same bytes, and computes whatever is missing."""
        from patchkit import audit
        from patchkit.audit import facts

        srt = self.srt = audit.sources(tree.package)

        def side(
            transformed: frozenset,
        ) -> list:  # only when files are transformed in worker processes (a warm apply has none)
            modules = sorted(
                ((rel, data) for rel, data in srt.items() if rel not in transformed and facts.reads_mirror(data)),
                key=lambda m: -len(m[1]),
            )
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

        return HeadStart(side, facts.remember, after)

    def check(self, proposed: Proposed) -> Violation | None:
        read = first_unsafe_read(proposed.tree, dict(proposed.changed), dict(proposed.release), self.srt)
        if read is None:
            return None
        culprit = OPTS_OUT_WITH.get(read.file)
        if culprit not in proposed.applying:
            culprit = proposed.owner if proposed.owner in proposed.applying else None
        if culprit is None:  # not this apply's doing: audit and verify report it
            return None
        on_disk = self.srt.get(read.file) if self.srt is not None else _read(proposed.tree, read.file)
        return Violation(culprit, refusal(read, disk_line(read, proposed.changed.get(read.file), on_disk), culprit))

    def audit(self, tree: Tree) -> Audit:
        """``patchkit audit``: every read of the mirror on ``tree`` as it is, classified."""
        from patchkit.audit import audit_tree

        return audit_tree(tree.package)


def first_unsafe_read(
    tree: Tree,
    changed: dict[str, bytes],
    release_files: dict[str, bytes | None] | None = None,
    srt: dict[str, bytes] | None = None,
) -> Read | None:
    """The first read (by file, line) the audit finds unguarded or stale on
    the tree with ``changed`` (package-relative path -> new bytes) written;
    ``release_files``: the release's bytes of the files apply changes (its
    fetch step), which tell the release's reads there without its tree;
    ``srt``: the tree's modules under srt/ as read, when already read."""
    from patchkit import audit
    from patchkit.transform.cache import TransformCache

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
    key = shared.fact_key(FirstUnsafeRead, audit.fingerprint(tree.package, srt), given)
    cached = shared.get_fact(key, FirstUnsafeRead)
    if cached is not None:
        return cached.read
    from patchkit.transform.parallel import no_gc

    # The vendor's own reads are the vendor's to guard: apply names them in its audit line, as before.
    with no_gc():  # ast trees hold no cycles; a collection would re-scan every node the transform left alive
        audited = audit.audit_tree(tree.package, sources=srt, release_files=release_files)
    problems = [r for r in audited.problems if r.origin != "vendor"]
    read = min(problems, key=lambda r: (r.file, r.line, r.column), default=None)
    shared.put_fact(key, FirstUnsafeRead(read))
    return read


@dataclass(frozen=True)
class FirstUnsafeRead:
    """``first_unsafe_read``'s answer on a tree's bytes (None: no such read):
    a fact of the transform cache, shared like a transform."""

    KIND: ClassVar[str] = "first-unsafe-read"
    read: Read | None

    def to_json(self) -> dict[str, object] | None:
        return None if self.read is None else asdict(self.read)

    @classmethod
    def from_json(cls, data: object) -> FirstUnsafeRead:
        if data is None:
            return cls(None)
        if not isinstance(data, dict):
            raise TypeError("not a read")
        return cls(Read(**data))  # TypeError: written by another shape of Read (a miss: audit again)


def disk_line(read: Read, written: bytes | None, on_disk: bytes | None) -> int:
    """The line of ``read`` (a read of ``written``, the file as apply would
    write it) in the file as it is on disk (``on_disk``): where the
    maintainer finds it."""
    if written is None or on_disk is None:
        return read.line
    return map_line(written, on_disk, read.line, read.code.encode("utf-8", "surrogateescape"))


def refusal(read: Read, line: int | None, patch: str) -> str:
    """One line: what is refused and why, and what the maintainer can do
    (``line``: the read's line on disk, :func:`disk_line`)."""
    from patchkit.registry import skip_advice

    return (
        f"refused: {read.file}:{line or read.line}: {read.function} reads `{read.code}` {read.verdict} once the "
        f"mirror is dropped, so nothing of {patch} is written: guard that line with a None test "
        f"(`if ... is None:`; `patchkit audit` lists every read), or {skip_advice(patch)}"
    )


def _read(tree: Tree, rel: str) -> bytes | None:
    try:
        return tree.read(rel)
    except OSError:
        return None
