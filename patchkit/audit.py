"""``patchkit audit``: every read of the CPU seq_lens mirror on the spec-v2
paths of a tree, classified.

Once needs-cpu-seq-lens lets spec-v2 decode drop the mirror, ``seq_lens_cpu`` /
``seq_lens_sum`` are None on those paths, and the CUDA-graph runners' CPU
``seq_lens_cpu`` buffers (filled from the mirror) are no longer refreshed. A
read that nobody guards then reads None (a crash) or old numbers (silently
wrong, e.g. profiling labels). Vendor forks add such reads where no patch
knows about them; this finds them on any tree (pristine, patched, fork).

Each read gets one verdict:

* ``guarded``: only reached when the value is not None (the tree's own None
  test in any form: ``if x is not None:``, ``if x is None: return``,
  ``x is not None and ...``, a conditional expression, an early ``continue``);
* ``patched``: handled by a patch (the argument of a patchkit runtime helper,
  or the branch where ``needs_cpu_seq_lens()`` is True);
* ``safe``: cannot see a dropped mirror (a plain copy or hand-off of the value,
  whose readers are audited where they read it; set a few lines above; a code
  path where the mirror always exists, with the reason; a backend that only a
  patch of its own opts out, e.g. FlashMLA, while its class has not opted out);
* ``unguarded``: reads None once the mirror is dropped;
* ``stale``: reads a CPU buffer that is no longer refreshed once the mirror is
  dropped.

Only parses (``ast``, fast); never imports sglang nor writes the tree.
"""

from __future__ import annotations

import ast
import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator, Optional

AUDIT_SCHEMA = "patchkit.audit/1"
MIRROR = ("seq_lens_cpu", "seq_lens_sum")
VERDICTS = ("guarded", "patched", "safe", "unguarded", "stale")
PROBLEMS = ("unguarded", "stale")
PATCH = "needs-cpu-seq-lens"

# The modules of the spec-v2 paths (scheduler -> batch -> worker -> runners ->
# backend -> metrics), under each release's name for them.
MODULES = (
    "srt/managers/scheduler.py",
    "srt/managers/overlap_utils.py",
    "srt/managers/schedule_batch.py",
    "srt/managers/tp_worker.py",
    "srt/speculative/eagle_info_v2.py",
    "srt/speculative/eagle_worker_v2.py",
    "srt/speculative/eagle_utils.py",
    "srt/speculative/spec_utils.py",
    "srt/speculative/eagle_draft_cuda_graph_runner.py",
    "srt/speculative/eagle_draft_extend_cuda_graph_runner.py",
    "srt/model_executor/forward_batch_info.py",
    "srt/model_executor/cuda_graph_runner.py",
    "srt/layers/attention/triton_backend.py",
    "srt/layers/attention/flashmla_backend.py",
    "srt/observability/scheduler_metrics_mixin.py",
    "srt/managers/scheduler_components/metrics_reporter.py",
)

# Backends that opt out only with a patch of their own: until their class
# declares needs_cpu_seq_lens = False, every run that uses them keeps the mirror
# (a fork that opts one out without guarding its reads is what the audit is for).
OPTS_OUT_WITH = {"srt/layers/attention/flashmla_backend.py": "flashmla-spec-v2"}

# Functions whose reads only run where the mirror always exists.
MIRROR_ALWAYS = {
    "ScheduleBatch.prepare_for_decode": "after `if not self.spec_algorithm.is_none(): return` (spec v2 decodes in "
    "EagleDraftInputV2Mixin.prepare_for_decode)",
    "ForwardBatch._compute_mrope_positions": "mrope models only; configure_needs_cpu_seq_lens keeps the mirror for them",
    "ForwardBatch.post_forward_mlp_sync_batch": "non-spec extend branch only (spec_info is None)",
    "CudaGraphRunner.capture_one_batch_size": "capture builds its own ForwardBatch with a mirror",
    "EAGLEDraftCudaGraphRunner.capture_one_batch_size": "capture builds its own ForwardBatch with a mirror",
    "EAGLEDraftExtendCudaGraphRunner.capture_one_batch_size": "capture builds its own ForwardBatch with a mirror",
    "TpModelWorker.forward_batch_split_prefill": "PD-multiplexing split prefill: never speculative",
}

_EXITS = (ast.Return, ast.Continue, ast.Break, ast.Raise)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


