"""The ast side of ``patchkit audit`` (patchkit/audit/__init__.py): one module's facts,
independent of every other module, so the tree-wide audit combines them (and
caches them by the module's bytes).

* :class:`FileAudit` finds the module's reads of the CPU seq_lens mirror and
  gives each its *local* verdict: guarded, patched, safe (a copy, set above, a
  path where the mirror always exists, a buffer handed to the backend),
  unguarded or stale. Whether the class holding a read keeps the mirror is
  decided across modules, in audit.py.
* ``audit_scan.scan`` (one walk, shared with the tree-wide class index)
  lists the module's classes: bases by name, what they declare for
  ``needs_cpu_seq_lens``, the names they call (a wrapper that builds
  attention backends), and the loads of the mirror classified here.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Optional

from patchkit.audit.guards import assigns, decision_test, is_none, none_test, prefill_branch
from patchkit.audit.reads import HANDED_ON, MIRROR_ALWAYS, OPTS_OUT_WITH, PATCH, Read
from patchkit.audit.scan import FUNCTIONS, MIRROR, scan

_EXITS = (ast.Return, ast.Continue, ast.Break, ast.Raise)


@cache
def _runtime_helpers() -> frozenset[str]:
    """The None-aware helpers patched code calls on the mirror (the runtime's
    and the backends' mirror reads): their ``__all__``, read from the source,
    not imported (patchkit's commands never import what patched trees import;
    the behaviour tests block it)."""
    package = Path(__file__).resolve().parents[1]  # patchkit/
    names: set[str] = set()
    for rel in ("runtime/__init__.py", "backends/mirror_reads.py"):
        for node in ast.parse((package / rel).read_bytes()).body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
            ):
                names.update(ast.literal_eval(node.value))
    return frozenset(names)


class FileAudit:
    def __init__(self, rel: str, source: str, tree: ast.Module) -> None:
        self.rel, self.source, self.tree = rel, source, tree
        self.parents: dict[ast.AST, ast.AST] = {}
        self.classes, self._loads = scan(tree, self.parents)
        self.helpers = _runtime_helpers()
        self.lines = source.encode("utf-8", "surrogateescape").splitlines()

    def reads(self) -> Iterator[Read]:
        for node in self._loads:
            read = self._read(node)
            if read is not None:
                yield read

    def _segment(self, node: ast.expr) -> str:
        """``ast.get_source_segment`` without splitting the module per call (offsets are UTF-8 bytes)."""
        first, last = node.lineno - 1, (node.end_lineno or node.lineno) - 1  # ast.parse sets end_lineno
        if first == last:
            text = self.lines[first][node.col_offset : node.end_col_offset]
        else:
            text = b"\n".join(
                [
                    self.lines[first][node.col_offset :],
                    *self.lines[first + 1 : last],
                    self.lines[last][: node.end_col_offset],
                ]
            )
        return text.decode("utf-8", "surrogateescape")

    # -- one read -------------------------------------------------------------

    def _read(self, node: ast.Attribute) -> Optional[Read]:
        function = self._function(node)
        kind = "buffer" if self._is_buffer(node) else "mirror"
        if kind == "buffer" and self._refreshes(node):
            return None  # the buffer being filled, not read
        read = Read(
            self.rel,
            node.lineno,
            node.col_offset,
            self._qualname(node),
            self._segment(node) or node.attr,
            node.attr,
            kind,
        )
        cls = self._class(node)
        read.cls = cls.name if cls is not None else None
        read.verdict, read.why = self._classify(node, function, kind)
        if read.verdict == "patched":
            read.patch = OPTS_OUT_WITH.get(self.rel, PATCH)
        return read

    def _classify(self, node: ast.Attribute, function: Optional[ast.AST], kind: str) -> tuple[str, str]:
        scope = function or self.tree
        asserted = next((p for p, c in self._ancestors(node, scope) if isinstance(p, ast.Assert) and c is p.test), None)
        if asserted is not None and kind == "mirror" and self._qualname(node) not in MIRROR_ALWAYS:
            prefill = prefill_branch(list(self._ancestors(node, scope)))
            if prefill:  # an assert that only prefill batches reach (0.5.7's NSA: `... == seq_lens_sum`)
                return "safe", prefill
            return "unguarded", f"`assert {ast.unparse(asserted.test)}` fails once the mirror is dropped"
        found = self._handled(node, scope) or self._guard(node, scope)
        if found:
            return found
        where = self._qualname(node)
        if kind == "buffer":
            return self._buffer_verdict(node, scope, where)
        if where in MIRROR_ALWAYS:
            return "safe", MIRROR_ALWAYS[where]
        fresh = self._set_above(node, scope)
        if fresh:
            return "safe", f"set at line {fresh} above, in this function"
        passed = self._passed_on(node, scope)
        if passed:
            return passed
        return "unguarded", "reads None once the mirror is dropped"

    def _handled(self, node: ast.AST, scope: ast.AST) -> Optional[tuple[str, str]]:
        for parent, child in self._ancestors(node, scope):
            if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and parent.func.id in self.helpers:
                if child is not parent.func:
                    return "patched", f"argument of the None-aware runtime helper {parent.func.id}()"
            if isinstance(parent, (ast.If, ast.IfExp)) and child is not parent.test:
                in_body = child in parent.body if isinstance(parent.body, list) else child is parent.body
                if decision_test(parent.test) is in_body:
                    return "patched", "in the branch where needs_cpu_seq_lens() is True"
        return None

    def _guard(self, node: ast.AST, scope: ast.AST) -> Optional[tuple[str, str]]:
        prefill = prefill_branch(list(self._ancestors(node, scope)))
        if prefill:
            return "safe", prefill
        for parent, child in self._ancestors(node, scope):
            if isinstance(parent, ast.Compare) and child is parent.left and none_test(parent) is not None:
                return "guarded", "the None test itself"
            if isinstance(parent, (ast.If, ast.IfExp)) and child is not parent.test:
                in_body = child in parent.body if isinstance(parent.body, list) else child is parent.body
                if none_test(parent.test) is in_body:
                    return (
                        "guarded",
                        f"inside `{'if' if isinstance(parent, ast.If) else '... if'} {ast.unparse(parent.test)}`",
                    )
            if isinstance(parent, ast.BoolOp) and child is not parent.values[0]:
                wanted = isinstance(parent.op, ast.And)
                before = parent.values[: next(i for i, v in enumerate(parent.values) if v is child)]
                if any(none_test(v) is wanted for v in before):
                    return "guarded", f"right of `{ast.unparse(before[0])} {'and' if wanted else 'or'} ...`"
            exit_ = self._early_exit_before(parent, child)
            if exit_ is not None:
                return (
                    "guarded",
                    f"after `if {ast.unparse(exit_.test)}: {type(exit_.body[-1]).__name__.lower()}` (line {exit_.lineno})",
                )
        return None

    def _early_exit_before(self, parent: ast.AST, child: ast.AST) -> Optional[ast.If]:
        """``if x is None: return`` (continue, break, raise) earlier in the block holding ``child``."""
        for name in ("body", "orelse", "finalbody"):
            block = getattr(parent, name, None)
            if isinstance(block, list) and child in block:
                for stmt in block[: block.index(child)]:
                    if isinstance(stmt, ast.If) and none_test(stmt.test) is False and isinstance(stmt.body[-1], _EXITS):
                        return stmt
        return None

    def _set_above(self, node: ast.Attribute, scope: ast.AST) -> Optional[int]:
        """Line of an assignment of this very attribute, to something other
        than None, earlier in a block enclosing the read (e.g. a fork's helper
        that fills the mirror and sums it)."""
        target = ast.unparse(node)
        for parent, child in self._ancestors(node, scope):
            for name in ("body", "orelse"):
                block = getattr(parent, name, None)
                if not (isinstance(block, list) and child in block):
                    continue
                for stmt in reversed(block[: block.index(child)]):
                    if isinstance(stmt, ast.Assign) and any(ast.unparse(t) == target for t in stmt.targets):
                        return None if is_none(stmt.value) else stmt.lineno
                    if self._fills_when_none(stmt, target):
                        return stmt.lineno
        return None

    @staticmethod
    def _fills_when_none(stmt: ast.AST, target: str) -> bool:
        """``if x is None: x = <not None>`` (on every path of the ``if``'s
        body: 0.5.13's ``if tree_mask_buf is None: x = ... else: x = 0``): after it, x is set."""
        return (
            isinstance(stmt, ast.If)
            and none_test(stmt.test) is False
            and ast.unparse(stmt.test).startswith(target)
            and assigns(stmt.body, target)
        )

    def _filled_above(self, node: ast.AST, scope: ast.AST, name: str) -> Optional[int]:
        """Line of ``if name is None: name = <not None>`` earlier in a block
        enclosing ``node``, with no other assignment of ``name`` between: a
        local the code fills itself when the mirror is absent (0.5.13's
        ``seq_lens_sum = forward_batch.seq_lens_sum`` then a bound)."""
        for parent, child in self._ancestors(node, scope):
            for field in ("body", "orelse", "finalbody"):
                block = getattr(parent, field, None)
                if not (isinstance(block, list) and child in block):
                    continue
                for stmt in reversed(block[: block.index(child)]):
                    if self._fills_when_none(stmt, name):
                        return stmt.lineno
                    if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                            return None
        return None

    def _passed_on(self, node: ast.AST, scope: ast.AST) -> Optional[tuple[str, str]]:
        """A plain copy or hand-off: the value (possibly one branch of ``a if c
        else b``) assigned to a mirror attribute, passed as ``seq_lens_cpu=`` /
        ``seq_lens_sum=``, or held in a local whose every use is accounted for."""
        value, parent = node, self.parents.get(node)
        while isinstance(parent, ast.IfExp) and value is not parent.test:
            value, parent = parent, self.parents.get(parent)
        if isinstance(parent, ast.keyword) and parent.arg in (*MIRROR, *HANDED_ON) and value is parent.value:
            return "safe", f"handed on as {parent.arg}= (read where it is used)"
        if (
            isinstance(parent, ast.Call)
            and value in parent.args
            and isinstance(parent.func, ast.Attribute)
            and parent.func.attr.startswith("init_forward_metadata")
        ):
            return "safe", f"handed to {parent.func.attr}() of a backend (audited where that backend reads it)"
        if isinstance(parent, ast.Assign) and value is parent.value:
            targets = parent.targets
            if all(isinstance(t, ast.Attribute) and t.attr in MIRROR for t in targets):
                return "safe", "copied to " + ", ".join(ast.unparse(t) for t in targets) + " (read where it is used)"
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            if len(names) == len(targets):  # every target a local name
                return self._alias(parent, scope, names)
        return None

    def _alias(self, assign: ast.Assign, scope: ast.AST, names: list[str]) -> Optional[tuple[str, str]]:
        uses = self._uses_of(assign, scope, names)
        verdicts = [
            v
            for n in uses
            if (
                v := self._handled(n, scope)
                or self._guard(n, scope)
                or self._filled(n, scope)
                or self._passed_on(n, scope)
            )
        ]
        if uses and len(verdicts) == len(uses):  # every use handled
            return verdicts[0][0], f"held in {', '.join(names)}; its uses: " + "; ".join(w for _, w in verdicts)
        return None

    def _uses_of(self, assign: ast.Assign, scope: ast.AST, names: list[str]) -> list[ast.Name]:
        """The loads of ``names`` the assignment reaches: in the statements
        after it in its block, then after the blocks enclosing it, up to one
        that assigns a name again (another value held in the same local:
        0.5.13's init_forward_metadata holds three sums in ``seq_lens_sum``,
        one per branch)."""

        def loads(node: ast.AST) -> list[ast.Name]:
            return [
                n for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in names and isinstance(n.ctx, ast.Load)
            ]

        uses: list[ast.Name] = []
        current: ast.AST = assign
        while current is not scope:
            parent = self.parents.get(current)
            if parent is None:
                break
            block = next(
                (
                    b
                    for f in ("body", "orelse", "finalbody")
                    if isinstance(b := getattr(parent, f, None), list) and current in b
                ),
                None,
            )
            for stmt in block[block.index(current) + 1 :] if block is not None else ():
                uses += loads(stmt)
                if isinstance(stmt, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id in names for t in stmt.targets
                ):
                    return uses
            if isinstance(parent, (ast.For, ast.While)):  # a loop reads its body again: every load in it
                uses += [n for n in loads(parent) if n not in uses]
            current = parent
        return uses

    def _filled(self, use: ast.Name, scope: ast.AST) -> Optional[tuple[str, str]]:
        line = self._filled_above(use, scope, use.id)
        return ("guarded", f"`if {use.id} is None:` fills it at line {line}") if line else None

    # -- CUDA-graph runner buffers ------------------------------------------------

    def _is_buffer(self, node: ast.Attribute) -> bool:
        """A CUDA-graph runner's static CPU buffer: ``<...>.buffers.seq_lens_cpu``
        or ``self.seq_lens_cpu`` in a ``...CudaGraphRunner`` / ``...InputBuffers``
        class (filled from the batch's mirror at replay)."""
        receiver = node.value
        if isinstance(receiver, ast.Name) and receiver.id == "buffers":
            return True
        if isinstance(receiver, ast.Attribute) and receiver.attr == "buffers":
            return True
        if isinstance(receiver, ast.Name) and receiver.id == "self":
            cls = self._class(node)
            return cls is not None and cls.name.endswith(("CudaGraphRunner", "InputBuffers", "Buffers"))
        return False

    def _refreshes(self, node: ast.Attribute) -> bool:
        """``buf.seq_lens_cpu[...].copy_(...)``, ``.fill_(...)``, ``buf.seq_lens_cpu[:n] = ...``: a write."""
        current: ast.AST = node
        parent = self.parents.get(current)
        if isinstance(parent, ast.Subscript) and parent.value is current:
            if isinstance(parent.ctx, ast.Store):
                return True
            current, parent = parent, self.parents.get(parent)
        return isinstance(parent, ast.Attribute) and parent.attr in ("copy_", "fill_", "zero_")

    def _buffer_verdict(self, node: ast.Attribute, scope: ast.AST, where: str) -> tuple[str, str]:
        if where in MIRROR_ALWAYS or where.endswith(("capture_one_batch_size", "capture")):
            return "safe", MIRROR_ALWAYS.get(where, "capture fills its own buffers")
        handed = self._handed_to_backend(node)
        if handed:
            return "safe", handed
        return "stale", "reads the runner's CPU buffer, no longer refreshed once the mirror is dropped"

    def _handed_to_backend(self, node: ast.AST) -> Optional[str]:
        """The buffer (or a slice of it) passed to a call as ``seq_lens_cpu=``
        or assigned to a batch's / local's ``seq_lens_cpu``: the attention
        backend that receives it reads it only when it declares
        needs_cpu_seq_lens (and then the mirror, so the buffer, is kept)."""
        value, parent = node, self.parents.get(node)
        if isinstance(parent, ast.Subscript) and parent.value is value:
            value, parent = parent, self.parents.get(parent)
        if isinstance(parent, ast.keyword) and parent.arg == "seq_lens_cpu":
            return "handed to the attention backend as seq_lens_cpu= (read only by backends that keep the mirror)"
        if isinstance(parent, ast.Assign) and value is parent.value:
            names = [t for t in parent.targets if isinstance(t, ast.Name)]
            attrs = [t for t in parent.targets if isinstance(t, ast.Attribute) and t.attr == "seq_lens_cpu"]
            if attrs and len(attrs) == len(parent.targets):
                return (
                    "handed on as "
                    + ", ".join(ast.unparse(t) for t in attrs)
                    + " (read by backends that keep the mirror)"
                )
            if names and len(names) == len(parent.targets):
                return self._buffer_local(parent, [t.id for t in names])
        return None

    def _buffer_local(self, assign: ast.Assign, names: list[str]) -> Optional[str]:
        scope = self._function(assign) or self.tree
        uses = self._uses_of(assign, scope, names)
        whys = [why for n in uses if (why := self._handed_to_backend(n))]
        if uses and len(whys) == len(uses):  # every use handed to a backend
            return f"held in {', '.join(names)}; " + "; ".join(dict.fromkeys(whys))
        return None

    # -- where ---------------------------------------------------------------------

    def _ancestors(self, node: ast.AST, scope: ast.AST) -> Iterator[tuple[ast.AST, ast.AST]]:
        child, parent = node, self.parents.get(node)
        while parent is not None:
            yield parent, child
            if parent is scope:
                return
            child, parent = parent, self.parents.get(parent)

    def _function(self, node: ast.AST) -> Optional[ast.AST]:
        current = self.parents.get(node)
        while current is not None and not isinstance(current, FUNCTIONS):
            current = self.parents.get(current)
        return current

    def _class(self, node: ast.AST) -> Optional[ast.ClassDef]:
        current = self.parents.get(node)
        while current is not None and not isinstance(current, ast.ClassDef):
            current = self.parents.get(current)
        return current

    def _qualname(self, node: ast.AST) -> str:
        names = []
        current = self.parents.get(node)
        while current is not None:
            if isinstance(current, (*FUNCTIONS, ast.ClassDef)):
                names.append(current.name)
            current = self.parents.get(current)
        return ".".join(reversed(names)) or "<module>"
