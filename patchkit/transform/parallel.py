"""Plan-time preparation of an apply: each target file's detection and
transform, computed before the plan, in parallel processes, or taken from the
shared transform cache (``patchkit.transform.cache``).

Files are independent: the engine parses each once and runs every codemod for
it on that one tree. So before ``apply`` decides what to do, ``prepare`` runs,
per file, exactly the engine's own per-file code (``patchkit.transform``:
detect, then run) with the codemods of every selected patch, grouped by
patch; a patch group with a missing anchor in the file is left out (that
patch will be reported not applicable). It is handed values (each file's
path, bytes and codemods) and hands back values: it knows no session. The plan
then uses a prepared result only where it is provably what the serial engine
would compute (see ``Transformer._use_prepared``); anything else, and every error, goes
through the serial path, which raises the precise message. The commit stays
one transaction in the parent process. ``export`` prepares the same way
(``prepare_all``): each file's original under every prefix of the series.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Optional

from patchkit import lifetimes
from patchkit.postconditions import HeadStart  # what a check asks of the workers (its type lives with the checks)
from patchkit.transform.cache import Entry, TransformCache, cacheable
from patchkit.tree import sha256

# A file to prepare: its path (for messages), bytes, codemod refs grouped by
# patch, and the release's bytes of it (None: unknown; the vendor-code check).
Job = tuple[Path, bytes, Sequence[Sequence], Optional[bytes]]

# The jobs the forked workers compute, by index (set in the parent just before
# the pool forks; each worker has its own copy-on-write copy of them).
_JOBS: list[tuple[str, Job]] = []
# Work beside the transforms (``HeadStart``, and its side jobs once planned),
# inherited by the fork like the jobs.
_HEAD: Optional["HeadStart"] = None
_SIDE: list[Callable[[], object]] = []


def jobs_wanted() -> int:
    """Worker processes: ``PATCHKIT_JOBS``, else the CPUs this process may use."""
    from patchkit import settings

    configured = settings.jobs()
    if configured is not None:
        return configured
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def compute(rel: str, job: Job) -> Optional[Entry]:
    """Detection and transform of one file as the serial engine does them.
    None if anything fails (the serial path will raise the precise error)."""
    from patchkit import registry, transform
    from patchkit.errors import PatchkitError
    from patchkit.findings import State

    path, source, groups, pristine = job
    try:
        module = None

        def parsed():
            nonlocal module
            if module is None:
                codemods = [registry.load_codemod(r) for group in groups for r in group]
                module = transform.parse_for(rel, source, path, codemods, pristine)
            return module

        names = [[registry.codemod_name(r) for r in group] for group in groups]
        found = {
            registry.codemod_name(r): transform.detect(rel, source, parsed, registry.load_codemod(r))
            for group in groups
            for r in group
        }
        effective = [i for i, group in enumerate(names) if all(found[n].state is not State.MISSING for n in group)]
        entry = Entry(found, [names[i] for i in effective])
        if effective:
            refs = [r for i in effective for r in groups[i]]
            try:
                result = transform.run(
                    rel,
                    path,
                    parsed(),
                    [registry.load_codemod(r) for r in refs],
                    [found[registry.codemod_name(r)] for r in refs],
                    source,
                    pristine,
                )
            except PatchkitError:
                return entry  # no usable transform: the serial path raises it
            entry.new = result.new
            entry.after = dict(result.after)
            entry.transformed = tuple(result.transformed)
            entry.notes = tuple(result.notes)
        return entry
    except Exception:  # noqa: BLE001 - a worker never decides an error; the serial path does
        return None


def _work(index: int) -> Optional[Entry]:
    entry = compute(*_JOBS[index])
    if _HEAD is not None and _HEAD.after is not None and entry is not None and entry.new is not None:
        with contextlib.suppress(Exception):  # a head start never decides an error
            _HEAD.after(_JOBS[index][0], _JOBS[index][1][1], entry.new)
    return entry


def _side(index: int) -> object:
    return _SIDE[index]()


_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _block_signals() -> Optional[set]:
    """Block SIGINT and SIGTERM in this thread; the mask before (None where
    signals cannot be blocked: not the main thread, no pthread_sigmask)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        return None
    return signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)


