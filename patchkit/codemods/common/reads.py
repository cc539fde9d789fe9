"""What a codemod reads of its file (``PatchCodemod.reads``): the engine
parses only that (``patchkit.transform.partial``), and between two edits a
codemod whose part of the file is untouched is not asked again.

A codemod declares it; what it does not declare it reads whole. Each class
that defines a hook of its own (``detect``, ``detect_in_class`` ...) says
what that hook reads, else the whole module (or class) counts as read.
tests/trees/test_transform_partial.py proves the declarations on every release
patchkit knows: the partial parse is only ever used on a file whose bytes
are such a release's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Methods:
    """The methods of a class a codemod reads: those ``named``, and every one
    whose source holds one of ``words`` (identifiers its matchers need
    spelled out: a method without them cannot hold a match). The class's
    own statements (attributes, docstring) are always read."""

    named: frozenset[str] = frozenset()
    words: frozenset[str] = frozenset()

    def __or__(self, other: "Methods") -> "Methods":
        return Methods(self.named | other.named, self.words | other.words)

    def read(self, name: str, source: bytes) -> bool:
        return name in self.named or any(word.encode() in source for word in self.words)


# Top-level class or function name -> None (all of it) or the methods read;
# EVERY -> the methods read of every top-level class, and the top-level
# functions read (those holding its words).
Reads = dict[str, Optional[Methods]]
EVERY = "*"

# Where a codemod reads the module, and where its class.
MODULE_HOOKS = ("detect", "transform_module", "transform_module_impl")
CLASS_HOOKS = ("detect_in_class", "transform_class", "find_method", "detect_absent")


def _owner(cls: type, name: str) -> type:
    return next(k for k in cls.__mro__ if name in k.__dict__)


def reads_only(cls: type, hooks: tuple[str, ...], *bases: type) -> bool:
    """Whether each of ``hooks`` comes to ``cls`` from one of ``bases``, or
    from a class whose override reads or adds only top-level statements that
    are not classes or functions (imports, module flags: ``TOP_LEVEL_ONLY``;
    a partial parse keeps them all)."""
    for name in hooks:
        owner = _owner(cls, name)
        if owner not in bases and not owner.__dict__.get("TOP_LEVEL_ONLY"):
            return False
    return True


def declared_methods(cls: type, *named_too: str) -> Optional[Methods]:
    """The methods of its class ``cls`` reads: ``named_too`` and what each
    class of its MRO declares its own hooks read (``METHODS_READ``, and
    ``WORDS_READ``), together; None (the whole class) where one declares
    None, or defines a class hook without declaring what it reads."""
    named: set[str] = set(named_too)
    words: set[str] = set()
    for k in cls.__mro__:
        own = k.__dict__
        if "METHODS_READ" in own:
            if own["METHODS_READ"] is None:
                return None
            named.update(own["METHODS_READ"])
            words.update(own.get("WORDS_READ", ()))
        elif any(hook in own for hook in CLASS_HOOKS):
            return None
    return Methods(frozenset(named), frozenset(words))


def merged(wanted: list[Optional[Reads]]) -> Optional[Reads]:
    """What codemods that read ``wanted`` read together (None: one reads the whole module)."""
    out: Reads = {}
    for reads in wanted:
        if reads is None:
            return None
        for name, methods in reads.items():
            if name not in out:
                out[name] = methods
            elif (had := out[name]) is None or methods is None:
                out[name] = None
            else:
                out[name] = had | methods
    return out
