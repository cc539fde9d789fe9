"""The contract every patch codemod follows.

A codemod is a libcst ``Codemod`` that makes one structural change to one file
and can say, without changing anything, whether that change is still to do,
already there, or impossible (its anchor is missing). The engine parses each
file once, asks every codemod for that file to ``detect``, transforms with the
ones that report ``TODO``, and checks that all of them report ``DONE`` on the
result: that is the idempotence and the postcondition in one place.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import ClassVar, Optional

import libcst as cst
from libcst.codemod import Codemod, CodemodContext

from patchkit.codemods.common import primitives
from patchkit.codemods.common.reads import MODULE_HOOKS, Methods, Reads, declared_methods, reads_only
from patchkit.findings import Finding, State  # noqa: F401 - re-exported: codemods import them from here

_OURS = "patchkit.codemods."  # built-in codemods; a patch set's own are named by their module


class PatchCodemod(Codemod):
    """Base of all patch codemods. Subclasses set DESCRIPTION and implement
    ``detect`` and ``transform_module_impl``."""

    DESCRIPTION: ClassVar[str] = ""
    # Cheap pre-filter: if the file's bytes lack any of these, the anchor cannot
    # be there and the codemod reports MISSING without a parse.
    REQUIRED_TEXT: ClassVar[tuple[str, ...]] = ()
    # Vendor code this codemod replaces on purpose: (pattern, why) pairs; a
    # vendor token it removes (``patchkit.transform.vendor_code``) that matches a pattern
    # (the token, or a search in its line) is reported in one line, not refused.
    REPLACES_VENDOR: ClassVar[tuple[tuple[str, str], ...]] = ()

    def __init__(self, context: Optional[CodemodContext] = None) -> None:
        super().__init__(context or CodemodContext())

    @classmethod
    def name(cls) -> str:
        # A package's codemod may live in one of its modules and be re-exported by the package
        # (dsa_no_mirror/tables.py): patches name it by the package (``dsa_no_mirror:Class``),
        # so the name must be the package's too, or the findings cached under one name are
        # looked up under the other (codemod_name).
        module = cls.__module__
        package = sys.modules.get(module.rpartition(".")[0])
        if package is not None and module.startswith(_OURS) and getattr(package, cls.__name__, None) is cls:
            module = package.__name__
        return f"{module.rsplit('.', 1)[-1]}.{cls.__name__}"

    def detect(self, module: cst.Module) -> Finding:
        raise NotImplementedError

    READS_WHOLE: Optional[str] = None  # why it reads its whole module, said (tests/unit/test_codemod_reads.py)

    @classmethod
    def reads(cls) -> Optional[Reads]:
        """What ``detect`` and the transform read of the module: top-level
        class or function name -> None (all of it) or the methods read in
        that class (``reads.Methods``); None: the whole module. The engine
        leaves the rest unparsed (``patchkit.transform.partial``)."""
        return None

    def transform_module(self, tree: cst.Module) -> cst.Module:
        # Codemod.transform_module wraps the tree in a MetadataWrapper, which
        # deep-copies the whole module: as costly as parsing it. Our codemods
        # navigate to their anchor and need no metadata, so skip that copy.
        return self.transform_module_impl(tree)

    def detect_module(self, module: cst.Module) -> None:
        """Remember the module being detected, so a finding can say where
        (:meth:`where`): codemods that report a line call this first."""
        self._module = module

    def where(self, node: cst.CSTNode) -> str:
        """``FILE:LINE`` of a node of the detected module, for messages: the
        file as the engine names it (``context.filename``), else "line N"."""
        module = None if getattr(self, "_no_lines", False) else getattr(self, "_module", None)
        line = primitives.line_of(module, node) if module is not None else None
        filename = self.context.filename
        if line is None:
            return filename or "this file"
        return f"{filename}:{line}" if filename else f"line {line}"

    def state_of(self, module: cst.Module) -> State:
        """``detect(module).state``, without the lines its words would carry
        (each costs a code generation): for the engine, between two edits."""
        self._no_lines = True
        try:
            return self.detect(module).state
        finally:
            self._no_lines = False

    def vendors_own(self, anchor: str, what: str, node: cst.CSTNode) -> Finding:
        """The tree already does what this codemod would, its own way (issue 45
        §3): superseded, not a conflict, with one note (the patch's report
        carries it, ``by_tree``) saying ``what`` the tree does and naming the
        vendor's line, ``node``: ``this tree <what> itself at FILE:LINE
        (`<code>`); patchkit leaves it as it is``. The rest of the apply goes
        on; code the codemod would remove is still refused (the vendor-code
        check), so only an anchor with nothing left to change says this."""
        code = next(
            (ln.strip() for ln in _code(node).splitlines() if ln.strip() and not ln.strip().startswith("#")), ""
        )
        code = code if len(code) <= 80 else code[:77] + "..."
        return Finding.superseded(
            anchor,
            f"this tree {what} itself at {self.where(node)} (`{code}`); patchkit leaves it as it is",
            by_tree=True,
        )

    def located(self, finding: Finding, node: Optional[cst.CSTNode]) -> Finding:
        """``finding`` at the line of ``node`` (a node of the detected module),
        unless it has a line already. Only a finding verify and status report
        at a line (todo, missing) gets one: a line costs a partial code
        generation (``primitives.line_of``), and done findings are the most."""
        module = None if getattr(self, "_no_lines", False) else getattr(self, "_module", None)
        if (
            finding.line is not None
            or node is None
            or module is None
            or finding.state not in (State.TODO, State.MISSING)
        ):
            return finding
        return finding.at(primitives.line_of(module, node))

    def require_import(self, module: str, obj: Optional[str] = None, among_siblings: bool = False) -> None:
        """Ask the engine to add ``from module import obj`` (or ``import module``)
        to this file, unless it is there, once every codemod ran: into the
        import block (``primitives.add_imports``), or ``among_siblings``: beside
        the from-imports closest to it, in isort order (``primitives.add_import_sorted``;
        libcst's AddImportsVisitor would put it right under ``from __future__``,
        above the module string sglang's files have there)."""
        primitives.require_import(self.context, module, obj, among_siblings)


class ClassCodemod(PatchCodemod):
    """A change confined to one top-level class: subclasses set CLASS and
    implement ``detect_in_class`` / ``transform_class``."""

    CLASS: ClassVar[str]
    # What this class's own class hooks read of CLASS besides its statements: the methods
    # named, those holding one of the words; None: all. Each class defining one says it.
    METHODS_READ: ClassVar[Optional[tuple[str, ...]]] = ()
    WORDS_READ: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        # The class name is the natural pre-filter: a subclass that names a
        # CLASS and no REQUIRED_TEXT of its own gets (CLASS,).
        if "CLASS" in cls.__dict__ and "REQUIRED_TEXT" not in cls.__dict__:
            cls.REQUIRED_TEXT = (cls.CLASS,)

    @classmethod
    def reads(cls) -> Optional[Reads]:
        # CLASS, unless a subclass reads the module its own way.
        return {cls.CLASS: cls.methods_read()} if reads_only(cls, MODULE_HOOKS, PatchCodemod, ClassCodemod) else None

    @classmethod
    def methods_read(cls) -> Optional[Methods]:
        """The methods of CLASS read (None: the whole class)."""
        return declared_methods(cls)

    def detect(self, module: cst.Module) -> Finding:
        self.detect_module(module)
        cls = primitives.find_class(module, self.CLASS)
        if cls is None:
            return Finding.missing(self.CLASS, f"class {self.CLASS} not found")
        return self.located(self.detect_in_class(cls), cls)

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        return primitives.replace_class(self.transform_beside(tree), self.CLASS, self.transform_class)

    def transform_beside(self, tree: cst.Module) -> cst.Module:
        """What the change edits beside the class, in the module (a decorator defined there)."""
        return tree

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        raise NotImplementedError

    def transform_class(self, cls: cst.ClassDef) -> cst.ClassDef:
        raise NotImplementedError


class ClassCheck(ClassCodemod):
    """A precondition on ``CLASS``, not an edit: ``detect_in_class`` answers
    "superseded" when it holds (nothing to do, so the patch's other parts
    decide whether it is absent, applied or native) and "missing", saying
    why, when it does not. It never reports "todo", so nothing is transformed."""

    METHODS_READ = ()  # its transform reads nothing

    def transform_class(self, cls: cst.ClassDef) -> cst.ClassDef:
        return cls


class AddMethodCodemod(ClassCodemod):
    """Add a method a class lacks; done when a method of that name exists
    (ours or upstream's). Subclasses set CLASS, METHOD, SOURCE and AFTER
    (methods to put it after, first one found wins; else at the end)."""

    METHOD: ClassVar[str]
    SOURCE: ClassVar[str]
    AFTER: ClassVar[tuple[str, ...]] = ()
    METHODS_READ = ()

    @classmethod
    def methods_read(cls) -> Optional[Methods]:
        return declared_methods(cls, cls.METHOD, *cls.AFTER)

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        anchor = f"{self.CLASS}.{self.METHOD}"
        if primitives.find_method(cls, self.METHOD) is not None:
            return Finding.done(anchor)
        return Finding.todo(anchor, "method not defined")

    def transform_class(self, cls: cst.ClassDef) -> cst.ClassDef:
        after = primitives.find_first_method(cls, self.AFTER)
        return primitives.add_method(cls, self.SOURCE, after=after.name.value if after else None)


class MethodCodemod(ClassCodemod):
    """A change inside one method of one top-level class: the opening every
    such codemod shares (find the method under any of its names, else say why
    it is absent) done once. Subclasses set CLASS, METHOD and implement
    ``detect_in_method`` / ``transform_method``; optionally

    * RENAMED: other names the method has in other releases (first found wins);
    * WHY_ABSENT: releases legitimately lack the method (before it came, or
      after upstream moved it away): superseded there with this reason; without
      it an absent method is a missing anchor;
    * ``find_method`` overridden when the method is found by what it holds
      (e.g. the one that assigns a given name).
    """

    METHOD: ClassVar[str]
    RENAMED: ClassVar[tuple[str, ...]] = ()
    WHY_ABSENT: ClassVar[str] = ""

    @property
    def anchor(self) -> str:
        return f"{self.CLASS}.{self.METHOD}"

    def anchor_of(self, fn: cst.FunctionDef) -> str:
        return f"{self.CLASS}.{fn.name.value}"

    def find_method(self, cls: cst.ClassDef) -> Optional[cst.FunctionDef]:
        return primitives.find_first_method(cls, (self.METHOD, *self.RENAMED))

    METHODS_READ: ClassVar[Optional[tuple[str, ...]]] = ()

    @classmethod
    def methods_read(cls) -> Optional[Methods]:
        return declared_methods(cls, cls.METHOD, *cls.RENAMED)  # the method, and what classes below declare

    @classmethod
    def reads(cls) -> Optional[Reads]:
        return None if cls.FOLLOW_DECORATORS else super().reads()  # a decorator may be any function of the module

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        fn = self.find_method(cls)
        if fn is None:
            return self.detect_absent(cls)
        decorator = self._decorator_holding_anchor(cls, fn)
        if decorator is not None:  # the anchor is one decorator away (a fork's wrapper; issue 69)
            found = self.detect_in_method(decorator)
            reach = f"reached from {self.anchor_of(fn)} through its decorator @{decorator.name.value}"
            return self.located(replace(found, detail=f"{found.detail} ({reach})"), self.line_node(decorator))
        return self.located(self.detect_in_method(fn), self.line_node(fn))

    #: Follow the method's decorators defined in the same class or module (``@draft_wrapper``)
    #: when the method itself lacks the anchor and a decorator reaches it (``reaches_anchor``).
    FOLLOW_DECORATORS: ClassVar[bool] = False
    _followed: Optional[str] = ""  # the decorator transform_class edits ("": none; None: the module's)

    def holds_anchor(self, fn: cst.FunctionDef) -> bool:
        """Whether ``fn`` holds what the codemod changes (subclasses that follow decorators say)."""
        return False

    def reaches_anchor(self, fn: cst.FunctionDef) -> bool:
        """Whether a decorator ``fn`` is worth following: it holds the anchor, or something
        of it the codemod cannot change (then refused at that line, not at the method's)."""
        return self.holds_anchor(fn)

    def _decorator_holding_anchor(
        self, cls: cst.ClassDef, fn: cst.FunctionDef, module: Optional[cst.Module] = None
    ) -> Optional[cst.FunctionDef]:
        if not self.FOLLOW_DECORATORS or self.holds_anchor(fn):
            return None
        module = module if module is not None else getattr(self, "_module", None)
        for decorator in primitives.decorators_defined_beside(fn, cls, module):
            if self.reaches_anchor(decorator):
                return decorator
        return None

    def transform_beside(self, tree: cst.Module) -> cst.Module:
        """A decorator followed that the module defines is edited here; one of the class's
        own, by ``transform_class`` (told which by ``_followed``, as detect chose it)."""
        self._followed = ""
        if not self.FOLLOW_DECORATORS:
            return tree
        cls = primitives.find_class(tree, self.CLASS)
        method = self.find_method(cls) if cls is not None else None
        decorator = self._decorator_holding_anchor(cls, method, tree) if cls and method else None
        self._followed = decorator.name.value if decorator is not None else ""
        if cls is None or decorator is None or primitives.find_method(cls, self._followed) is decorator:
            return tree
        self._followed = None  # the module's: the class is left as it is
        return primitives.replace_function(tree, decorator.name.value, self.transform_method)

    def line_node(self, fn: cst.FunctionDef) -> cst.CSTNode:
        """The node a finding about ``fn`` is reported at: the method."""
        return fn

    def detect_absent(self, cls: cst.ClassDef) -> Finding:
        if self.WHY_ABSENT:
            return Finding.superseded(self.anchor, self.WHY_ABSENT)
        wanted = (self.METHOD, *self.RENAMED)
        if len(wanted) == 1:
            return Finding.missing(
                self.anchor, f"{self.where(cls)}: class {self.CLASS} defines no method {self.METHOD}"
            )
        return Finding.missing(
            self.anchor, f"{self.where(cls)}: class {self.CLASS} defines none of {', '.join(wanted)}"
        )

    def missing_in(self, fn: cst.FunctionDef, found: str, needed: str, node: Optional[cst.CSTNode] = None) -> Finding:
        """A missing anchor inside the method, worded for the user: where (file
        and line of ``node``, else of the method), the shape found there, and
        what the patch needed."""
        return Finding.missing(self.anchor_of(fn), f"{self.where(node or fn)}: {found}; the patch needs {needed}")

    def transform_class(self, cls: cst.ClassDef) -> cst.ClassDef:
        method = cst.ensure_type(self.find_method(cls), cst.FunctionDef)  # detect found it
        followed = self._followed
        if followed is None:  # transform_beside edited a decorator of the module's
            return cls
        return primitives.replace_method(cls, followed or method.name.value, self.transform_method)

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        raise NotImplementedError

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        raise NotImplementedError


_code = cst.Module(body=[]).code_for_node