@dataclass
class Read:
    file: str  # relative to the sglang package folder
    line: int
    column: int
    function: str  # Class.method, or the module-level function
    code: str
    value: str  # seq_lens_cpu or seq_lens_sum
    kind: str  # "mirror" (a batch's) or "buffer" (a CUDA-graph runner's CPU buffer)
    verdict: str = ""
    why: str = ""
    patch: Optional[str] = None  # the patch that handles it (verdict "patched")


@dataclass
class Audit:
    package: Path
    modules: list[str] = field(default_factory=list)  # the modules found and read
    reads: list[Read] = field(default_factory=list)

    def count(self, verdict: str) -> int:
        return sum(r.verdict == verdict for r in self.reads)

    @property
    def problems(self) -> list[Read]:
        return [r for r in self.reads if r.verdict in PROBLEMS]

    @property
    def ok(self) -> bool:
        return not self.problems


def audit_tree(package: Path) -> Audit:
    """The audit of the sglang package folder ``package``."""
    result = Audit(package)
    for rel in MODULES:
        path = package / rel
        if not path.is_file():
            continue
        source = path.read_text(encoding="utf-8", errors="surrogateescape")
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue  # status / verify report the file; the audit reads what parses
        result.modules.append(rel)
        result.reads.extend(_FileAudit(rel, source, tree).reads())
    return result


def _runtime_helpers() -> frozenset[str]:
    """The None-aware helpers patched code calls on the mirror (the runtime's
    and the backends' mirror reads); both modules import the stdlib only."""
    import patchkit.runtime as runtime
    from patchkit.backends import mirror_reads

    return frozenset(runtime.__all__) | frozenset(mirror_reads.__all__)


