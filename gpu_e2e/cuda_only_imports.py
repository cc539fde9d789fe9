"""What a CUDA machine imports that the CPU walk cannot see (host side, for the bundle's tests).

``coverage.engine_path_imports`` imports the Engine path on CPU, where ``is_cuda()`` is
false: a module-level ``if is_cuda(): import deep_gemm`` and an import made inside a
function at start-up never run there. 0.5.17's EAGLE v2 worker imports
``layers/attention/dsa_backend`` inside ``_capture_cuda_graphs`` under ``if _is_cuda``,
and that module imports ``deep_gemm`` at module level under ``if is_cuda():``; the
bundle lacked it and every 0.5.17 EAGLE engine died at start-up on the GPU (issue 57,
``git show bbe1fd9:docs/results/gpu-yardstick-2026-11-27/fa3-r1-b17-no-deep-gemm/engine-tail.log``).

This reads source, imports nothing: the modules a function imports under a CUDA guard,
then, from each, every import at module level (and under a module-level CUDA guard),
following sglang's own modules transitively. Imports under ``try`` (guarded by their
``except``) and under any other ``if`` (HIP, NPU, ``TYPE_CHECKING``) are not followed.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Optional


def is_cuda_guard(test: ast.expr) -> bool:
    """``if _is_cuda:``, ``if is_cuda():``, ``if _is_cuda or _is_musa:``: true on the GPU."""
    names = {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(test) if isinstance(n, ast.Attribute)}
    return any("cuda" in n.lower() for n in names)


def module_file(tree_parent: Path, module: str) -> Optional[Path]:
    base = Path(tree_parent) / module.replace(".", "/")
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _existing(tree_parent: Path, module: str) -> Path:
    """``module``'s file; a module the tree lacks is a one-line LookupError."""
    path = module_file(tree_parent, module)
    if path is None:
        raise LookupError(f"{module}: no such module under {tree_parent}")
    return path


def _imported(module: str, path: Path, node: ast.stmt) -> list[str]:
    """Dotted names a statement imports (``from a import b``: ``a`` and ``a.b``)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    assert isinstance(node, ast.ImportFrom)
    base = module.split(".")
    if node.level:
        base = base[: len(base) - node.level + (path.name == "__init__.py")]
        where = ".".join(base + ([node.module] if node.module else []))
    else:
        where = node.module or ""
    return [where, *(f"{where}.{a.name}" for a in node.names)]


def _cuda_imports(module: str, path: Path, body: Iterable[ast.stmt], guarded: bool) -> list[tuple[str, int]]:
    """Imports in ``body`` (not inside nested functions or classes); ``guarded``: only
    those under a CUDA ``if`` (a function's lazy imports), else every unguarded one too."""
    out: list[tuple[str, int]] = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not guarded:
            out.extend((name, node.lineno) for name in _imported(module, path, node))
        elif isinstance(node, ast.If):
            if is_cuda_guard(node.test):
                out.extend(_cuda_imports(module, path, node.body, False))
        elif isinstance(node, (ast.For, ast.While, ast.With)) and guarded:
            out.extend(_cuda_imports(module, path, node.body, guarded))
    return out


def lazy_cuda_imports(tree_parent: Path, module: str, function: str) -> list[str]:
    """The sglang modules ``module``'s ``function`` (a method too) imports under a CUDA guard."""
    path = _existing(tree_parent, module)
    tree = ast.parse(path.read_text())
    found = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == function]
    if not found:
        raise LookupError(f"{module} has no function {function}")
    names = {name for fn in found for name, _ in _cuda_imports(module, path, fn.body, True)}
    return sorted(n for n in names if module_file(tree_parent, n))


def module_level_imports(tree_parent: Path, modules: Iterable[str]) -> dict[str, str]:
    """``{top-level package outside sglang and the standard library: "module:line"}``
    that ``modules`` import on a CUDA machine as they load, sglang's own followed."""
    todo, seen, tops = list(modules), set(), {}  # type: tuple[list[str], set[str], dict[str, str]]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        path = _existing(tree_parent, module)
        for name, line in _cuda_imports(module, path, ast.parse(path.read_text()).body, False):
            top = name.split(".")[0]
            if top == "sglang":
                parts = name.split(".")  # a package's __init__ loads before its modules
                todo.extend(m for i in range(2, len(parts) + 1) if module_file(tree_parent, m := ".".join(parts[:i])))
            elif top and top not in sys.stdlib_module_names and top != "__future__":
                tops.setdefault(top, f"{module}:{line}")
    return tops
