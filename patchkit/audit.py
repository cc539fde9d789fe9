"""``patchkit audit``: every read of the CPU seq_lens mirror in a tree, classified.

Once needs-cpu-seq-lens lets spec-v2 decode drop the mirror, ``seq_lens_cpu`` /
``seq_lens_sum`` are None on those paths, and the CUDA-graph runners' CPU
``seq_lens_cpu`` buffers (filled from the mirror) are no longer refreshed. A
read that nobody guards then reads None (a crash) or old numbers (silently
wrong, e.g. profiling labels). Vendor forks add such reads where no patch
knows about them (their own attention backends, spec-decoding workers,
models); this finds them on any tree (pristine, patched, fork).

The audit walks every module under ``srt/`` whose bytes name the mirror
(a text pre-filter: the rest is never parsed), and reads each with ``ast``
(patchkit/audit_ast.py). Attention backends are known by inheritance across
the tree: classes deriving, by name, from ``AttentionBackend``, and wrappers
that build them (a multi-step draft backend). Each read gets one verdict:

* ``guarded``: only reached when the value is not None (the tree's own None
  test in any form: ``if x is not None:``, ``if x is None: return``,
  ``x is not None and ...``, a conditional expression, an early ``continue``);
* ``patched``: handled by a patch (the argument of a patchkit runtime helper,
  or the branch where ``needs_cpu_seq_lens()`` is True);
* ``safe``: cannot see a dropped mirror: in a backend that keeps it (its class
  or an ancestor does not opt out, and it builds no backend that does: the
  decision keeps the mirror whenever it runs); a plain copy or hand-off of the
  value, whose readers are audited where they read it; set a few lines above;
  a code path where the mirror always exists, with the reason; or the
  release's own code off the spec-v2 paths (``origin`` "release", outside
  MODULES: read as sglang ships it, which the patches were written against);
* ``unguarded``: reads None once the mirror is dropped: in a backend that
  opts out (or may: a property), a wrapper that builds one, or code outside
  the backends (workers, models, helpers run beside whatever backend is
  configured);
* ``stale``: reads a CPU buffer that is no longer refreshed once the mirror is
  dropped.

Each read also says where it comes from (``origin``): "release" when the
sglang release the tree names ships it (same module, function and code; the
release from patchkit's cache, never downloaded here), "vendor" when not,
None when that release is not cached.

Only parses (``ast``, fast); never imports sglang nor writes the tree.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Optional

from patchkit.audit_ast import MIRROR, MIRROR_ALWAYS, OPTS_OUT_WITH, PATCH, ClassFacts, FileAudit, Read, scan

__all__ = ["Audit", "Read", "audit_tree", "fingerprint", "to_json", "to_text", "vendor_line", "vendor_problems",
           "verify_line"]

AUDIT_SCHEMA = "patchkit.audit/1"
VERDICTS = ("guarded", "patched", "safe", "unguarded", "stale")
PROBLEMS = ("unguarded", "stale")

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

# The text pre-filter: a module whose bytes name neither is never parsed.
_NEEDLES = tuple(m.encode() for m in MIRROR)
# Where a class is defined (the pre-filter of the inheritance walk: only the
# modules defining a base by that name are parsed for it).
_CLASS_RE = re.compile(rb"class[ \t]+(\w+)")  # a superset (strings, comments): ast decides
ROOT = "AttentionBackend"
# Opted out by needs-cpu-seq-lens itself, the patch the audit is about: the
# audit answers "once it is applied", so these count as opted out on a
# pristine tree too (every other backend: only once its class says so).
OPTED_OUT_BY_PATCH = frozenset({"TritonAttnBackend", "TritonMultiStepDraftBackend"})
SKIP = ("srt/_patchkit/",)  # patchkit's vendored runtime


@dataclass
class Audit:
    package: Path
    modules: list[str] = field(default_factory=list)  # the modules that read the mirror
    reads: list[Read] = field(default_factory=list)
    release: Optional[str] = None  # the cached pristine release the reads were compared with

    def count(self, verdict: str) -> int:
        return sum(r.verdict == verdict for r in self.reads)

    @property
    def problems(self) -> list[Read]:
        return [r for r in self.reads if r.verdict in PROBLEMS]

    @property
    def ok(self) -> bool:
        return not self.problems


def audit_tree(package: Path, pristine: Optional[Path] = None) -> Audit:
    """The audit of the sglang package folder ``package``; ``pristine``: the
    release's package folder to compare with (default: the release the tree
    names, when patchkit's cache holds it)."""
    package = Path(package)
    sources = _sources(package)
    if pristine is None:
        pristine = cached_release(package)
    result = Audit(package, release=str(pristine) if pristine else None)
    facts = {rel: _facts(rel, data) for rel, data in sources.items() if _reads_mirror(data)}
    classes = _ClassIndex(sources, facts)
    release = _Release(pristine) if pristine else None
    for rel, fact in list(facts.items()):
        if fact is None or not fact.reads:
            continue
        result.modules.append(rel)
        origins = release.origins(rel, sources[rel], fact.reads) if release else [None] * len(fact.reads)
        for read, origin in zip(fact.reads, origins):
            result.reads.append(_combine(Read(**asdict(read)), origin, classes))
    return result