def _restore_signals(mask: Optional[set]) -> None:
    if mask is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _worker_init(mask: Optional[set], gc_on: bool = False, parent: Optional[int] = None) -> None:
    """A worker dies with ``parent`` (``lifetimes.die_with_parent``: a
    ``kill -9`` of patchkit left its workers running), ignores SIGINT (a
    terminal's Ctrl-C reaches the whole process group; the parent decides
    and ends the workers) and dies on SIGTERM
    without Python (the parent's handlers must not run here), then takes the
    parent's signal mask back. The GC is off (a transform's nodes make no
    cycles) unless ``gc_on``."""
    if parent is not None:
        lifetimes.die_with_parent(parent)
    if not gc_on:
        gc.disable()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _restore_signals(mask)


@contextlib.contextmanager
def interruptible_pool(workers: int) -> Iterator:
    """A process pool (forked where that is safe) for work that forks pools of
    its own (the matrix: a release's apply). Each worker leads a process
    group (``_forked_pool``), so that ``_stop`` ends it with the workers it
    forked, at once, wherever it is (a native call runs no signal handler).
    When the block raises (Ctrl-C, SIGTERM, an error) the workers are ended
    that way, never waited for; else the pool shuts down as ``with
    ProcessPoolExecutor`` does."""
    import multiprocessing

    fork = "fork" in multiprocessing.get_all_start_methods() and sys.platform != "darwin"
    pools: list = []
    try:
        pool = _forked_pool(workers, pools, fork=fork, groups=True)
        yield pool
        pool.shutdown(wait=True)
    except BaseException:
        for pool in pools:
            _stop(pool)
        raise


def _forked_pool(workers: int, pools: list, fork: bool = True, groups: bool = False):
    """A pool of ``workers`` processes (forked unless ``fork`` is False),
    all started here and added to ``pools`` (what the caller ends when it is
    interrupted) before a signal can run a handler here: SIGINT and SIGTERM
    wait (blocked) until every worker has its own handlers (``_worker_init``),
    so a signal never runs the parent's handlers in a worker. ``groups``:
    each worker leads a process group, set here before it can fork (and its
    GC stays on: it runs job after job)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    blocked = _block_signals()
    try:
        pool = ProcessPoolExecutor(
            workers,
            mp_context=multiprocessing.get_context("fork") if fork else None,
            initializer=_worker_init,
            initargs=(blocked, groups, os.getpid()),
        )
        pools.append(pool)
        pool.submit(int)  # a forking pool starts all its workers on its first submit
        for pid in pool._processes if groups else ():
            with contextlib.suppress(OSError):  # a spawned worker that has exec'd keeps ours
                os.setpgid(pid, pid)
    finally:
        _restore_signals(blocked)  # a signal that waited is handled from here on
    return pool


def _end(process) -> None:
    """SIGKILL to the process group a worker leads (the worker and the
    workers it forked), else SIGTERM to the worker."""
    with contextlib.suppress(OSError):
        if os.getpgid(process.pid) == process.pid:
            os.killpg(process.pid, signal.SIGKILL)
            return
    with contextlib.suppress(Exception):
        process.terminate()


def _stop(pool) -> None:
    """End a pool's workers now (``_end``), SIGKILL to any still alive after
    a second; reap them all, so that nothing joins them at exit."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    # Its manager thread closes the pool's wake-up pipe when it ends; one still
    # ending at exit races concurrent.futures' atexit hook, which writes to that
    # pipe ("Exception ignored ... Bad file descriptor" on stderr). So it is
    # joined here too, once the workers are gone (shutdown forgets it).
    manager = getattr(pool, "_executor_manager_thread", None)
    results = getattr(pool, "_result_queue", None)  # shutdown forgets it too
    for process in processes:
        _end(process)
    with contextlib.suppress(Exception):
        pool.shutdown(wait=False, cancel_futures=True)
    deadline = time.monotonic() + 1.0
    for process in processes:
        with contextlib.suppress(Exception):
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join(1.0)
    # A worker killed while it sent a result left part of a message in the
    # result pipe: the manager thread's read waits for the rest while a writer
    # is open, and this process holds one. Closed, the read ends (EOF).
    with contextlib.suppress(Exception):
        if results is not None:
            results._writer.close()
    if manager is not None:
        with contextlib.suppress(Exception):
            manager.join(max(0.2, deadline + 0.5 - time.monotonic()))


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
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


# A progress callback: (files done, files to compute), called before the first
# file is computed and after each (never for what the cache had: a warm run
# shows no progress).
Progress = Callable[[int, int], None]


def prepare(
    jobs: Mapping[str, Job],
    cache: TransformCache,
    progress: Optional[Progress] = None,
    head_start: Optional[HeadStart] = None,
) -> dict[str, Entry]:
    """Entries for ``jobs`` (rel -> path, bytes, codemod refs grouped by
    patch): from the transform cache where it has them, else computed (in
    parallel when more than one file needs it). New results are stored in the
    cache. ``head_start``: later work the workers take on beside the files."""
    entries = prepare_all(list(jobs.items()), cache, progress, head_start)
    return {rel: entry for rel, entry in zip(jobs, entries) if entry is not None}