class _FileAudit:
    def __init__(self, rel: str, source: str, tree: ast.Module) -> None:
        self.rel, self.source, self.tree = rel, source, tree
        self.parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        self.helpers = _runtime_helpers()

    def reads(self) -> Iterator[Read]:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Attribute) and node.attr in MIRROR and isinstance(node.ctx, ast.Load):
                read = self._read(node)
                if read is not None:
                    yield read

    # -- one read -------------------------------------------------------------

    def _read(self, node: ast.Attribute) -> Optional[Read]:
        function = self._function(node)
        kind = "buffer" if self._is_buffer(node) else "mirror"
        if kind == "buffer" and self._refreshes(node):
            return None  # the buffer being filled, not read
        read = Read(self.rel, node.lineno, node.col_offset, self._qualname(node), ast.get_source_segment(self.source, node) or node.attr,
                    node.attr, kind)
        read.verdict, read.why = self._classify(node, function, kind)
        if read.verdict == "patched":
            read.patch = OPTS_OUT_WITH.get(self.rel, PATCH)
        return read

    def _classify(self, node: ast.Attribute, function: Optional[ast.AST], kind: str) -> tuple[str, str]:
        scope = function or self.tree
        found = self._handled(node, scope) or self._guard(node, scope)
        if found:
            return found
        where = self._qualname(node)
        if kind == "buffer":
            return self._buffer_verdict(node, scope, where)
        if where in MIRROR_ALWAYS:
            return "safe", MIRROR_ALWAYS[where]
        kept = self._backend_keeps_mirror(node)
        if kept:
            return "safe", kept
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
                if _decision_test(parent.test) is in_body:
                    return "patched", "in the branch where needs_cpu_seq_lens() is True"
        return None

    def _guard(self, node: ast.AST, scope: ast.AST) -> Optional[tuple[str, str]]:
        for parent, child in self._ancestors(node, scope):
            if isinstance(parent, ast.Compare) and child is parent.left and _none_test(parent) is not None:
                return "guarded", "the None test itself"
            if isinstance(parent, (ast.If, ast.IfExp)) and child is not parent.test:
                in_body = child in parent.body if isinstance(parent.body, list) else child is parent.body
                if _none_test(parent.test) is in_body:
                    return "guarded", f"inside `{'if' if isinstance(parent, ast.If) else '... if'} {ast.unparse(parent.test)}`"
            if isinstance(parent, ast.BoolOp) and child is not parent.values[0]:
                wanted = isinstance(parent.op, ast.And)
                before = parent.values[: parent.values.index(child)]
                if any(_none_test(v) is wanted for v in before):
                    return "guarded", f"right of `{ast.unparse(before[0])} {'and' if wanted else 'or'} ...`"
            exit_ = self._early_exit_before(parent, child)
            if exit_ is not None:
                return "guarded", f"after `if {ast.unparse(exit_.test)}: {type(exit_.body[-1]).__name__.lower()}` (line {exit_.lineno})"
        return None

    def _early_exit_before(self, parent: ast.AST, child: ast.AST) -> Optional[ast.If]:
        """``if x is None: return`` (continue, break, raise) earlier in the block holding ``child``."""
        for name in ("body", "orelse", "finalbody"):
            block = getattr(parent, name, None)
            if isinstance(block, list) and child in block:
                for stmt in block[: block.index(child)]:
                    if isinstance(stmt, ast.If) and _none_test(stmt.test) is False and isinstance(stmt.body[-1], _EXITS):
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
                        return None if _is_none(stmt.value) else stmt.lineno
                    if self._fills_when_none(stmt, target):
                        return stmt.lineno
        return None

    @staticmethod
    def _fills_when_none(stmt: ast.AST, target: str) -> bool:
        """``if x is None: x = <not None>``: after it, x is set."""
        return (
            isinstance(stmt, ast.If) and _none_test(stmt.test) is False and ast.unparse(stmt.test).startswith(target)
            and any(isinstance(s, ast.Assign) and not _is_none(s.value) and any(ast.unparse(t) == target for t in s.targets)
                    for s in stmt.body)
        )

    def _passed_on(self, node: ast.AST, scope: ast.AST) -> Optional[tuple[str, str]]:
        """A plain copy or hand-off: the value (possibly one branch of ``a if c
        else b``) assigned to a mirror attribute, passed as ``seq_lens_cpu=`` /
        ``seq_lens_sum=``, or held in a local whose every use is accounted for."""
        value, parent = node, self.parents.get(node)
        while isinstance(parent, ast.IfExp) and value is not parent.test:
            value, parent = parent, self.parents.get(parent)
        if isinstance(parent, ast.keyword) and parent.arg in MIRROR and value is parent.value:
            return "safe", f"handed on as {parent.arg}= (read where it is used)"
        if isinstance(parent, ast.Assign) and value is parent.value:
            targets = parent.targets
            if all(isinstance(t, ast.Attribute) and t.attr in MIRROR for t in targets):
                return "safe", "copied to " + ", ".join(ast.unparse(t) for t in targets) + " (read where it is used)"
            if all(isinstance(t, ast.Name) for t in targets):
                return self._alias(parent, scope, [t.id for t in targets])
        return None

    def _alias(self, assign: ast.Assign, scope: ast.AST, names: list[str]) -> Optional[tuple[str, str]]:
        uses = [n for n in ast.walk(scope) if isinstance(n, ast.Name) and n.id in names and isinstance(n.ctx, ast.Load)]
        verdicts = [self._handled(n, scope) or self._guard(n, scope) or self._passed_on(n, scope) for n in uses]
        if uses and all(verdicts):
            return verdicts[0][0], f"held in {', '.join(names)}; its uses: " + "; ".join(w for _, w in verdicts)
        return None

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
        current = node
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
                return "handed on as " + ", ".join(ast.unparse(t) for t in attrs) + " (read by backends that keep the mirror)"
            if names and len(names) == len(parent.targets):
                return self._buffer_local(parent, [t.id for t in names])
        return None

    def _buffer_local(self, assign: ast.Assign, names: list[str]) -> Optional[str]:
        scope = self._function(assign) or self.tree
        uses = [n for n in ast.walk(scope) if isinstance(n, ast.Name) and n.id in names and isinstance(n.ctx, ast.Load)]
        whys = [self._handed_to_backend(n) for n in uses]
        if uses and all(whys):
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
        while current is not None and not isinstance(current, _FUNCTIONS):
            current = self.parents.get(current)
        return current

    def _backend_keeps_mirror(self, node: ast.AST) -> Optional[str]:
        """Why a read in a backend of OPTS_OUT_WITH cannot see a dropped mirror:
        its class does not declare ``needs_cpu_seq_lens = False``."""
        patch = OPTS_OUT_WITH.get(self.rel)
        cls = self._class(node) if patch else None
        if cls is None or any(_declares_opt_out(stmt) for stmt in cls.body):
            return None
        return f"{cls.name} keeps the mirror: it does not declare needs_cpu_seq_lens = False ({patch} opts it out)"

    def _class(self, node: ast.AST) -> Optional[ast.ClassDef]:
        current = self.parents.get(node)
        while current is not None and not isinstance(current, ast.ClassDef):
            current = self.parents.get(current)
        return current

    def _qualname(self, node: ast.AST) -> str:
        names = []
        current = self.parents.get(node)
        while current is not None:
            if isinstance(current, (*_FUNCTIONS, ast.ClassDef)):
                names.append(current.name)
            current = self.parents.get(current)
        return ".".join(reversed(names)) or "<module>"


