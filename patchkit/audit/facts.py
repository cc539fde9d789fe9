"""What ``patchkit audit`` knows of a tree before it classifies a read
(patchkit/audit/__init__.py classifies): the modules under ``srt/`` that name the
mirror (a text pre-filter), each module's reads and classes (``audit_ast``,
parsed once per process and cached on disk by its bytes), the classes by
name across the tree (is a class a backend, does it opt out, by
inheritance), and which reads the cached release ships as they are.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from patchkit import python_ast
from patchkit.audit.scan import MIRROR, ClassFacts, scan
from patchkit.audit.syntax import PATCH, FileAudit, Read
from patchkit.cache_secret import seal, sealed
from patchkit.errors import untrusted_json
from patchkit.tree import holds_package, read_walked

# The text pre-filter: a module is parsed only where its bytes may load an
# attribute of a mirror's name: a dot, then (whitespace, a line continuation,
# comments: all legal in brackets) the name. Names, keywords, strings and
# comments that only mention it (two in five modules that name it) are not.
_ATTRIBUTE = re.compile(rb"\.(?:\s|\\\r?\n|#[^\n]*\n)*(?:" + b"|".join(m.encode() for m in MIRROR) + rb")\b")
# Where a class is defined (the pre-filter of the inheritance walk: only the
# modules defining a base by that name are parsed for it).
_CLASS_RE = re.compile(rb"class[ \t]+(\w+)")  # a superset (strings, comments): ast decides
ROOT = "AttentionBackend"
# Opted out by needs-cpu-seq-lens itself, the patch the audit is about: the
# audit answers "once it is applied", so these count as opted out on a
# pristine tree too (every other backend: only once its class says so).
OPTED_OUT_BY_PATCH = frozenset({"TritonAttnBackend", "TritonMultiStepDraftBackend"})
BY_PATCH = " (by the patch)"  # ends the ``where`` of a flag that only the patch declares
SKIP = ("srt/_patchkit/",)  # patchkit's vendored runtime
MANIFEST = "srt/_patchkit/manifest.json"  # the tree's record of what patchkit changed (patchkit.state.vendoring)


def sources(package: Path) -> dict[str, bytes]:
    """Every module under srt/, by path relative to the package, sorted."""
    found = {}
    cut = len(os.path.join(str(package), ""))  # os.walk's folders start with the package's path
    for folder, dirs, files in os.walk(package / "srt"):
        if "srt" in dirs and holds_package(Path(folder)):  # a tree nested in this one: its own audit's
            dirs[:] = []
            continue
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                rel = path[cut:].replace(os.sep, "/")
                data = None if rel.startswith(SKIP) else read_walked(path, package)
                if data is not None:
                    found[rel] = data
    return found


_NAMES = tuple(m.encode() for m in MIRROR)


def reads_mirror(data: bytes) -> bool:
    # The plain search first: most modules do not name the mirror at all.
    return any(name in data for name in _NAMES) and _ATTRIBUTE.search(data) is not None


@dataclass
class Facts:
    reads: list[Read]
    classes: dict[str, ClassFacts]


_MEMO: dict[tuple, Optional[Facts]] = {}  # a module is read once per process


def facts_of(rel: str, data: bytes, reads: bool = True) -> Optional[Facts]:
    """The module's reads with their local verdicts and its classes; None
    when it does not parse (status / verify report it). Cached in the
    process, and on disk by the module's bytes (:func:`_disk`)."""
    key = (rel, hashlib.sha1(data).hexdigest(), reads)
    if key in _MEMO:
        return _MEMO[key]
    path = _disk(key)
    if path is not None and path.is_file():
        try:
            entry = untrusted_json(path.read_text())
            doc = entry["facts"]
            if not sealed(path.parents[2], json.dumps(doc, sort_keys=True).encode(), entry["seal"]):
                raise ValueError("not sealed by this cache's owner")
            _MEMO[key] = (
                None
                if doc is None
                else Facts(
                    [Read(**r) for r in doc["reads"]],
                    {c["name"]: ClassFacts(c["name"], c["bases"], c["flag"], set(c["calls"])) for c in doc["classes"]},
                )
            )
            return _MEMO[key]
        except (OSError, ValueError, KeyError, TypeError):
            pass
    source = data.decode("utf-8", errors="surrogateescape")
    try:  # the bytes the transform just compiled are parsed already (python_ast)
        tree = python_ast.parse(data) if python_ast.plain_utf8(data) else ast.parse(source)
    except (SyntaxError, ValueError):
        facts = None
    else:
        if reads:
            audit = FileAudit(rel, source, tree)
            facts = Facts(list(audit.reads()), audit.classes)
        else:
            facts = Facts([], scan(tree)[0])
    _MEMO[key] = facts
    if path is not None:
        doc = (
            None
            if facts is None
            else {
                "reads": [asdict(r) for r in facts.reads],
                "classes": [{**asdict(c), "calls": sorted(c.calls)} for c in facts.classes.values()],
            }
        )
        from patchkit import settings

        mac = seal(path.parents[2], json.dumps(doc, sort_keys=True).encode())
        try:
            if mac is not None:
                settings.make_cache_folder(path.parent)
                tmp = path.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps({"facts": doc, "seal": mac}))
                os.replace(tmp, path)
        except OSError:
            pass
    return facts


