"""patchkit as a library: one function per command, each returning a value.

The command line (``patchkit.cli``) only parses arguments, calls one of
these and prints what it returns; the release matrix, ``scripts/``, the GPU
harness and the tests call them directly. So what a command does (which
tree, what it refuses, what it counts) lives here, once, and printing
lives in the CLI and ``patchkit.output``.

Every function takes ``say``: where diagnostics go (the CLI passes a
stderr printer; the default drops them). Errors raise ``PatchkitError``
(one line; nothing changed). Nothing here prints.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from patchkit import registry
from patchkit import tree as trees
from patchkit.api.commit import Outcome
from patchkit.engine import Session, locked_session
from patchkit.errors import Interrupted, PatchkitError
from patchkit.results import PatchReport

if TYPE_CHECKING:
    from patchkit.api.exporting import Series
    from patchkit.api.views import CodemodView, FileDiff
    from patchkit.postconditions import Report
    from patchkit.registry import Patch
    from patchkit.transform.parallel import Progress
    from patchkit.tree import Tree

Say = Callable[[str], None]

UNLOADED = (
    "{ids}: applied to this tree from a patch set that is not loaded now; name it (--patches DIR, "
    "[tool.patchkit] patches in the tree's pyproject.toml for apply and revert, or install it)"
)


def _drop(message: str) -> None:
    """The default ``say``: a library caller reads the returned values."""


@dataclass
class Located:
    tree: "Tree"
    given: str  # the path as the caller gave it: printed paths are relative to it


@dataclass
class StatusResult:
    """What ``status`` and ``verify`` found: a report per patch."""

    where: Located
    reports: list[PatchReport]
    runtime: Optional[dict]  # the runtime the applied patches use (None: none applied)
    notes: list[str]  # what the tree's record says of itself (a clone, leftovers)
    pending: Optional[str]  # a half-done transaction, as one line
    recorded_files: list[str]  # files patchkit changed or added
    audit_problems: Optional[int] = None  # verify: unguarded or stale reads of the mirror

    @property
    def ok(self) -> bool:
        """Every patch applied or native, and no transaction half-done."""
        return self.pending is None and all(r.ok for r in self.reports)


@dataclass
class ChangeResult:
    """What ``apply`` or ``revert`` did (``dry``: would do)."""

    verb: str  # apply | revert
    where: Located
    outcome: Outcome
    dry: bool
    vendor_line: Optional[str] = None  # apply: unguarded mirror reads in the vendor's own code

    def counts(self) -> str:
        """'12 file(s) changed, 7 added': files patchkit created (its runtime
        folder, the manifest) or removed are counted apart."""
        verb = "would change" if self.dry else "changed"
        kinds = [(old is None, new is None) for old, new in self.outcome.changed.values()]
        text = f"{kinds.count((False, False))} file(s) {verb}"
        for kind, word in (((True, False), "added"), ((False, True), "removed")):
            if kinds.count(kind):
                text += f", {kinds.count(kind)} {'would be ' if self.dry else ''}{word}"
        return text


@dataclass
class ShowResult:
    patch: "Patch"
    codemods: list["CodemodView"]
    runtime: list[str]  # where patched code imports the patch's runtime from
    diff: Optional[str] = None  # with_diff: what the patch changes (or changed) on the tree


@dataclass
class ExportResult:
    where: Located
    series: "Series"


@dataclass
class DiffResult:
    where: Located
    diffs: list["FileDiff"] = field(default_factory=list)


@dataclass
class AuditReport:
    where: Located
    result: "Report"


def locate(given: Optional[str], say: Say = _drop, announce: bool = True, load_config: bool = False) -> Located:
    """The tree at (or above) ``given``, default the current folder. Found
    elsewhere than exactly at ``given``, ``say`` gets which tree was taken
    (unless the command's own first line names it: ``announce`` False).
    Patch sets that the tree's repository's pyproject.toml names load where
    ``load_config`` (apply, revert); other commands say they are there. A
    ``say`` with a ``tree_line`` method gets that line there (the CLI holds
    it back until the command prints something else: an error stays one line)."""
    shown, tree, found = trees.locate(given)
    if found and announce:
        getattr(say, "tree_line", say)(f"sglang {tree.version} at {tree.package} ({tree.layout} layout)")
    unloaded = registry.use_config(tree, load_config)
    if unloaded:
        say(unloaded)
    return Located(tree, shown)


def _unloaded(session: Session) -> list[str]:
    """Patches the tree records as applied that no loaded patch set defines."""
    known = {p.id for p in registry.all_patches()}
    return [pid for pid in session.record.applied if pid not in known]


def _refuse(session: Session) -> None:
    """What apply, revert, diff, show and export refuse: a half-written tree."""
    if session.snapshot.pending is not None:
        raise PatchkitError(session.snapshot.pending.line())
    if session.snapshot.unrecorded:
        raise PatchkitError(f"{session.snapshot.unrecorded}; nothing was changed")


def _refuse_unloaded(session: Session) -> None:
    """apply and revert also refuse patches whose definitions are not loaded:
    they rebuild files from their originals with the patches that stay."""
    missing = _unloaded(session)
    if missing:
        raise PatchkitError(UNLOADED.format(ids=", ".join(missing)) + ", then run this again; nothing was changed")


def _note_unloaded(session: Session, say: Say) -> None:
    missing = _unloaded(session)
    if missing:
        say("note: " + UNLOADED.format(ids=", ".join(missing)) + " to check it too")


def _status(where: Located, ids: Iterable[str], say: Say, audit: bool) -> StatusResult:
    with locked_session(where.given, say) as session:
        reports = session.reports(registry.select(ids) if ids else None)
        problems = session.audit_problems() if audit else None
    _note_unloaded(session, say)
    pending = session.snapshot.pending
    return StatusResult(
        where,
        reports,
        session.runtime_info(),
        session.snapshot.notes(),
        None if pending is None else pending.line(),
        list(session.record.files),
        problems,
    )


def status(
    tree: Optional[str] = None, ids: Iterable[str] = (), say: Say = _drop, announce: bool = True
) -> StatusResult:
    """Each patch's state on the tree (all patches, or ``ids`` and what they require)."""
    return _status(locate(tree, say, announce), ids, say, audit=False)


def verify(
    tree: Optional[str] = None, ids: Iterable[str] = (), say: Say = _drop, announce: bool = True, audit: bool = True
) -> StatusResult:
    """``status``, plus (``audit``) how many reads of the CPU mirror the
    vendor's code leaves unguarded; ``result.ok`` is the verdict."""
    where = locate(tree, say, announce)
    result = _status(where, ids, say, audit)
    if result.pending is not None:
        say(f"verify: {result.pending}")
    return result


def apply(
    tree: Optional[str] = None,
    ids: Iterable[str] = (),
    skip: Iterable[str] = (),
    dry_run: bool = False,
    runtime: Optional[str] = None,
    cascade: bool = False,
    say: Say = _drop,
    audit_vendor: bool = True,
    progress: Optional["Progress"] = None,
    accept_vendor_code_risk: bool = False,
) -> ChangeResult:
    """Apply the patches (all by default, with what they require; not
    ``skip``, and with ``cascade`` what requires a skipped one). ``dry_run`` writes nothing. ``runtime``: vendored | package.
    ``audit_vendor``: audit the written tree for the vendor's own unguarded
    reads of the mirror (``result.vendor_line``). ``progress(done, total)``
    hears of each file transformed ahead (none the cache had). The release's
    bytes the vendor-code check needs are downloaded (offline: refused in one
    line) unless ``accept_vendor_code_risk``."""
    from patchkit.api.applying import apply_patches

    where = locate(tree, say, load_config=True)
    selected = registry.select(ids, skip, cascade)
    result, session = None, None
    try:
        with locked_session(where.given, say, None if dry_run else "apply") as session:
            _refuse(session)
            _refuse_unloaded(session)
            outcome = apply_patches(
                session,
                selected,
                dry_run=dry_run,
                runtime=runtime,
                progress=progress,
                accept_vendor_code_risk=accept_vendor_code_risk,
                say=say,
            )
            result = ChangeResult("apply", where, outcome, dry_run)
            if audit_vendor and not dry_run:  # the tree as written, the count kept with the session's findings
                from patchkit.audit import facts, vendor_line

                count = session.vendor_problems(
                    (t.file for p in registry.all_patches() for t in p.targets), outcome.release_own
                )
                known = facts.cached_release(session.tree.package) is not None
                release = session.tree.release or session.tree.version  # 0.5.11+acme: 0.5.11
                result.vendor_line = vendor_line(count, release, known)
    except Interrupted as exc:
        raise _keep_committed(exc, result, session, "apply", where, dry_run) from exc
    return result


def revert(
    tree: Optional[str] = None,
    ids: Iterable[str] = (),
    cascade: bool = False,
    force: bool = False,
    dry_run: bool = False,
    say: Say = _drop,
    recover: bool = False,
) -> ChangeResult:
    """Revert the patches patchkit applied (all by default), byte for byte;
    edits made since are kept by a 3-way merge, or (``force``) discarded.
    ``recover``: every file back to its original from the backups alone, for
    a journal or state that cannot be read (``patchkit.state.recovery``)."""
    from patchkit.api.reverting import revert_patches

    where = locate(tree, say, load_config=True)
    if recover:
        if ids or cascade or force:
            raise PatchkitError("--recover puts every file back: it takes no PATCH, --cascade or --force")
        return _recover(where, dry_run)
    result, session = None, None
    try:
        with locked_session(where.given, say, None if dry_run else "revert") as session:
            _refuse(session)
            _refuse_unloaded(session)
            outcome = revert_patches(session, list(ids), cascade=cascade, force=force, dry_run=dry_run)
            result = ChangeResult("revert", where, outcome, dry_run)
    except Interrupted as exc:
        raise _keep_committed(exc, result, session, "revert", where, dry_run) from exc
    return result


def _recover(where: Located, dry_run: bool) -> ChangeResult:
    from patchkit import settings
    from patchkit.state import Store, recovery

    store = Store(where.tree.state_dir)
    with store.locked(settings.lock_timeout()):
        done = recovery.recover(store, where.tree, dry_run)
    messages = [f"set aside: .patchkit/{path.relative_to(store.folder)}" for path in done.set_aside]
    messages += [
        f"{where.tree.shown_path(rel, where.given)}: holds bytes patchkit never wrote (edited since?); left as it is"
        for rel in done.unknown
    ]
    outcome = Outcome([], changed=done.changed, messages=messages)
    return ChangeResult("revert", where, outcome, dry_run)


class InterruptedChange(Interrupted):
    """A signal ended apply or revert: ``change`` is what it wrote, when its
    transaction was committed, else None (nothing was written). What the CLI
    reports (``patchkit.arguments.report_interrupt``)."""

    def __init__(self, signum: int, waited: bool, change: Optional[ChangeResult]) -> None:
        super().__init__(signum, waited)
        self.change = change


def _keep_committed(
    exc: Interrupted,
    result: Optional[ChangeResult],
    session: Optional[Session],
    verb: str,
    where: Located,
    dry_run: bool,
) -> InterruptedChange:
    """A signal ended apply or revert: the ``InterruptedChange`` to raise,
    with what it wrote, when its transaction was committed (it returned, the
    signal waited for the write's end, or came between the commit and the
    return: the store says so), else None (nothing was written)."""
    written = session.writing if session is not None and session.store.committed else None
    if result is None and isinstance(written, Outcome):
        result = ChangeResult(verb, where, written, dry_run)
    return InterruptedChange(exc.signum, exc.waited, None if result is None or dry_run else result)


def diff(tree: Optional[str] = None, ids: Iterable[str] = (), say: Say = _drop) -> DiffResult:
    """Original -> now for every file patchkit changed (or those of ``ids``)."""
    from patchkit.api.views import file_diffs

    where = locate(tree, say)
    patches = [registry.by_id(i) for i in ids] if ids else None
    with locked_session(where.given, say) as session:
        _refuse(session)
        return DiffResult(where, file_diffs(session, patches))


def show(patch_id: str, tree: Optional[str] = None, with_diff: bool = False, say: Say = _drop) -> ShowResult:
    """One patch: its codemods and runtime; ``with_diff``: what applying it
    (and what it requires) changes on the tree, or what it changed there."""
    from patchkit.api import views

    patch = registry.by_id(patch_id)
    diff_text = _show_diff(patch, tree, say) if with_diff else None
    return ShowResult(patch, views.codemods(patch), views.runtime_modules(patch), diff_text)


def _show_diff(patch: "Patch", tree: Optional[str], say: Say) -> str:
    from patchkit.api.applying import apply_patches
    from patchkit.api.views import file_diffs

    where = locate(tree, say)
    with locked_session(where.given, say) as session:
        _refuse(session)
        if patch.id in session.record.applied:
            return "".join(d.text for d in file_diffs(session, [patch]))
        outcome = apply_patches(session, registry.select([patch.id]), dry_run=True, runtime=None)
    if not outcome.changed:
        say(f"show: {patch.id} changes nothing on this tree (see `patchkit status`)")
    return outcome.diff(session.tree)


def export(
    tree: Optional[str] = None, author: Optional[str] = None, say: Say = _drop, progress: Optional["Progress"] = None
) -> ExportResult:
    """The change patchkit applied, as a git format-patch series (one patch
    per patchkit patch, in dependency order); its notes go to ``say``;
    ``progress(done, total)`` hears of each transform computed."""
    from patchkit.api.exporting import DEFAULT_AUTHOR, build_series

    where = locate(tree, say)
    with locked_session(where.given, say) as session:
        _refuse(session)
        series = build_series(session, author or DEFAULT_AUTHOR, progress=progress)
    for note in series.notes:
        say(f"note: {note}")
    return ExportResult(where, series)


def audit(tree: Optional[str] = None, say: Say = _drop) -> AuditReport:
    """Every read of the CPU seq_lens mirror on the spec-v2 paths, classified:
    the report of the postcondition the patch that drops the mirror declares."""
    from patchkit.api import checking

    where = locate(tree, say)
    return AuditReport(where, checking.audit(registry.load().patches, trees.find_tree(where.given)))
