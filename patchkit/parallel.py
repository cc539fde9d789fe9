"""Plan-time preparation of an apply: each target file's detection and
transform, computed before the plan, in parallel processes, or taken from the
shared transform cache (``patchkit.transform_cache``).

Files are independent: the engine parses each once and runs every codemod for
it on that one tree. So before ``apply`` decides what to do, ``prepare`` runs,
per file, exactly the engine's own code (``Session.detect`` then
``Session.transform``, in a forked copy of the session) with the codemods of
every selected patch, grouped by patch; a patch group with a missing anchor in
the file is left out (that patch will be reported not applicable). The plan
then uses a prepared result only where it is provably what the serial engine
would compute (see ``Session.prepared``); anything else, and every error, goes
through the serial path, which raises the precise message. The commit stays
one transaction in the parent process.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from typing import TYPE_CHECKING, Iterator, Optional, Sequence

from patchkit.findings import State
from patchkit.state import sha256
from patchkit.transform_cache import Entry, TransformCache, cacheable

if TYPE_CHECKING:
    from patchkit.engine import Session

# The session the forked workers compute with (set in the parent just before
# the pool forks; each worker has its own copy-on-write copy of it).
_SESSION: Optional["Session"] = None


def jobs() -> int:
    """Worker processes: ``PATCHKIT_JOBS``, else the CPUs this process may use."""
    configured = os.environ.get("PATCHKIT_JOBS", "").strip()
    if configured.isdigit() and int(configured) > 0:
        return int(configured)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def compute(session: "Session", rel: str, groups: Sequence[Sequence]) -> Optional[Entry]:
    """Detection and transform of one file as the serial engine does them.
    None if anything fails (the serial path will raise the precise error)."""
    from patchkit import registry
    from patchkit.errors import PatchkitError

    try:
        source = session.read(rel)
        if source is None:
            return None
        names = [[registry.codemod_name(r) for r in group] for group in groups]
        before: dict[str, list] = {}
        for group in groups:
            for ref in group:
                f = session.detect(rel, ref)
                before[registry.codemod_name(ref)] = f.as_list()
        effective = [i for i, group in enumerate(names) if all(before[n][0] != State.MISSING.value for n in group)]
        entry = Entry(before, [names[i] for i in effective])
        if effective:
            try:
                new = session.transform(rel, source, [registry.load_codemod(r) for i in effective for r in groups[i]])
            except PatchkitError:
                return entry  # no usable transform: the serial path raises it
            digest = sha256(new)
            entry.new = new
            entry.after = {n: session._cache[f"{n}|{digest}"] for g in entry.groups for n in g}
            entry.transformed = tuple(session.last_transformed)
        return entry
    except Exception:  # noqa: BLE001 - a worker never decides an error; the serial path does
        return None


def _work(rel: str, groups: Sequence[Sequence]) -> Optional[Entry]:
    assert _SESSION is not None
    return compute(_SESSION, rel, groups)


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """The cyclic GC off while files are parsed and transformed: a parse makes
    hundreds of thousands of CST nodes (freed by reference counting, no cycles),
    and re-scanning them in full collections cost a fifth of an apply's time."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def prepare(session: "Session", files: dict[str, list[list]]) -> dict[str, Entry]:
    """Entries for ``files`` (rel -> codemod refs grouped by patch): from the
    transform cache where it has them, else computed (in parallel when more
    than one file needs it). New results are stored in the cache."""
    global _SESSION
    cache = session.transform_cache
    out: dict[str, Entry] = {}
    todo: list[tuple[str, list[list], Optional[str]]] = []
    from patchkit import registry

    for rel, groups in files.items():
        source = session.read(rel)
        if source is None:
            continue
        key = None
        if cache.enabled and cacheable([r for g in groups for r in g]):
            key = cache.key(sha256(source), [[registry.codemod_name(r) for r in g] for g in groups])
            entry = cache.get(key)
            if entry is not None:
                out[rel] = entry
                continue
        todo.append((rel, groups, key))
    if not todo:
        return out
    # Biggest files first: the pool ends when its longest file does.
    todo.sort(key=lambda job: -len(session.read(job[0]) or b""))
    import multiprocessing

    workers = min(jobs(), len(todo))
    if multiprocessing.current_process().daemon:
        workers = 1  # a daemonic worker (e.g. of a multiprocessing.Pool) may not fork workers of its own
    if "fork" not in multiprocessing.get_all_start_methods() or sys.platform == "darwin":
        workers = 1  # workers inherit the session by fork; macOS's system libraries are not fork-safe
    results: dict[str, Optional[Entry]] = {}
    if workers <= 1:
        with _no_gc():
            for rel, groups, _ in todo:
                results[rel] = compute(session, rel, groups)
    else:
        from concurrent.futures import ProcessPoolExecutor

        # Import what the workers need once, here, so every fork inherits it.
        for _, groups, _ in todo:
            for group in groups:
                for ref in group:
                    registry.load_codemod(ref)
        import libcst  # noqa: F401

        _SESSION = session
        # What the parent holds stays out of every collection in the workers
        # (no copy-on-write of its pages for the GC's bookkeeping).
        gc.freeze()
        try:
            with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                                     initializer=gc.disable) as pool:
                futures = {rel: pool.submit(_work, rel, groups) for rel, groups, _ in todo}
                for rel, future in futures.items():
                    try:
                        results[rel] = future.result()
                    except Exception:  # noqa: BLE001 - a dead worker: compute it here
                        with _no_gc():
                            results[rel] = compute(session, rel, [g for r, g, _ in todo if r == rel][0])
        finally:
            _SESSION = None
            gc.unfreeze()
    for rel, groups, key in todo:
        entry = results.get(rel)
        if entry is None:
            continue
        out[rel] = entry
        if key is not None:
            cache.put(key, entry)
    return out