def facts_of_many(modules: list[tuple[str, bytes]]) -> dict[tuple, Optional[Facts]]:
    """``facts_of`` (reads included) of each ``(rel, bytes)``, by its key in
    this process's memory: a worker process's share of an audit, which the
    parent takes in with :func:`remember`."""
    found = {}
    for rel, data in modules:
        facts = facts_of(rel, data)
        found[(rel, hashlib.sha1(data).hexdigest(), True)] = facts
    return found


def remember(found: dict[tuple, Optional[Facts]]) -> None:
    """Facts another process computed (``facts_of_many``): the same function of the same bytes."""
    _MEMO.update(found)


_CODE: list[str] = []


def _disk(key: tuple) -> Optional[Path]:
    """Where a module's facts are cached: ``audit/`` in the transform cache's
    folder (``PATCHKIT_TRANSFORM_CACHE=off`` turns both off), under the
    module's path and bytes and the audit's own code; sealed as the transform
    cache's entries are (``patchkit.cache_secret``: ``parents[2]`` of an entry, the cache's folder)."""
    from patchkit import settings

    folder = settings.transform_cache_dir()
    if folder is None:
        return None
    if not _CODE:
        import patchkit.audit.reads as tables
        import patchkit.audit.scan as walk
        import patchkit.audit.syntax as code

        # These modules decide a module's facts: the walk finds its classes and
        # loads, audit_ast gives each load its verdict, from the tables of reads.py.
        digest = hashlib.sha1(b"".join(Path(f).read_bytes() for f in (walk.__file__, code.__file__, tables.__file__)))
        digest.update(repr(sorted(code._runtime_helpers())).encode())
        _CODE.append(digest.hexdigest()[:16])
    name = hashlib.sha1(repr((key, _CODE[0])).encode()).hexdigest()
    return folder / "audit" / name[:2] / f"{name}.json"