def _declares_opt_out(stmt: ast.AST) -> bool:
    """``needs_cpu_seq_lens = False`` (annotated or not) in a class body."""
    if isinstance(stmt, ast.AnnAssign):
        targets, value = [stmt.target], stmt.value
    elif isinstance(stmt, ast.Assign):
        targets, value = stmt.targets, stmt.value
    else:
        return False
    named = any(isinstance(t, ast.Name) and t.id == "needs_cpu_seq_lens" for t in targets)
    return named and isinstance(value, ast.Constant) and value.value is False


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _named_mirror(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr in MIRROR) or (isinstance(node, ast.Name) and node.id in MIRROR)


def _none_test(test: ast.AST) -> Optional[bool]:
    """True: ``test`` holds only when a mirror value is not None (``x is not
    None``, alone or in an ``and``); False: only when it is None (``x is
    None``, alone or in an ``or``); None: neither. As
    ``primitives.NoneGuards`` decides for the codemods; this one reads ast."""
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and _named_mirror(test.left) and _is_none(test.comparators[0]):
        if isinstance(test.ops[0], ast.IsNot):
            return True
        if isinstance(test.ops[0], ast.Is):
            return False
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _none_test(test.operand)
        return None if inner is None else not inner
    if isinstance(test, ast.BoolOp):
        found = [_none_test(v) for v in test.values]
        if isinstance(test.op, ast.And) and True in found:
            return True
        if isinstance(test.op, ast.Or) and False in found:
            return False
    return None


def _decision_test(test: ast.AST) -> Optional[bool]:
    """True: ``test`` is ``needs_cpu_seq_lens()``; False: ``not needs_cpu_seq_lens()``; None: another test."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _decision_test(test.operand)
        return None if inner is None else not inner
    if isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id == "needs_cpu_seq_lens":
        return True
    return None


# -- rendering ---------------------------------------------------------------------


def summary(result: Audit) -> dict:
    return {"total": len(result.reads), **{v: result.count(v) for v in VERDICTS}}


def to_json(result: Audit, tree: dict, paths) -> str:
    """``patchkit.audit/1`` (docs/ci.md); ``paths(rel)`` is the file as the user sees it."""
    reads = []
    for r in sorted(result.reads, key=lambda r: (r.file, r.line, r.column)):
        reads.append({**asdict(r), "path": paths(r.file)})
    doc = {"schema": AUDIT_SCHEMA, "tree": tree, "modules": result.modules, "reads": reads,
           "summary": summary(result), "ok": result.ok}
    return json.dumps(doc, indent=2)


def to_text(result: Audit, paths, verbose: bool = False) -> str:
    """The problems (every read with ``verbose``), then one summary line."""
    shown = result.reads if verbose else result.problems
    lines = []
    for r in sorted(shown, key=lambda r: (r.file, r.line, r.column)):
        lines.append(f"{paths(r.file)}:{r.line}: {r.verdict}: {r.function}: {r.code}  ({r.why})")
    counts = ", ".join(f"{result.count(v)} {v}" for v in VERDICTS)
    lines.append(f"audit: {len(result.reads)} reads of the CPU seq_lens mirror in {len(result.modules)} modules: {counts}")
    return "\n".join(lines)


def fingerprint(package: Path) -> str:
    """sha256 over the audited modules' bytes: an audit's result is a function
    of them, so ``verify`` caches its count under this key."""
    digest = hashlib.sha256()
    for rel in MODULES:
        path = package / rel
        digest.update(rel.encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest() if path.is_file() else b"-")
    return digest.hexdigest()


def verify_line(problems: int) -> str:
    """The one line ``verify`` prints about the audit (``problems``: reads
    unguarded or stale)."""
    return (f"audit: {problems} read(s) of the CPU seq_lens mirror unguarded or stale once it is dropped"
            + (" (`patchkit audit TREE` lists them)" if problems else ""))
