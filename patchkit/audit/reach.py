"""Code that runs only while the decision keeps the mirror (verdict ``kept-mirror``).

The decision (``patchkit.runtime.seq_lens.configure_needs_cpu_seq_lens``)
drops the mirror only for a spec-v2 worker that lists its attention backends
(``spec_v2_attn_backends``); any other worker keeps it. A fork's own spec-v2
worker that lists none therefore never runs without the mirror: its reads,
and those of modules only it imports, cannot see None. Found by names and
text, cheaply, and only for reads that would otherwise be ``unguarded``.
"""

from __future__ import annotations

import ast
import re
from typing import Optional

from patchkit.audit.facts import ClassIndex

PROPERTY = "spec_v2_attn_backends"
# Workers needs-cpu-seq-lens itself makes list their backends: the audit
# answers "once it is applied", so these list them on a pristine tree too.
LISTED_BY_PATCH = frozenset({"EAGLEWorkerV2"})
_WORKER = re.compile(r"Worker(V\d+)?$")


class KeptMirror:
    def __init__(self, sources: dict[str, bytes], classes: ClassIndex) -> None:
        self.sources, self.classes = sources, classes
        self._trees: dict[str, Optional[ast.Module]] = {}
        self._memo: dict[tuple[str, str], Optional[str]] = {}

    def _classes(self, rel: str) -> list[ast.ClassDef]:
        """The module's top-level classes (parsed once)."""
        if rel not in self._trees:
            try:
                self._trees[rel] = ast.parse(self.sources[rel])
            except (SyntaxError, ValueError, KeyError):
                self._trees[rel] = None
        tree = self._trees[rel]
        return [n for n in (tree.body if tree else []) if isinstance(n, ast.ClassDef)]

    def _class(self, rel: str, name: str) -> Optional[ast.ClassDef]:
        return next((n for n in self._classes(rel) if n.name == name), None)

    def _chain(self, rel: str, name: str, seen: frozenset = frozenset()) -> list[tuple[str, ast.ClassDef]]:
        """``name`` as seen from ``rel`` and its ancestors found in the tree (first definition each)."""
        if (rel, name) in seen:
            return []
        for other, facts in self.classes._lookup(rel, name)[:1]:
            node = self._class(other, name)
            if node is None:
                return []
            chain = [(other, node)]
            for base in facts.bases:
                chain += self._chain(other, base, seen | {(rel, name)})
            return chain
        return []

    def worker(self, rel: str, name: str) -> Optional[str]:
        """Why the class ``name`` runs only with the mirror kept: a spec-v2
        worker (it holds a target worker) that lists no attention backends,
        nor does an ancestor; None otherwise."""
        key = (rel, name)
        if key not in self._memo:
            self._memo[key] = self._worker(rel, name)
        return self._memo[key]

    def _worker(self, rel: str, name: str) -> Optional[str]:
        if not _WORKER.search(name) or "Draft" in name:  # a draft sub-worker runs under its spec worker
            return None
        chain = self._chain(rel, name)
        if not chain:
            return None
        names = [
            {n.id if isinstance(n, ast.Name) else getattr(n, "attr", getattr(n, "name", None)) for n in ast.walk(node)}
            for _, node in chain
        ]
        if not any("target_worker" in found for found in names):
            return None
        if any(node.name in LISTED_BY_PATCH or PROPERTY in found for (_, node), found in zip(chain, names)):
            return None
        return (
            f"kept mirror: {name} is a spec-v2 worker that does not list its attention backends "
            f"({PROPERTY}), so the decision keeps the mirror whenever it runs"
        )

    def module(self, rel: str) -> Optional[str]:
        """Why the module ``rel`` runs only with the mirror kept: every module
        that imports it defines such a worker; None otherwise (or no importer found)."""
        dotted = ("sglang." + rel[:-3].replace("/", ".")).encode()
        folder, stem = rel.rsplit("/", 1)[0], rel.rsplit("/", 1)[1][:-3]
        relative = re.compile(
            rb"from\s+\.\s*"
            + re.escape(stem.encode())
            + rb"\s+import|from\s+\.\s+import[^\n]*\b"
            + re.escape(stem.encode())
            + rb"\b"
        )
        importers = [
            other
            for other, data in self.sources.items()
            if other != rel and (dotted in data or (other.rsplit("/", 1)[0] == folder and relative.search(data)))
        ]
        if not importers:
            return None
        reasons = []
        for other in importers:
            workers = [n.name for n in self._classes(other) if self.worker(other, n.name)]
            if not workers:
                return None
            reasons.append(f"{workers[0]} ({other})")
        return f"kept mirror: only imported by {', '.join(reasons)}, which keeps the mirror whenever it runs"
