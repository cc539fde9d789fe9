"""The contract every patch codemod follows.

A codemod is a libcst ``Codemod`` that makes one structural change to one file
and can say, without changing anything, whether that change is still to do,
already there, or impossible (its anchor is missing). The engine parses each
file once, asks every codemod for that file to ``detect``, transforms with the
ones that report ``TODO``, and checks that all of them report ``DONE`` on the
result: that is the idempotence and the postcondition in one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

import libcst as cst
import libcst.matchers as m
from libcst.codemod import Codemod, CodemodContext

from patchkit.codemods.common import primitives
from patchkit.codemods.common.reads import MODULE_HOOKS, Methods, Reads, declared_methods, reads_only
from patchkit.findings import Finding, State  # noqa: F401 - re-exported: codemods import them from here


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
        return f"{cls.__module__.rsplit('.', 1)[-1]}.{cls.__name__}"

    def detect(self, module: cst.Module) -> Finding:
        raise NotImplementedError

    READS_WHOLE: Optional[str] = None  # why it reads its whole module, said (tests/test_codemod_reads.py)

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
        code = next((ln.strip() for ln in _code(node).splitlines() if ln.strip() and not ln.strip().startswith("#")), "")
        code = code if len(code) <= 80 else code[:77] + "..."
        return Finding.superseded(anchor, f"this tree {what} itself at {self.where(node)} (`{code}`); patchkit leaves it as it is",
                                  by_tree=True)

    def located(self, finding: Finding, node: Optional[cst.CSTNode]) -> Finding:
        """``finding`` at the line of ``node`` (a node of the detected module),
        unless it has a line already. Only a finding verify and status report
        at a line (todo, missing) gets one: a line costs a partial code
        generation (``primitives.line_of``), and done findings are the most."""
        module = None if getattr(self, "_no_lines", False) else getattr(self, "_module", None)
        if finding.line is not None or node is None or module is None or finding.state not in (State.TODO, State.MISSING):
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
        return primitives.replace_class(tree, self.CLASS, self.transform_class)

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

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        fn = self.find_method(cls)
        if fn is None:
            return self.detect_absent(cls)
        return self.located(self.detect_in_method(fn), self.line_node(fn))

    def line_node(self, fn: cst.FunctionDef) -> cst.CSTNode:
        """The node a finding about ``fn`` is reported at: the method."""
        return fn

    def detect_absent(self, cls: cst.ClassDef) -> Finding:
        if self.WHY_ABSENT:
            return Finding.superseded(self.anchor, self.WHY_ABSENT)
        wanted = (self.METHOD, *self.RENAMED)
        if len(wanted) == 1:
            return Finding.missing(self.anchor, f"{self.where(cls)}: class {self.CLASS} defines no method {self.METHOD}")
        return Finding.missing(self.anchor, f"{self.where(cls)}: class {self.CLASS} defines none of {', '.join(wanted)}")

    def missing_in(self, fn: cst.FunctionDef, found: str, needed: str, node: Optional[cst.CSTNode] = None) -> Finding:
        """A missing anchor inside the method, worded for the user: where (file
        and line of ``node``, else of the method), the shape found there, and
        what the patch needed."""
        return Finding.missing(self.anchor_of(fn), f"{self.where(node or fn)}: {found}; the patch needs {needed}")

    def transform_class(self, cls: cst.ClassDef) -> cst.ClassDef:
        method = cst.ensure_type(self.find_method(cls), cst.FunctionDef)  # detect found it
        return primitives.replace_method(cls, method.name.value, self.transform_method)

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        raise NotImplementedError

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        raise NotImplementedError


@dataclass(frozen=True)
class Guard:
    """Rewrite each ``site`` (inside a ``within`` node, when given) as
    ``template``, whose UPPERCASE names are the site's captures plus those of
    the method's first ``context`` match. ``helper`` is the runtime function
    the template calls (imported from the codemod's HELPER_MODULE)."""

    site: m.BaseMatcherNode
    template: str
    helper: Optional[str] = None
    within: Optional[m.BaseMatcherNode] = None
    context: Optional[m.BaseMatcherNode] = None


class MethodGuards(MethodCodemod):
    """Reads of a value that can be None, in one method, each rewritten by a
    :class:`Guard`. A read is already guarded when it is only reached while
    the value is not None (``primitives.NoneGuards``: ``if x is not None:``,
    ``if x is None: return``, ``x is not None and ...``, a conditional
    expression, an early ``continue``) or inside an UPSTREAM ``if``.

    Subclasses set CLASS, METHOD, GUARDS, VALUES (the attribute or local names
    whose None test guards a read), READS (what the reads are, for messages)
    and HELPER_MODULE; and where upstream has its own shape: UPSTREAM (a
    matcher for upstream's ``if``: reads inside one are guarded),
    UPSTREAM_MARKER (a matcher for upstream's shape of the whole method: its
    presence means done), UPSTREAM_FUNCTION (a module function of the same
    file upstream moved the read to, done when it has the marker), MOVED_OUT
    ((matcher, reason): the method now delegates the read to another file).

    Done when no read is left unguarded and a helper call, upstream's guard or
    the tree's own None guards are there."""

    GUARDS: ClassVar[tuple[Guard, ...]]
    VALUES: ClassVar[tuple[str, ...]]
    READS: ClassVar[str]
    HELPER_MODULE: ClassVar[str]
    UPSTREAM: ClassVar[Optional[m.BaseMatcherNode]] = None
    UPSTREAM_MARKER: ClassVar[Optional[m.BaseMatcherNode]] = None
    UPSTREAM_FUNCTION: ClassVar[str] = ""
    MOVED_OUT: ClassVar[Optional[tuple[m.BaseMatcherNode, str]]] = None

    @classmethod
    def reads(cls) -> Optional[Reads]:
        # detect reads UPSTREAM_FUNCTION too (a module function)
        if not reads_only(cls, MODULE_HOOKS, PatchCodemod, ClassCodemod, MethodGuards):
            return None
        return {cls.CLASS: cls.methods_read(), **({cls.UPSTREAM_FUNCTION: None} if cls.UPSTREAM_FUNCTION else {})}

    def detect(self, module: cst.Module) -> Finding:
        finding = super().detect(module)
        if finding.state is State.MISSING and self.UPSTREAM_FUNCTION:
            moved = primitives.find_function(module, self.UPSTREAM_FUNCTION)
            if moved is not None and self.UPSTREAM_MARKER is not None and primitives.contains(moved, self.UPSTREAM_MARKER):
                return Finding.done(self.anchor, f"upstream's own guard, in {self.UPSTREAM_FUNCTION}()")
        return finding

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        anchor = self.anchor_of(fn)
        if self.UPSTREAM_MARKER is not None and primitives.contains(fn, self.UPSTREAM_MARKER):
            return Finding.done(anchor, "upstream's own guard")
        left = [g for g in self.GUARDS if self._unguarded(fn, g)]
        for guard in left:
            if guard.context is not None and not primitives.find_all(fn, guard.context):
                read = self._unguarded(fn, guard)[0]
                return self.missing_in(
                    fn, f"`{_code(read)}` is read, but not the statement its rewrite takes names from",
                    f"that statement too ({self.DESCRIPTION})", read,
                )
        if left:
            count = sum(len(self._unguarded(fn, g)) for g in left)
            first = self._unguarded(fn, left[0])[0]
            return Finding.todo(anchor, f"{count} unguarded read(s) of {self.READS} (first at {self.where(first)})")
        if any(primitives.contains(fn, primitives.call(g.helper)) for g in self.GUARDS if g.helper):
            return Finding.done(anchor)
        if self.UPSTREAM is not None and primitives.contains(fn, self.UPSTREAM):
            return Finding.done(anchor, "upstream's own guard")
        if self.MOVED_OUT is not None and primitives.contains(fn, self.MOVED_OUT[0]):
            return Finding.superseded(anchor, self.MOVED_OUT[1])
        reads = self._value_reads(fn)
        if reads:
            bare = primitives.unguarded(fn, reads, self.VALUES)
            if not bare:
                # A fork that tests the value itself, in a shape of its own.
                return Finding.done(anchor, f"this tree guards these reads itself (None tests, first at {self.where(reads[0])})", by_tree=True)
            return self.missing_in(
                fn,
                f"`{_code(bare[0])}` is read unguarded in a shape this change does not know",
                f"a read of {self.READS} it can rewrite ({self.DESCRIPTION}) or a None test around it",
                bare[0],
            )
        return self.missing_in(fn, f"no read of {self.READS} here", f"the reads it rewrites ({self.DESCRIPTION})")

    def _value_reads(self, fn: cst.FunctionDef) -> list[cst.CSTNode]:
        """Every read of an attribute named in VALUES (assignment targets are writes)."""
        written = {id(t.target) for t in primitives.find_all_of(cst.AssignTarget, fn, m.AssignTarget())}
        written |= {id(a.target) for a in primitives.find_all_of(cst.AugAssign, fn, m.AugAssign())}
        attrs = primitives.find_all(fn, primitives.attr("|".join(self.VALUES)))
        return [a for a in attrs if id(a) not in written]

    def _reads(self, fn: cst.FunctionDef, guard: Guard) -> list[cst.CSTNode]:
        return primitives.find_all(fn, guard.site, guard.within)

    def _unguarded(self, fn: cst.FunctionDef, guard: Guard) -> list[cst.CSTNode]:
        """The reads ``guard`` is for, less those already guarded (a None test
        of one of VALUES, or upstream's guard: an ``if`` matching UPSTREAM)."""
        found = primitives.unguarded(fn, self._reads(fn, guard), self.VALUES)
        if found and self.UPSTREAM is not None:
            covered = {
                id(n) for outer in primitives.find_all(fn, self.UPSTREAM) for n in primitives.find_all(outer, guard.site, guard.within)
            }
            found = [n for n in found if id(n) not in covered]
        return found

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        # Guards with an unguarded read are applied to all their reads; one
        # already guarded is rewritten too, harmlessly (the helper computes
        # the same value there).
        for guard in self.GUARDS:
            if not self._unguarded(fn, guard):
                continue
            context = guard.context  # its captures: those of a match, never None
            nodes = (m.extract(primitives.find_all(fn, context)[0], context) or {}) if context is not None else {}
            fn = primitives.rewrite_expressions(fn, guard.site, guard.template, within=guard.within, **nodes)
            if guard.helper:
                self.require_import(self.HELPER_MODULE, guard.helper)
        return fn


_code = cst.Module(body=[]).code_for_node