def prepare_all(
    jobs: Sequence[tuple[str, Job]],
    cache: TransformCache,
    progress: Optional[Progress] = None,
    head_start: Optional[HeadStart] = None,
) -> list[Optional[Entry]]:
    """``prepare`` for jobs that may name one file several times (``export``
    transforms each file's original with every prefix of the series): an
    entry, or None where the serial path must decide, per job, in order."""
    global _JOBS, _HEAD, _SIDE
    from patchkit import registry

    out: list[Optional[Entry]] = [None] * len(jobs)
    todo: list[tuple[int, Optional[str]]] = []
    for i, (_, (_, source, groups, pristine)) in enumerate(jobs):
        key = None
        if cache.enabled and cacheable([r for g in groups for r in g]):
            # The vendor-code check's verdict depends on the release's bytes too.
            digest = sha256(source) if pristine in (None, source) else f"{sha256(source)}+{sha256(pristine)}"
            key = cache.key(digest, [[registry.codemod_name(r) for r in g] for g in groups])
            out[i] = cache.get(key)
            if out[i] is not None:
                continue
        todo.append((i, key))
    if not todo:
        return out
    # Biggest files first: the pool ends when its longest file does.
    todo.sort(key=lambda job: -len(jobs[job[0]][1][1]))
    import multiprocessing

    workers = min(jobs_wanted(), len(todo))
    if multiprocessing.current_process().daemon:
        workers = 1  # a daemonic worker (e.g. of a multiprocessing.Pool) may not fork workers of its own
    if "fork" not in multiprocessing.get_all_start_methods() or sys.platform == "darwin":
        workers = 1  # workers inherit the jobs by fork; macOS's system libraries are not fork-safe
    results: dict[int, Optional[Entry]] = {}
    if progress is not None:
        progress(0, len(todo))

    def computed(i: int, entry: Optional[Entry]) -> None:
        results[i] = entry
        if progress is not None:
            progress(len(results), len(todo))

    if workers <= 1:
        with no_gc():
            for i, _ in todo:
                computed(i, compute(*jobs[i]))
    else:
        _JOBS, _HEAD, _SIDE = list(jobs), head_start, []
        if head_start is not None:
            with contextlib.suppress(Exception):  # a head start never decides an error
                _SIDE = list(head_start.side(frozenset(jobs[i][0] for i, _ in todo)))
        pools: list = []  # every pool started, ended at once on an interrupt
        try:
            side = []
            if _SIDE and multiprocessing.parent_process() is None:
                # The side work needs no libcst: its process, forked before
                # libcst is imported below, works while this one imports it.
                # (Not in a worker of a pool already, e.g. the matrix's: there
                # it queues behind the files, as the cores are taken.)
                side_pool = _forked_pool(1, pools)
                side = [side_pool.submit(_side, k) for k in range(len(_SIDE))]
            # Import what the workers need once, here, so every fork inherits it.
            for i, _ in todo:
                for group in jobs[i][1][2]:
                    for ref in group:
                        registry.load_codemod(ref)
            import libcst  # noqa: F401

            # What the parent holds stays out of every collection in the workers
            # (no copy-on-write of its pages for the GC's bookkeeping).
            gc.freeze()
            pool = _forked_pool(workers, pools)
            futures = {i: pool.submit(_work, i) for i, _ in todo}
            side = side or [pool.submit(_side, k) for k in range(len(_SIDE))]
            for i, future in futures.items():
                try:
                    entry = future.result()
                except Exception:  # noqa: BLE001 - a dead worker: compute it here
                    with no_gc():
                        entry = compute(*jobs[i])
                computed(i, entry)
            if head_start is not None:  # side work comes only with a head start
                for future in side:
                    with contextlib.suppress(Exception):  # a head start never decides an error
                        head_start.take(future.result())
            for each in pools:
                each.shutdown(wait=True)
        except BaseException:
            # Ctrl-C, SIGTERM or an error: the workers are ended now, never
            # waited for (their results are only ever a cache of the serial path's).
            for each in pools:
                _stop(each)
            raise
        finally:
            _JOBS, _HEAD, _SIDE = [], None, []
            gc.unfreeze()
    for i, key in todo:
        entry = out[i] = results.get(i)
        if entry is not None and key is not None:
            cache.put(key, entry)
    return out