class ClassIndex:
    """Classes by name across the tree, resolved lazily: a base is looked up
    in the module holding the subclass first, then in every module that
    defines a class by that name (found by text, parsed on demand)."""

    def __init__(self, sources: dict[str, bytes], facts: dict[str, Optional[Facts]]) -> None:
        self.sources, self.facts = sources, facts
        self._where: Optional[dict[str, list[str]]] = None
        self._memo: dict[tuple[str, str], tuple] = {}

    def _defined_in(self, name: str) -> list[str]:
        if self._where is None:
            self._where = {}
            for rel, data in self.sources.items():
                for found in set(_CLASS_RE.findall(data)):
                    self._where.setdefault(found.decode(), []).append(rel)
        return self._where.get(name, [])

    def _lookup(self, rel: str, name: str) -> list[tuple[str, ClassFacts]]:
        own = self._module(rel)
        if own is not None and name in own.classes:
            return [(rel, own.classes[name])]
        found = []
        for other in self._defined_in(name):
            facts = self._module(other)
            if facts is not None and name in facts.classes:
                found.append((other, facts.classes[name]))
        return found

    def _module(self, rel: str) -> Optional[Facts]:
        if rel not in self.facts:
            self.facts[rel] = facts_of(rel, self.sources[rel], reads=False)
        return self.facts[rel]

    def resolve(self, rel: str, name: str, seen: frozenset = frozenset()) -> tuple:
        """(is a backend, its flag: "True" / "False" / "dynamic" / None, where
        the flag is declared) for the class ``name`` seen from ``rel``, by
        the first base (depth first, as Python's MRO for single chains)."""
        key = (rel, name)
        if key in self._memo:
            return self._memo[key]
        if key in seen:
            return False, None, None
        backend, flag, where = name == ROOT, None, None
        found = self._lookup(rel, name)
        if name in OPTED_OUT_BY_PATCH and not any(facts.flag is not None for _, facts in found[:1]):
            # Not declared in the tree (yet): the patch declares it; said as such (opts_out).
            flag, where = "False", name + BY_PATCH
        for other, facts in found:
            if flag is None and facts.flag is not None:
                flag, where = facts.flag, name
            for base in facts.bases:
                b_backend, b_flag, b_where = self.resolve(other, base, seen | {key})
                backend = backend or b_backend
                if flag is None and b_flag is not None:
                    flag, where = b_flag, b_where
            break  # the first definition found decides
        self._memo[key] = (backend, flag, where)
        return self._memo[key]

    def _builds(self, rel: str, name: str) -> list[str]:
        """The backend classes ``name`` (or an ancestor) calls: a wrapper's step backends."""
        found = []
        for other, facts in self._lookup(rel, name)[:1]:
            for called in sorted(facts.calls):
                if (
                    called != name
                    and called[:1].isupper()
                    and self._defined_in(called)
                    and self.resolve(other, called)[0]
                ):
                    found.append(called)
        return found

    def backend_like(self, rel: str, name: str) -> bool:
        """A backend, a class that declares the flag, or a wrapper: a plain
        class (no base) or a ``...Backend`` that builds backends (a multi-step
        draft backend; a worker that builds its draft backend is not one)."""
        backend, flag, _ = self.resolve(rel, name)
        if backend or flag is not None:
            return True
        found = self._lookup(rel, name)[:1]
        plain = bool(found) and (not found[0][1].bases or name.endswith("Backend"))
        return plain and bool(self._builds(rel, name))

    def opts_out(self, rel: str, name: str) -> Optional[str]:
        """Why ``name`` runs where the mirror may be dropped, None when it keeps it."""
        _, flag, where = self.resolve(rel, name)
        if flag == "False" and where.endswith(BY_PATCH):
            return (
                f"{name} opts out once {PATCH} is applied (it sets needs_cpu_seq_lens = False "
                f"in {where[: -len(BY_PATCH)]})"
            )
        if flag == "False":
            return f"{name} opts out (needs_cpu_seq_lens = False in {where})"
        if flag == "dynamic":
            return f"{name} may opt out (needs_cpu_seq_lens computed in {where})"
        for built in self._builds(rel, name):
            why = self.opts_out(rel, built) if self.backend_like(rel, built) else None
            if why:
                return f"{name} builds {built}, which opts out"
        return None

    def keeps_why(self, rel: str, name: str) -> str:
        _, flag, where = self.resolve(rel, name)
        if flag == "True":
            return f"needs_cpu_seq_lens = True in {where}"
        return "it does not declare needs_cpu_seq_lens = False (nor an ancestor: the default keeps the mirror)"


# -- the release as shipped ------------------------------------------------------------


def cached_release(package: Path) -> Optional[Path]:
    """The pristine package folder of the release ``package`` names, when
    patchkit's cache holds it (never downloaded here); None for the cached
    release itself."""
    from patchkit import settings
    from patchkit.tree import _read_version, base_release

    version = base_release(_read_version(package))  # a fork's local build (0.5.11+acme): its release
    if not version:
        return None
    folder = settings.cache_dir() / "trees" / version
    pristine = folder / "sglang"
    if not (folder / ".complete").is_file():
        return None
    try:
        if pristine.resolve() == package.resolve():
            return None
    except OSError:
        return None
    return pristine
