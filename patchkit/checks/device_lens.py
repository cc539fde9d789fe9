"""needs-cpu-seq-lens's second postcondition (``patches/needs-cpu-seq-lens.toml``,
issue 69): the extend lengths it lets arrive on the device never reach code
that only works on the host.

Without the mirror, the GPU-only draft extend hands ``ForwardBatch.init_new``
its extend lengths as device tensors, and the patch makes that method take
them (``isinstance(LENS, (list, torch.Tensor))``, ``torch.as_tensor``). A
fork's own code in the same function may still treat them as a host list or
a host tensor: ``.pin_memory()`` (torch pins dense CPU tensors only: it
raises), ``.numpy()`` (raises), ``.tolist()``, iteration and ``len(...)`` (a
device sync per call, or per element). Such a tree compiles and passes
every structural check, then crashes or syncs once the mirror is dropped; so
the patch refuses at that line instead, naming it.

Followed within one function, as written: the lengths read from a parameter
(``batch.extend_seq_lens``), through ``torch.as_tensor`` / ``torch.tensor``,
method chains and slices that keep a tensor where it is, and locals assigned
from them. A method that takes the value back to the host (``.cpu()``,
``.tolist()`` ...) ends the trail.
"""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, ClassVar

from patchkit import python_ast
from patchkit.postconditions import HeadStart, Postcondition, Proposed, Violation

if TYPE_CHECKING:
    from patchkit.tree import Tree

LENS = frozenset({"extend_seq_lens", "extend_prefix_lens"})
#: Methods of a tensor that need it on the host (or copy it there, waiting).
HOST_ONLY_METHODS = frozenset({"pin_memory", "numpy", "tolist"})
#: Builtins that iterate their argument (or take its length) as a host sequence.
ITERATING = frozenset({"len", "list", "tuple", "sum", "sorted", "enumerate", "zip", "max", "min"})
#: Methods whose result is on the host: the trail of a device value ends there.
TO_HOST = frozenset({"cpu", "item", "numpy", "tolist"})
BUILDS = frozenset({"torch.as_tensor", "torch.tensor", "pinned_tensor"})


@dataclass(frozen=True)
class HostOnlyUse:
    """A device-able value handed to host-only code: where, in which function, what."""

    line: int
    function: str
    value: str
    use: str


class DeviceLensStayOnDevice(Postcondition):
    """No host-only use of extend lengths that needs-cpu-seq-lens lets be device tensors."""

    def head_start(self, tree: Tree) -> HeadStart:
        def after(rel: str, source: bytes, new: bytes) -> None:  # in the worker: the ast of ``new`` is at hand
            host_only_use_in(rel, new)

        return HeadStart(after=after)

    def check(self, proposed: Proposed) -> Violation | None:
        if proposed.owner not in proposed.applying:
            return None  # applied before: nothing of it is written now
        for rel in sorted(proposed.changed):
            use = host_only_use_in(rel, proposed.changed[rel])
            if use is not None:
                line = proposed.line_on_disk(rel, use.line)
                return Violation(proposed.owner, refusal(rel, line, use, proposed.owner))
        return None


def host_only_use_in(rel: str, data: bytes) -> HostOnlyUse | None:
    """The first host-only use in ``rel`` as written (``data``) where it
    names the lengths; None: none. A function of the bytes, kept in the
    transform cache like a transform: found by the worker that writes them,
    read back by a warm apply (neither parses them again)."""
    if not any(name.encode() in data for name in LENS):
        return None
    from patchkit.transform.cache import TransformCache

    shared = TransformCache.default()
    key = shared.fact_key(HostOnlyUseIn, rel, hashlib.sha256(data).hexdigest())
    cached = shared.get_fact(key, HostOnlyUseIn)
    if cached is not None:
        return cached.use
    use = next(host_only_uses(data, rel), None)
    shared.put_fact(key, HostOnlyUseIn(use))
    return use


@dataclass(frozen=True)
class HostOnlyUseIn:
    """``host_only_use_in``'s answer on a file's bytes (None: no such use)."""

    KIND: ClassVar[str] = "host-only-use"
    use: HostOnlyUse | None

    def to_json(self) -> dict[str, object] | None:
        return None if self.use is None else asdict(self.use)

    @classmethod
    def from_json(cls, data: object) -> HostOnlyUseIn:
        if data is None:
            return cls(None)
        if not isinstance(data, dict):
            raise TypeError("not a use")
        return cls(HostOnlyUse(**data))  # TypeError: written by another shape of HostOnlyUse (a miss)