def _combine(read: Read, origin: Optional[str], classes: "_ClassIndex") -> Read:
    """The local verdict, made with what only the whole tree knows: whether the
    class holding the read keeps the mirror, and whether sglang ships it."""
    read.origin = origin
    if read.verdict != "unguarded":
        return read
    opts_out = None
    if read.cls is not None and classes.backend_like(read.file, read.cls):
        opts_out = classes.opts_out(read.file, read.cls)
        if opts_out is None:
            read.verdict, read.why = "safe", f"{read.cls} keeps the mirror: {classes.keeps_why(read.file, read.cls)}"
            return read
        read.why = f"{read.why}: {opts_out}"
    if origin == "release" and read.file not in MODULES and opts_out is None:
        read.verdict, read.why = "safe", ("as the sglang release ships it, off the spec-v2 paths the patches "
                                          "cover (patchkit.audit.MODULES)")
    elif opts_out is None:
        read.why += " (code outside the attention backends runs beside whichever is configured)"
    return read


# -- the tree ------------------------------------------------------------------------


def _sources(package: Path) -> dict[str, bytes]:
    """Every module under srt/, by path relative to the package, sorted."""
    found = {}
    root = str(package)
    for folder, dirs, files in os.walk(package / "srt"):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                if not rel.startswith(SKIP):
                    with open(path, "rb") as handle:
                        found[rel] = handle.read()
    return found


def _reads_mirror(data: bytes) -> bool:
    return any(needle in data for needle in _NEEDLES)


@dataclass
class _Facts:
    reads: list[Read]
    classes: dict[str, ClassFacts]


_MEMO: dict[tuple, Optional[_Facts]] = {}  # a module is read once per process


def _facts(rel: str, data: bytes, reads: bool = True) -> Optional[_Facts]:
    """The module's reads with their local verdicts and its classes; None
    when it does not parse (status / verify report it). Cached in the
    process, and on disk by the module's bytes (:func:`_disk`)."""
    key = (rel, hashlib.sha1(data).hexdigest(), reads)
    if key in _MEMO:
        return _MEMO[key]
    path = _disk(key)
    if path is not None and path.is_file():
        try:
            doc = json.loads(path.read_text())
            _MEMO[key] = None if doc is None else _Facts(
                [Read(**r) for r in doc["reads"]],
                {c["name"]: ClassFacts(c["name"], c["bases"], c["flag"], set(c["calls"])) for c in doc["classes"]})
            return _MEMO[key]
        except (OSError, ValueError, KeyError, TypeError):
            pass
    source = data.decode("utf-8", errors="surrogateescape")
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        facts = None
    else:
        if reads:
            audit = FileAudit(rel, source, tree)
            facts = _Facts(list(audit.reads()), audit.classes)
        else:
            facts = _Facts([], scan(tree)[0])
    _MEMO[key] = facts
    if path is not None:
        doc = None if facts is None else {
            "reads": [asdict(r) for r in facts.reads],
            "classes": [{**asdict(c), "calls": sorted(c.calls)} for c in facts.classes.values()]}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(doc))
            os.replace(tmp, path)
        except OSError:
            pass
    return facts


_CODE: list[str] = []


def _disk(key: tuple) -> Optional[Path]:
    """Where a module's facts are cached: ``audit/`` in the transform cache's
    folder (``PATCHKIT_TRANSFORM_CACHE=off`` turns both off), under the
    module's path and bytes and the audit's own code."""
    from patchkit import settings

    folder = settings.transform_cache_dir()
    if folder is None:
        return None
    if not _CODE:
        import patchkit.audit_ast as code

        digest = hashlib.sha1(Path(code.__file__).read_bytes())
        digest.update(repr(sorted(code._runtime_helpers())).encode())
        _CODE.append(digest.hexdigest()[:16])
    name = hashlib.sha1(repr((key, _CODE[0])).encode()).hexdigest()
    return folder / "audit" / name[:2] / f"{name}.json"


