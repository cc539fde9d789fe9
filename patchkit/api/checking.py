"""apply's check step, between transform and commit: the postconditions
patches declare (``patchkit.postconditions``) on the tree as it would be
written. Knows no patch and no check by name.

A check runs when its patch is applied now or was before. The first that
fails names a patch of this apply to refuse: that patch and those that
require it are skipped (one line each: the check's, then ``requires X,
which is refused``), the others are transformed again without them and
checked again, until every check holds or fails for no patch of this apply
(a violation naming another patch is not this apply's doing: ``status``,
``verify`` and the check's own command report it). Exit 1, as for any patch not applied.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from patchkit.errors import PatchkitError, interrupt_in
from patchkit.postconditions import HeadStart, Postcondition, Proposed, Report, Violation, map_line
from patchkit.registry import Patch, definitions

if TYPE_CHECKING:
    from patchkit.tree import Tree

Skipped = list[tuple[str, str]]  # (patch id, why)


class Transformed(NamedTuple):
    """What the transform step gives for a list of patches: those it kept
    (a vendor-code refusal takes one out, with its dependents), the files
    they change (rel -> new bytes) and the patches it refused, with why."""

    todo: list[Patch]
    changed: dict[str, bytes]
    skipped: Skipped


@dataclass(frozen=True)
class Check:
    owner: str  # the patch that declared it
    postcondition: Postcondition

    @property
    def name(self) -> str:
        return type(self.postcondition).__name__


def declared(patches: Iterable[Patch], wanted: Iterable[str]) -> list[Check]:
    """A fresh instance of every check that ``patches`` declare whose owner
    is in ``wanted`` (selected now, or applied before), in their order."""
    wanted = set(wanted)
    return [_made(p.id, ref) for p in patches if p.id in wanted for ref in p.postconditions]


def _made(owner: str, ref) -> Check:
    made = definitions.load_postcondition(ref)
    if not (isinstance(made, type) and issubclass(made, Postcondition)):
        raise PatchkitError(f"postcondition {ref if isinstance(ref, str) else f'{ref.module}:{ref.cls}'} of {owner} is not a "
                            "patchkit.postconditions.Postcondition")
    return Check(owner, _guarded(owner, made.__name__, made))


def head_start(checks: list[Check], tree: Tree) -> HeadStart | None:
    """The head starts the checks ask of the transform's workers, as one."""
    starts = [s for c in checks if (s := _guarded(c.owner, c.name, c.postcondition.head_start, tree)) is not None]
    if len(starts) <= 1:
        return starts[0] if starts else None

    def side(files: frozenset) -> list:
        return [_Tagged(k, job) for k, s in enumerate(starts) for job in s.side(files)]

    def take(result: object) -> None:
        start, found = result if isinstance(result, tuple) else (None, None)
        if start is not None:
            starts[start].take(found)

    def after(rel: str, source: bytes, new: bytes) -> None:
        for s in starts:
            if s.after is not None:
                s.after(rel, source, new)

    return HeadStart(side, take, after)


def audit(patches: Iterable[Patch], tree: Tree) -> Report:
    """``patchkit audit``: the report of the first check ``patches`` declare
    that offers one (``Postcondition.audit``) on ``tree`` as it stands."""
    for patch in patches:
        for ref in patch.postconditions:
            check = _made(patch.id, ref)
            report = _guarded(check.owner, check.name, check.postcondition.audit, tree)
            if report is not None:
                return report
    raise PatchkitError("no loaded patch declares a postcondition that audits a tree")


@dataclass(frozen=True)
class _Tagged:
    """A side job of one of several head starts: its result comes back with the index of its ``take``."""

    start: int
    job: Callable[[], object]

    def __call__(self) -> tuple:
        return self.start, self.job()


def refuse_until_checks_hold(tree: Tree, todo: list[Patch], applied: Iterable[str], checks: list[Check],
                             transform: Callable[[list[Patch]], Transformed],
                             release: dict[str, bytes | None]) -> Transformed:
    """``todo`` transformed, less what the checks refuse, with everything
    skipped: the transform's refusals, then the checks'."""
    applied = frozenset(applied)
    todo, changed, skipped = transform(todo)
    refused: Skipped = []
    while todo:
        ids = frozenset(p.id for p in todo)
        violation = _first_violation(checks, tree, changed, release, ids, applied)
        if violation is None:
            break
        dropped = dependents(violation.refuse, todo)
        refused.append((violation.refuse, violation.why))
        refused.extend((p.id, f"requires {violation.refuse}, which is refused") for p in dropped)
        gone = {violation.refuse, *(p.id for p in dropped)}
        todo, changed, more = transform([p for p in todo if p.id not in gone])
        skipped = skipped + more
    return Transformed(todo, changed, skipped + refused)


def _first_violation(checks: list[Check], tree: Tree, changed: dict[str, bytes],
                     release: dict[str, bytes | None], ids: frozenset[str],
                     applied: frozenset[str]) -> Violation | None:
    """The first violation, of the checks whose owner is applied now or
    before, that names a patch of this apply (``ids``)."""
    for check in checks:
        if check.owner in ids or check.owner in applied:
            proposed = Proposed(tree, changed, release, ids, applied, check.owner)
            violation = _guarded(check.owner, check.name, check.postcondition.check, proposed)
            if violation is not None and not isinstance(violation, Violation):
                raise PatchkitError(f"postcondition {check.name} of {check.owner} returned {type(violation).__name__}, "
                                    "not None or a patchkit.postconditions.Violation; nothing was changed")
            if violation is not None and violation.refuse in ids:
                return violation
    return None


def _guarded(owner: str, name: str, method: Callable, *args):
    """A check made or its method called: a check that fails to run stops
    the command in one line (nothing changed)."""
    try:
        return method(*args)
    except PatchkitError:
        raise
    except Exception as exc:  # a vendor's check may fail any way: one line
        if interrupt_in(exc) is not None:  # a signal, wrapped by Python (an import): it ends the command as itself
            raise
        raise PatchkitError(f"postcondition {name} of {owner} failed to run: {type(exc).__name__}: {exc}; "
                            "nothing was changed") from None


def dependents(pid: str, todo: list[Patch]) -> list[Patch]:
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
