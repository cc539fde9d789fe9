"""apply's transform step, checked: the files of the patches to apply
transformed, less what the vendor-code check or a postcondition refuses.

The api hands down plain values (the plan's patches, the checks patches
declare, made and guarded, the release's bytes) and gets one ``Transformed``
back: nothing here calls up to the api or the read side.

A refusal takes out one patch with those that require it (one line each:
the refusal's, then ``requires X, which is refused``); the others are
transformed again without them and checked again, until every check holds
or fails for no patch of this apply (a violation naming another patch is
not this apply's doing: ``status``, ``verify`` and the check's own command
report it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from patchkit.errors import PatchkitError
from patchkit.postconditions import Proposed, Violation, map_line
from patchkit.transform.checks import Check, guarded
from patchkit.transform.vendor_code import VendorCodeLost

if TYPE_CHECKING:
    from patchkit.registry import Patch
    from patchkit.transform.transformer import Transformer
    from patchkit.tree import Tree

Skipped = tuple[tuple[str, str], ...]  # (patch id, why)


@dataclass(frozen=True)
class Transformed:
    """What the checked transform gives: the patches it kept, the files
    they change (rel -> new bytes), the patches it refused, with why, and
    the notes of its transforms (vendor code replaced on purpose, a check
    skipped; those of an attempt the vendor-code check refused are dropped)."""

    todo: tuple[Patch, ...]
    changed: Mapping[str, bytes]
    skipped: Skipped
    notes: tuple[str, ...] = ()


def transform_checked(
    transformer: Transformer,
    todo: Iterable[Patch],
    applied: Iterable[str],
    checks: list[Check],
    planned: Skipped,
    lines_as_written: bool,
) -> Transformed:
    """``todo`` transformed (``transformer``: its sources and release bytes),
    less what the vendor-code check and ``checks`` refuse, with everything
    skipped: ``planned`` (the plan's), the transform's refusals, then the
    checks'. ``lines_as_written``: a refusal names the line of the file as
    this apply leaves it (not dry)."""
    applied = frozenset(applied)
    done = _transform_refusing(transformer, tuple(todo))
    todo, changed, skipped, notes = done.todo, done.changed, tuple(planned) + done.skipped, done.notes
    refused: Skipped = ()
    while todo:
        ids = frozenset(p.id for p in todo)
        violation = _first_violation(checks, transformer.tree, changed, transformer.pristine, ids, applied)
        if violation is None:
            break
        dropped = dependents(violation.refuse, todo)
        refused += ((violation.refuse, violation.why),)
        refused += tuple((p.id, f"requires {violation.refuse}, which is refused") for p in dropped)
        gone = {violation.refuse, *(p.id for p in dropped)}
        done = _transform_refusing(transformer, tuple(p for p in todo if p.id not in gone))
        todo, changed, skipped, notes = done.todo, done.changed, skipped + done.skipped, notes + done.notes
    skipped += refused
    if lines_as_written:
        skipped = tuple((pid, lines_after(why, transformer.sources, changed)) for pid, why in skipped)
    return Transformed(todo, changed, skipped, tuple(dict.fromkeys(notes)))


def files_of(todo: Iterable[Patch], sources: Mapping[str, bytes]) -> list[str]:
    """The target files of ``todo`` that the tree has, in order, once each."""
    return list(dict.fromkeys(t.file for p in todo for t in p.targets if t.file in sources))


def _transform_refusing(transformer: Transformer, todo: tuple[Patch, ...]) -> Transformed:
    """The files of ``todo`` transformed (rel -> new bytes, those that
    change). A patch the vendor-code check refuses is taken out, with the
    patches that require it, each skipped with its one-line reason; the
    others are transformed again without it (one refusal never blocks the rest)."""
    skipped: Skipped = ()
    while True:
        try:  # what a refused attempt noted no longer holds: only the last attempt's notes
            changed, notes = transformer.transform_files(files_of(todo, transformer.sources), todo)
            return Transformed(todo, changed, skipped, notes)
        except VendorCodeLost as exc:
            if exc.patch is None or exc.patch not in {p.id for p in todo}:
                raise  # not one patch's doing (the import block): the whole apply stops
            skipped += ((exc.patch, f"{exc.site}; {exc.remedy}"),)
            out = {exc.patch}
            for patch in todo:  # in order: a patch comes after those it requires
                if patch.id not in out and any(r in out for r in patch.requires):
                    skipped += (
                        (patch.id, f"requires {next(r for r in patch.requires if r in out)}, which was refused"),
                    )
                    out.add(patch.id)
            todo = tuple(p for p in todo if p.id not in out)


def _first_violation(
    checks: list[Check],
    tree: Tree,
    changed: Mapping[str, bytes],
    release: Mapping[str, bytes | None],
    ids: frozenset[str],
    applied: frozenset[str],
) -> Violation | None:
    """The first violation, of the checks whose owner is applied now or
    before, that names a patch of this apply (``ids``)."""
    for check in checks:
        if check.owner in ids or check.owner in applied:
            proposed = Proposed(tree, changed, release, ids, applied, check.owner)
            violation = guarded(check.owner, check.name, check.postcondition.check, proposed)
            if violation is not None and not isinstance(violation, Violation):
                raise PatchkitError(
                    f"postcondition {check.name} of {check.owner} returned {type(violation).__name__}, "
                    "not None or a patchkit.postconditions.Violation; nothing was changed"
                )
            if violation is not None and violation.refuse in ids:
                return violation
    return None


def dependents(pid: str, todo: Iterable[Patch]) -> list[Patch]:
    """The patches of ``todo`` (in order: a patch after those it requires)
    that require ``pid``, directly or through others."""
    out: list[Patch] = []
    for patch in todo:
        if pid in patch.requires or any(d.id in patch.requires for d in out):
            out.append(patch)
    return out


_REFUSED_AT = re.compile(r"^refused: ([^:\s]+):(\d+): ")


def lines_after(why: str, before: Mapping[str, bytes], after: Mapping[str, bytes]) -> str:
    """A refusal line (``refused: FILE:LINE: ...``) naming the line of the file
    as the apply leaves it (``after``: the files it writes; ``before``: as
    they were), when the other patches change that file too."""
    found = _REFUSED_AT.match(why)
    if not found or found.group(1) not in after or found.group(1) not in before:
        return why
    rel, line = found.group(1), int(found.group(2))
    return f"refused: {rel}:{map_line(before[rel], after[rel], line)}: {why[found.end() :]}"
