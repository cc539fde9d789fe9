"""Where a finding is, as the user sees it: paths relative to the tree
argument as typed, and (on failure only) the line of a finding's anchor."""

from __future__ import annotations

import ast
import os
import re
from typing import Optional

from patchkit.tree import Tree


class Locator:
    """Paths as the user sees them in their repo, and (on failure only) the
    line of a finding's anchor.

    ``given`` is the tree argument exactly as typed; the file of a finding is
    written relative to it (``python/sglang/srt/...`` when the user passed the
    checkout root ``.``), so editors and CI annotations find it. Lines are
    found with ``ast`` (fast, C parser), once per file, only when asked for.
    """

    def __init__(self, tree: Tree, given: Optional[str] = None) -> None:
        self.tree = tree
        self.given = str(tree.given) if given is None else given
        self._sub = os.path.relpath(tree.package, tree.given)
        self._asts: dict[str, Optional[ast.Module]] = {}
        self._lines: dict[str, list[str]] = {}

    def path(self, rel: str, base: Optional[str] = None) -> str:
        """``rel`` (relative to the package) as a path from the user's tree
        argument; an absolute one under ``base`` (default: the working
        directory) is made relative to it."""
        joined = os.path.normpath(os.path.join(self.given, self._sub, rel))
        if os.path.isabs(joined):
            root = os.path.abspath(base or os.getcwd())
            if joined == root or joined.startswith(root.rstrip(os.sep) + os.sep):
                return os.path.relpath(joined, root)
        return joined

    def github_path(self, rel: str) -> str:
        """Annotations are resolved against the repository root."""
        workspace = os.environ.get("GITHUB_WORKSPACE")
        if workspace:
            absolute = os.path.abspath(os.path.join(self.tree.package, rel))
            root = os.path.abspath(workspace)
            if absolute.startswith(root.rstrip(os.sep) + os.sep):
                return os.path.relpath(absolute, root)
        return self.path(rel)

    def line(self, rel: str, anchor: str) -> Optional[int]:
        """Line of ``anchor`` in ``rel``: the class/method/attribute it names
        (``Class.method``), narrowed to the first line inside it that mentions
        the next name in the anchor (``Class.method: some_call ...``); else the
        nearest enclosing one that exists. An anchor that is not a name (a
        comment, a call shape) is looked up as text. None when the file is
        absent or a named class is not there at all (a file-level finding)."""
        module = self._ast(rel)
        if module is None:
            return None
        lines = self._lines.get(rel, [])
        dotted = re.match(r"\s*([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)", anchor or "")
        if dotted:
            parts = dotted.group(1).split(".")
            node = _resolve(module.body, parts)
            if node is None and len(parts) == 1:  # e.g. a bare method name: look anywhere
                node = next((n for n in ast.walk(module) if _named(n) == parts[0]), None)
            if node is not None:
                rest = re.findall(r"[A-Za-z_]\w*", anchor[dotted.end():])
                if rest:
                    end = getattr(node, "end_lineno", None) or node.lineno
                    for number in range(node.lineno, min(end, len(lines)) + 1):
                        if re.search(rf"\b{re.escape(rest[0])}\b", lines[number - 1]):
                            return number
                return node.lineno
            if re.fullmatch(r"[\w.]+", anchor.strip()):
                return None
        if anchor:
            for number, text in enumerate(lines, 1):
                if anchor in text:
                    return number
        return None

    def _ast(self, rel: str) -> Optional[ast.Module]:
        if rel not in self._asts:
            try:
                data = self.tree.path(rel).read_bytes()
                self._lines[rel] = data.decode("utf-8", "replace").splitlines()
                self._asts[rel] = ast.parse(data)
            except (OSError, SyntaxError, ValueError):
                self._asts[rel] = None
        return self._asts[rel]


def _named(node: ast.AST) -> Optional[str]:
    if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        return node.name
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    for target in targets:
        if isinstance(target, ast.Name):
            return target.id
    return None


def _resolve(body: list[ast.stmt], parts: list[str]) -> Optional[ast.AST]:
    """The node of the deepest existing prefix of ``parts`` (Class.method...)."""
    found = None
    for name in parts:
        node = next((n for n in body if _named(n) == name), None)
        if node is None:
            break
        found = node
        body = getattr(node, "body", [])
        if not isinstance(body, list):
            break
    return found
