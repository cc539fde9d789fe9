"""The guard kind of codemod: reads of a value that can be None, in one method,
each rewritten by a :class:`Guard` into a None-aware helper call
(``MethodGuards``; needs-cpu-seq-lens's ``MirrorGuards`` and FlashMLA's guards
are its subclasses).

Kept apart from :mod:`patchkit.codemods.common.base` (the contract every
codemod follows, which this builds on) so each stays under the house's 400
lines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import ClassCodemod, Finding, MethodCodemod, PatchCodemod, State
from patchkit.codemods.common.reads import MODULE_HOOKS, Reads, reads_only


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
        if cls.FOLLOW_DECORATORS or not reads_only(cls, MODULE_HOOKS, PatchCodemod, ClassCodemod, MethodGuards):
            return None  # a decorator followed may be any function of the module
        return {cls.CLASS: cls.methods_read(), **({cls.UPSTREAM_FUNCTION: None} if cls.UPSTREAM_FUNCTION else {})}

    def detect(self, module: cst.Module) -> Finding:
        finding = super().detect(module)
        if finding.state is State.MISSING and self.UPSTREAM_FUNCTION:
            moved = primitives.find_function(module, self.UPSTREAM_FUNCTION)
            if (
                moved is not None
                and self.UPSTREAM_MARKER is not None
                and primitives.contains(moved, self.UPSTREAM_MARKER)
            ):
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
                    fn,
                    f"`{_code(read)}` is read, but not the statement its rewrite takes names from",
                    f"that statement too ({self.DESCRIPTION})",
                    read,
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
                return Finding.done(
                    anchor,
                    f"this tree guards these reads itself (None tests, first at {self.where(reads[0])})",
                    by_tree=True,
                )
            return self.missing_in(
                fn,
                f"`{_code(bare[0])}` is read unguarded in a shape this change does not know",
                f"a read of {self.READS} it can rewrite ({self.DESCRIPTION}) or a None test around it",
                bare[0],
            )
        return self.missing_in(fn, f"no read of {self.READS} here", f"the reads it rewrites ({self.DESCRIPTION})")

    def holds_anchor(self, fn: cst.FunctionDef) -> bool:
        """A read a guard is for, or upstream's shape of the method."""
        markers = [mk for mk in (self.UPSTREAM_MARKER, self.MOVED_OUT and self.MOVED_OUT[0]) if mk is not None]
        return any(self._reads(fn, g) for g in self.GUARDS) or any(primitives.contains(fn, mk) for mk in markers)

    def reaches_anchor(self, fn: cst.FunctionDef) -> bool:
        return self.holds_anchor(fn) or bool(self._value_reads(fn))  # an unknown read: refused at its line

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
                id(n)
                for outer in primitives.find_all(fn, self.UPSTREAM)
                for n in primitives.find_all(outer, guard.site, guard.within)
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