class _ClassIndex:
    """Classes by name across the tree, resolved lazily: a base is looked up
    in the module holding the subclass first, then in every module that
    defines a class by that name (found by text, parsed on demand)."""

    def __init__(self, sources: dict[str, bytes], facts: dict[str, Optional[_Facts]]) -> None:
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

    def _module(self, rel: str) -> Optional[_Facts]:
        if rel not in self.facts:
            self.facts[rel] = _facts(rel, self.sources[rel], reads=False)
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
        if name in OPTED_OUT_BY_PATCH:
            flag, where = "False", f"{name} (opted out by {PATCH})"
        for other, facts in self._lookup(rel, name):
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
                if called != name and called[:1].isupper() and self._defined_in(called) and self.resolve(other, called)[0]:
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
    from patchkit.tree import _read_version

    version = _read_version(package)
    if not version or version == "unknown":
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


class _Release:
    def __init__(self, package: Path) -> None:
        self.package = package

    def origins(self, rel: str, data: bytes, reads: list[Read]) -> list[str]:
        """"release" for each read the release ships, else "vendor": lines
        the release has unchanged (aligned as ``diff`` does) are its; in a
        changed run of lines, a read is the release's while the release's run
        has one with the same function and code left."""
        path = self.package / rel
        if not path.is_file():
            return ["vendor"] * len(reads)
        shipped = path.read_bytes()
        if shipped == data:
            return ["release"] * len(reads)
        from difflib import SequenceMatcher

        facts = _facts(rel, shipped)
        old_reads = facts.reads if facts else []
        opcodes = SequenceMatcher(None, shipped.splitlines(), data.splitlines()).get_opcodes()
        result = []
        left: dict[tuple, Counter] = {}
        for read in reads:
            line = read.line - 1
            tag, i1, i2, j1, j2 = next(op for op in opcodes if op[3] <= line < op[4] or op[3] == op[4] == line)
            if tag == "equal":
                result.append("release")
                continue
            if tag == "insert":
                result.append("vendor")
                continue
            counts = left.setdefault((i1, i2), Counter((r.function, r.code) for r in old_reads if i1 < r.line <= i2))
            key = (read.function, read.code)
            result.append("release" if counts[key] > 0 else "vendor")
            counts[key] -= 1
        return result


# -- rendering ---------------------------------------------------------------------


def summary(result: Audit) -> dict:
    return {"total": len(result.reads), **{v: result.count(v) for v in VERDICTS}}


def to_json(result: Audit, tree: dict, paths) -> str:
    """``patchkit.audit/1`` (docs/ci.md); ``paths(rel)`` is the file as the user sees it."""
    reads = []
    for r in sorted(result.reads, key=lambda r: (r.file, r.line, r.column)):
        reads.append({**asdict(r), "path": paths(r.file)})
    doc = {"schema": AUDIT_SCHEMA, "tree": tree, "release": result.release, "modules": result.modules,
           "reads": reads, "summary": summary(result), "ok": result.ok}
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
    """sha256 over every module under srt/ (path and bytes) and the release
    compared with: an audit's result is a function of them, so ``verify``
    caches its count under this key."""
    digest = hashlib.sha256(str(cached_release(Path(package))).encode() + b"\0")
    for rel, data in _sources(Path(package)).items():
        digest.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest()


def vendor_problems(result: Audit, targets: Iterable[str] = ()) -> list[Read]:
    """The unguarded and stale reads in the vendor's own code: modules or
    reads the release does not ship; without the release to compare with,
    every one outside ``targets`` (the files patchkit's patches change)."""
    targets = set(targets)
    return [r for r in result.problems
            if r.origin == "vendor" or (r.origin is None and r.file not in targets)]


def vendor_line(package: Path, targets: Iterable[str] = ()) -> Optional[str]:
    """The line ``apply`` ends with when the vendor's own code reads the
    mirror unguarded (None when it does not)."""
    count = len(vendor_problems(audit_tree(package), targets))
    if not count:
        return None
    return (f"audit: {count} read(s) of the CPU seq_lens mirror in the vendor's own code are unguarded or stale "
            "once it is dropped (`patchkit audit TREE` lists them)")


def verify_line(problems: int) -> str:
    """The one line ``verify`` prints about the audit (``problems``: reads
    unguarded or stale)."""
    return (f"audit: {problems} read(s) of the CPU seq_lens mirror unguarded or stale once it is dropped"
            + (" (`patchkit audit TREE` lists them)" if problems else ""))
