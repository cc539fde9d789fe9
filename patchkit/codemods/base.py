"""The contract every patch codemod follows.

A codemod is a libcst ``Codemod`` that makes one structural change to one file
and can say, without changing anything, whether that change is still to do,
already there, or impossible (its anchor is missing). The engine parses each
file once, asks every codemod for that file to ``detect``, transforms with the
ones that report ``TODO``, and checks that all of them report ``DONE`` on the
result: that is the idempotence and the postcondition in one place.
"""

from __future__ import annotations

from typing import ClassVar, Optional

import libcst as cst
from libcst.codemod import Codemod, CodemodContext

from patchkit.codemods import primitives
from patchkit.findings import Finding, State  # noqa: F401 - re-exported: codemods import them from here


class PatchCodemod(Codemod):
    """Base of all patch codemods. Subclasses set DESCRIPTION and implement
    ``detect`` and ``transform_module_impl``."""

    DESCRIPTION: ClassVar[str] = ""
    # Cheap pre-filter: if the file's bytes lack any of these, the anchor cannot
    # be there and the codemod reports MISSING without a parse.
    REQUIRED_TEXT: ClassVar[tuple[str, ...]] = ()

    def __init__(self, context: Optional[CodemodContext] = None) -> None:
        super().__init__(context or CodemodContext())

    @classmethod
    def name(cls) -> str:
        return f"{cls.__module__.rsplit('.', 1)[-1]}.{cls.__name__}"

    def detect(self, module: cst.Module) -> Finding:
        raise NotImplementedError

    def transform_module(self, tree: cst.Module) -> cst.Module:
        # Codemod.transform_module wraps the tree in a MetadataWrapper, which
        # deep-copies the whole module: as costly as parsing it. Our codemods
        # navigate to their anchor and need no metadata, so skip that copy.
        return self.transform_module_impl(tree)

    def require_import(self, module: str, obj: Optional[str] = None) -> None:
        """Ask the engine to add ``from module import obj`` (or ``import module``)
        to this file's import block, unless it is there (``primitives.add_imports``)."""
        primitives.require_import(self.context, module, obj)


class ClassCodemod(PatchCodemod):
    """A change confined to one top-level class: subclasses set CLASS and
    implement ``detect_in_class`` / ``transform_class``."""

    CLASS: ClassVar[str]

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        # The class name is the natural pre-filter: a subclass that names a
        # CLASS and no REQUIRED_TEXT of its own gets (CLASS,).
        if "CLASS" in cls.__dict__ and "REQUIRED_TEXT" not in cls.__dict__:
            cls.REQUIRED_TEXT = (cls.CLASS,)

    def detect(self, module: cst.Module) -> Finding:
        cls = primitives.find_class(module, self.CLASS)
        if cls is None:
            return Finding.missing(self.CLASS, f"class {self.CLASS} not found")
        return self.detect_in_class(cls)

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        return primitives.replace_class(tree, self.CLASS, self.transform_class)

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        raise NotImplementedError

    def transform_class(self, cls: cst.ClassDef) -> cst.ClassDef:
        raise NotImplementedError


class AddMethodCodemod(ClassCodemod):
    """Add a method a class lacks; done when a method of that name exists
    (ours or upstream's). Subclasses set CLASS, METHOD, SOURCE and AFTER
    (methods to put it after, first one found wins; else at the end)."""

    METHOD: ClassVar[str]
    SOURCE: ClassVar[str]
    AFTER: ClassVar[tuple[str, ...]] = ()

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        anchor = f"{self.CLASS}.{self.METHOD}"
        if primitives.find_method(cls, self.METHOD) is not None:
            return Finding.done(anchor)
        return Finding.todo(anchor, "method not defined")

    def transform_class(self, cls: cst.ClassDef) -> cst.ClassDef:
        after = primitives.find_first_method(cls, self.AFTER)
        return primitives.add_method(cls, self.SOURCE, after=after.name.value if after else None)