def refusal(rel: str, line: int, use: HostOnlyUse, patch: str) -> str:
    """One line: where, what reaches host-only code, and what the maintainer can do."""
    from patchkit.registry import skip_advice

    return (
        f"refused: {rel}:{line}: {use.function} hands `{use.value}` to {use.use}, which needs a host "
        f"tensor, but {patch} lets the extend lengths be device tensors there (the GPU-only draft extend), "
        f"so nothing of {patch} is written: do that only where the lengths are a list "
        f"(`if isinstance(batch.extend_seq_lens, list):`), or {skip_advice(patch)}"
    )


def host_only_uses(data: bytes, rel: str = "<unknown>") -> Iterator[HostOnlyUse]:
    """Each host-only use of device-able extend lengths in a file as the patch writes it, by line."""
    try:
        module = python_ast.parse(data, rel)
    except SyntaxError:
        return  # the transform's compile check names it
    lines = data.splitlines()
    for qualname, fn in _functions(module):
        if _names_lens(fn, lines) and _takes_device_lens(fn):
            yield from sorted(_uses(fn, qualname), key=lambda u: u.line)


def _names_lens(fn: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[bytes]) -> bool:
    """Whether the text of ``fn`` (its decorators too) names the lengths:
    where not, no node of it is one (``_takes_device_lens`` without a walk)."""
    start = min([fn.lineno, *(d.lineno for d in fn.decorator_list)])
    text = b"\n".join(lines[start - 1 : fn.end_lineno])
    return any(name.encode() in text for name in LENS)


def _functions(module: ast.Module) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    for node in module.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{node.name}.{item.name}", item


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _takes_device_lens(fn: ast.AST) -> bool:
    """The patch's mark: the lengths accepted as tensors (``isinstance(LENS, (list,
    torch.Tensor))``) or built with ``torch.as_tensor`` (which keeps a device tensor)."""
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and node.args and _is_lens(node.args[0]):
            name = _dotted(node.func)
            if name == "torch.as_tensor":
                return True
            if name == "isinstance" and len(node.args) == 2 and "torch.Tensor" in ast.unparse(node.args[1]):
                return True
    return False


def _is_lens(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and node.attr in LENS and isinstance(node.value, ast.Name)


class _Trail:
    """The expressions of one function that may hold the device lengths."""

    def __init__(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        params = {a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)}
        self.params, self.locals = params - {"self", "cls"}, set[str]()
        assigns = [n for n in ast.walk(fn) if isinstance(n, ast.Assign) and len(n.targets) == 1]
        grown = True
        while grown:  # a local assigned from a device-able value is one; until nothing is added
            grown = False
            for a in assigns:
                target = a.targets[0]
                if isinstance(target, ast.Name) and target.id not in self.locals and self.holds(a.value):
                    self.locals.add(target.id)
                    grown = True

    def holds(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Attribute) and node.attr in LENS:
            return isinstance(node.value, ast.Name) and node.value.id in self.params
        if isinstance(node, ast.Name):
            return node.id in self.locals
        if isinstance(node, ast.Subscript):
            return self.holds(node.value)
        if isinstance(node, ast.Call):
            if _dotted(node.func) in BUILDS:
                return bool(node.args) and self.holds(node.args[0])
            if isinstance(node.func, ast.Attribute) and node.func.attr not in TO_HOST:
                to_cpu = node.func.attr == "to" and "cpu" in ast.unparse(node)
                return not to_cpu and self.holds(node.func.value)
        return False


def _host_branches(fn: ast.AST) -> set[int]:
    """The nodes only run where a value is a host list: the body of ``if isinstance(X, list):``."""
    inside = set()
    for node in ast.walk(fn):
        test = node.test if isinstance(node, ast.If) else None
        if (
            isinstance(node, ast.If)
            and isinstance(test, ast.Call)
            and _dotted(test.func) == "isinstance"
            and len(test.args) == 2
            and _dotted(test.args[1]) == "list"
        ):
            inside |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return inside


def _uses(fn: ast.FunctionDef | ast.AsyncFunctionDef, qualname: str) -> Iterator[HostOnlyUse]:
    trail, host = _Trail(fn), _host_branches(fn)
    for node in ast.walk(fn):
        if id(node) in host:
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in HOST_ONLY_METHODS and trail.holds(node.func.value):
                yield HostOnlyUse(node.lineno, qualname, ast.unparse(node.func.value), f"`.{node.func.attr}()`")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ITERATING:
            if node.args and trail.holds(node.args[0]):
                yield HostOnlyUse(node.lineno, qualname, ast.unparse(node.args[0]), f"`{node.func.id}(...)`")
        if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)) and trail.holds(node.iter):
            line = node.iter.lineno
            yield HostOnlyUse(line, qualname, ast.unparse(node.iter), "iteration (`for ... in`)")
