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
(patchkit/audit/syntax.py; what is known of the tree before a read is
classified: patchkit/audit/facts.py). Attention backends are known by inheritance across
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
* ``kept-mirror``: runs only while the decision keeps the mirror: in a
  spec-v2 worker that does not list its attention backends (nor an ancestor),
  or in a module only such workers import (``patchkit.audit.reach``), with
  the reason;
* ``unguarded``: reads None once the mirror is dropped: in a backend that
  opts out (or may: a property), a wrapper that builds one, or code outside
  the backends (workers, models, helpers run beside whatever backend is
  configured);
* ``stale``: reads a CPU buffer that is no longer refreshed once the mirror is
  dropped.

Each read also says where it comes from (``origin``): "release" when the
sglang release the tree names ships it (same module, function and code; the
release from patchkit's cache, never downloaded here), "vendor" when not,
None when that release is not cached ("unknown origin" in what apply says).

Only parses (``ast``, fast); never imports sglang nor writes the tree.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from patchkit.audit import facts as audit_facts
from patchkit.audit import origins as audit_origins
from patchkit.audit.facts import sources
from patchkit.audit.reach import KeptMirror
from patchkit.audit.reads import Read

__all__ = [
    "Audit",
    "Read",
    "audit_tree",
    "sources",
    "fingerprint",
    "to_json",
    "to_text",
    "vendor_line",
    "vendor_problems",
    "verify_line",
]

AUDIT_SCHEMA = "patchkit.audit/1"
VERDICTS = ("guarded", "patched", "safe", "kept-mirror", "unguarded", "stale")
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

    def text(self, paths, verbose: bool = False) -> str:
        return to_text(self, paths, verbose)

    def json(self, tree: dict, paths) -> str:
        return to_json(self, tree, paths)


def audit_tree(
    package: Path,
    pristine: Optional[Path] = None,
    sources: Optional[dict[str, bytes]] = None,
    vendor_only: bool = False,
    release_own: Iterable[str] = (),
    release_files: Optional[dict[str, Optional[bytes]]] = None,
) -> Audit:
    """The audit of the sglang package folder ``package``; ``pristine``: the
    release's package folder to compare with (default: the release the tree
    names, when patchkit's cache holds it); ``sources``: its modules under
    srt/, when already read (``audit_facts.sources``). ``vendor_only``: leave
    out the modules that are the release's own bytes (every read there is the
    release's: what ``vendor_problems`` never counts), unparsed, and the
    ``release_own`` ones (files patchkit patched that were the release's
    bytes: no vendor code either). ``release_files``: the release's bytes of
    some modules, already fetched (apply's fetch step), for when its tree is
    not in the cache."""
    package = Path(package)
    sources = audit_facts.sources(package) if sources is None else sources
    if pristine is None:
        pristine = audit_facts.cached_release(package)
    result = Audit(package, release=str(pristine) if pristine else None)
    # Without the release's tree, the hashes patchkit ships still tell its unchanged modules.
    release = audit_origins.Release(pristine) if pristine else audit_origins.KnownRelease.of(package, release_files)
    # Modules patchkit patched from the release's own bytes: the release's reads, cache or no cache.
    patched = audit_origins.patched_release_modules(package, sources)
    facts = {
        rel: audit_facts.facts_of(rel, data)
        for rel, data in sources.items()
        if audit_facts.reads_mirror(data)
        and not (vendor_only and (rel in release_own or rel in patched or (release and release.ships(rel, data))))
    }
    classes = audit_facts.ClassIndex(sources, facts)
    kept = KeptMirror(sources, classes)
    for rel, fact in list(facts.items()):
        if fact is None or not fact.reads:
            continue
        result.modules.append(rel)
        origins: Sequence[Optional[str]]
        if rel in patched:
            origins = ["release"] * len(fact.reads)
        else:
            origins = release.origins(rel, sources[rel], fact.reads) if release else [None] * len(fact.reads)
        for read, origin in zip(fact.reads, origins):
            result.reads.append(_combine(Read(**asdict(read)), origin, classes, kept))
    return result


def _combine(read: Read, origin: Optional[str], classes: audit_facts.ClassIndex, kept: KeptMirror) -> Read:
    """The local verdict, made with what only the whole tree knows: whether the
    class holding the read keeps the mirror, whether the decision can drop it
    where the read runs (``kept``), and whether sglang ships it."""
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
        read.verdict, read.why = (
            "safe",
            ("as the sglang release ships it, off the spec-v2 paths the patches cover (patchkit.audit.MODULES)"),
        )
    elif (
        opts_out is None
        and read.file not in MODULES
        and ((read.cls is not None and kept.worker(read.file, read.cls)) or kept.module(read.file))
    ):
        read.verdict, read.why = (
            "kept-mirror",
            (kept.worker(read.file, read.cls) if read.cls else None) or kept.module(read.file) or "",
        )
    elif opts_out is None:
        read.why += " (code outside the attention backends runs beside whichever is configured)"
    return read


# -- rendering ---------------------------------------------------------------------


def summary(result: Audit) -> dict:
    return {"total": len(result.reads), **{v: result.count(v) for v in VERDICTS}}


def to_json(result: Audit, tree: dict, paths) -> str:
    """``patchkit.audit/1`` (docs/ci.md); ``paths(rel)`` is the file as the user sees it."""
    reads = []
    for r in sorted(result.reads, key=lambda r: (r.file, r.line, r.column)):
        reads.append({**asdict(r), "path": paths(r.file)})
    doc = {
        "schema": AUDIT_SCHEMA,
        "tree": tree,
        "release": result.release,
        "modules": result.modules,
        "reads": reads,
        "summary": summary(result),
        "ok": result.ok,
    }
    return json.dumps(doc, indent=2)


def to_text(result: Audit, paths, verbose: bool = False) -> str:
    """The problems (every read with ``verbose``), then one summary line."""
    shown = result.reads if verbose else result.problems
    lines = []
    for r in sorted(shown, key=lambda r: (r.file, r.line, r.column)):
        lines.append(f"{paths(r.file)}:{r.line}: {r.verdict}: {r.function}: {r.code}  ({r.why})")
    counts = ", ".join(f"{result.count(v)} {v}" for v in VERDICTS)
    lines.append(
        f"audit: {len(result.reads)} reads of the CPU seq_lens mirror in {len(result.modules)} modules: {counts}"
    )
    return "\n".join(lines)


def fingerprint(package: Path, sources: Optional[dict[str, bytes]] = None) -> str:
    """sha256 over every module under srt/ (path and bytes) and the release
    compared with: an audit's result is a function of them, so ``verify``
    caches its count under this key."""
    digest = hashlib.sha256(
        str(audit_facts.cached_release(Path(package))).encode() + b"\0" + audit_origins.manifest_digest(Path(package))
    )
    for rel, data in (audit_facts.sources(Path(package)) if sources is None else sources).items():
        digest.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest()


def vendor_problems(result: Audit, targets: Iterable[str] = ()) -> list[Read]:
    """The unguarded and stale reads in the vendor's own code: modules or
    reads the release does not ship; without the release to compare with,
    every one outside ``targets`` (the files patchkit's patches change)."""
    targets = set(targets)
    return [r for r in result.problems if r.origin == "vendor" or (r.origin is None and r.file not in targets)]


def vendor_line(count: int, release: Optional[str] = None, known: bool = True) -> Optional[str]:
    """The line ``apply`` ends with when the vendor's own code reads the
    mirror unguarded (``count``: ``vendor_problems``' length; None when none).
    ``known``: the release (``release``) was in the cache to tell its code
    from the vendor's; without it the reads are of unknown origin."""
    if not count:
        return None
    if not known:
        where = (
            f"of unknown origin (sglang {release} is not in patchkit's cache to tell its code from a vendor's: "
            f"`patchkit fetch {release}`)"
        )
        return (
            f"audit: {count} read(s) of the CPU seq_lens mirror {where} are unguarded or stale once it is "
            "dropped (`patchkit audit TREE` lists them)"
        )
    return (
        f"audit: {count} read(s) of the CPU seq_lens mirror in the vendor's own code are unguarded or stale "
        "once it is dropped (`patchkit audit TREE` lists them)"
    )


def verify_line(problems: int) -> str:
    """The one line ``verify`` prints about the audit (``problems``: reads
    unguarded or stale)."""
    return f"audit: {problems} read(s) of the CPU seq_lens mirror unguarded or stale once it is dropped" + (
        " (`patchkit audit TREE` lists them)" if problems else ""
    )
