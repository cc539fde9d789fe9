"""The journal a transaction leaves while it writes (``.patchkit/journal.json``,
written by ``Store.commit``): read back as a ``Pending`` transaction, and the
line a failed write of the tree says."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from patchkit import tree
from patchkit.errors import PatchkitError, untrusted_json
from patchkit.state.record import Record


@dataclass(frozen=True)
class Pending:
    """A transaction a killed run left behind."""

    verb: str  # apply | revert
    files: list[dict]  # {"file", "before", "after"}: sha256 or None
    state: Record
    old_state: Optional[Record]

    def line(self) -> str:
        other = "revert" if self.verb == "apply" else "apply"
        return (
            f"an interrupted {self.verb} of {len(self.files)} files is pending: `patchkit {self.verb}` "
            f"finishes it, `patchkit {other}` rolls it back"
        )


def read_journal(journal: Path, root: Path) -> Optional[Pending]:
    """The transaction ``journal`` (a file inside ``root``) records, None
    where there is none; one that cannot be read names ``--recover``."""
    where = str(journal)
    try:
        data = tree.read_regular(journal, root)
        if data is None:
            return None
        doc = untrusted_json(data)
        entries, state, old = doc["files"], doc["state"], doc.get("old_state")
        for entry in entries:
            tree.relative(entry["file"], where)
            tree.digest(entry["before"], where)
            tree.digest(entry["after"], where)
        return Pending(
            doc.get("verb", "apply"),
            entries,
            Record.from_state(state, where),
            None if old is None else Record.from_state(old, where),
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError, PatchkitError):
        raise PatchkitError(
            f"{journal}: corrupt transaction journal; `patchkit revert --recover` puts every "
            "file back from the backups (and keeps the journal, set aside)"
        ) from None


@contextlib.contextmanager
def settling(journal: Path, verb: str) -> Iterator[None]:
    """A write that fails while a pending transaction is settled: one line; the journal stays."""
    try:
        yield
    except OSError as exc:
        raise PatchkitError(
            f"{cannot_write(exc)}, while settling an interrupted {verb}; {journal} stays, and the next "
            "`patchkit revert` (or the same command, once it can write) will finish it"
        ) from None


def cannot_write(exc: OSError) -> str:
    """``path: cannot write (No space left on device)``."""
    return f"{exc.filename or '?'}: cannot write ({exc.strerror or exc})"
