"""The postconditions patches declare (``patchkit.postconditions``), made
for one apply: each a ``Check`` of its owner, every call to it guarded (a
check that fails to run stops the command in one line), and their head
starts as one for the transform's workers (``Transformer.prepare``). Knows
no patch and no check by name."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from patchkit.errors import PatchkitError, failure_in
from patchkit.postconditions import HeadStart, Postcondition
from patchkit.registry import definitions

if TYPE_CHECKING:
    from patchkit.registry import Patch
    from patchkit.tree import Tree


@dataclass(frozen=True)
class Check:
    owner: str  # the patch that declared it
    postcondition: Postcondition

    @property
    def name(self) -> str:
        return type(self.postcondition).__name__


def guarded(owner: str, name: str, method: Callable, *args):
    """A check made or its method called: a check that fails to run stops
    the command in one line (nothing changed)."""
    with failure_in(f"postcondition {name} of {owner}"):
        return method(*args)


def declared(patches: Iterable[Patch], wanted: Iterable[str]) -> list[Check]:
    """A fresh instance of every check that ``patches`` declare whose owner
    is in ``wanted`` (selected now, or applied before), in their order."""
    wanted = set(wanted)
    return [made(p.id, ref) for p in patches if p.id in wanted for ref in p.postconditions]


def made(owner: str, ref) -> Check:
    """The check ``ref`` (``module:Class``) that ``owner`` declares, made."""
    cls = definitions.load_postcondition(ref)
    if not (isinstance(cls, type) and issubclass(cls, Postcondition)):
        raise PatchkitError(
            f"postcondition {ref if isinstance(ref, str) else f'{ref.module}:{ref.cls}'} of {owner} is not a "
            "patchkit.postconditions.Postcondition"
        )
    return Check(owner, guarded(owner, cls.__name__, cls))


def head_start(checks: list[Check], tree: Tree | None) -> HeadStart | None:
    """The head starts ``checks`` ask of the transform's workers, as one."""
    starts = [s for c in checks if (s := guarded(c.owner, c.name, c.postcondition.head_start, tree)) is not None]
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


@dataclass(frozen=True)
class _Tagged:
    """A side job of one of several head starts: its result comes back with the index of its ``take``."""

    start: int
    job: Callable[[], object]

    def __call__(self) -> tuple:
        return self.start, self.job()
