"""Count host syncs on CUDA tensors, by sglang call site, in every process.

Installed from the bundle's ``sitecustomize.py`` when ``PK_E2E_SYNC_DIR`` is set, so
it runs in the engine's own process and in every process sglang spawns (scheduler,
detokenizer): each is a fresh interpreter that reads the same environment.

What is counted: ``torch.Tensor.cpu()``, ``.item()`` and ``.tolist()`` called on a
tensor whose ``is_cuda`` is true (each one blocks the host until the device has
produced the value). Also counted, as kind ``wait``: ``torch.cuda.Event.synchronize``,
``torch.cuda.Stream.synchronize`` and ``torch.cuda.synchronize`` (a host wait on the
device that moves no data; the spec-v2 overlap scheduler of 0.5.12 waits on its
verify-done event each decode step, 0.5.13 no longer does). Each call is attributed to the innermost frame whose file lies in
an ``sglang/`` package folder or in ``patchkit/runtime`` / ``patchkit/backends``
(``sglang/srt/speculative/eagle_info_v2.py:prepare_for_decode:174``); calls with no
such frame are kept under ``<other>:<file>:<function>:<line>`` of the caller.

Also counted: calls of a few sglang functions (``CALL_PROBES``), so that a sync count
can be divided by the number of decode steps.

Other modules of this package hook in two ways: :func:`on_import` runs a function on
a module as soon as it is imported in this process (the probes use it too), and
:func:`note` adds a value to this process's dump (:mod:`.ranks` notes the TP rank
and the ``needs_cpu_seq_lens`` decision there).

Each process rewrites ``<dir>/syncs-<pid>.json`` (atomically) whenever its counts
changed, at most every ``PK_E2E_SYNC_FLUSH_S`` seconds (default 0.2), and at exit:
sglang ends its children with SIGKILL, so an exit hook alone would lose them. A
reader takes snapshots before and after a phase and subtracts (:func:`delta`).

Pure functions (:func:`site_of_filename`, :func:`aggregate`, :func:`delta`) are
unit-tested on CPU; :func:`install` needs torch.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.util
import json
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, Optional

from . import engine_env, host_waits

ENV_DIR = "PK_E2E_SYNC_DIR"
ENV_FLUSH = "PK_E2E_SYNC_FLUSH_S"
#: Set (to anything): no wrappers and no sync debug mode; the dump keeps its notes (rank,
#: settings), so a run times the trees without the instrument's own host cost (issue 57).
ENV_COUNTERS_OFF = "PK_E2E_COUNTERS_OFF"
#: Tensor reads that copy to the host, then "wait": a host wait on the device
#: (``torch.cuda.Event.synchronize``, ``Stream.synchronize``,
#: ``torch.cuda.synchronize``), which blocks as a copy does without moving data.
TENSOR_KINDS = ("cpu", "item", "tolist")
WAIT = "wait"
#: The wrapper counter's kinds (the cross-check since issue 53).
WRAPPER_KINDS = TENSOR_KINDS + (WAIT,)
#: Every kind a sync table keeps: the wrapper's and torch's own (host_waits.py).
KINDS = WRAPPER_KINDS + host_waits.KINDS

#: module -> (class or None, function): calls counted under "call" keys.
CALL_PROBES = {
    "sglang.srt.speculative.eagle_info_v2": ("EagleDraftInputV2Mixin", "prepare_for_decode"),
}

_lock = threading.Lock()
_local = threading.local()
_counts: Counter = Counter()
_notes: dict = {}
#: module name -> functions run on the module right after it is imported
_after_import: dict[str, list] = {}
_version = 0
_written = -1
_dir: Optional[str] = None
_installed = False


def site_of_filename(filename: str) -> Optional[str]:
    """``.../sglang/srt/x.py`` -> ``sglang/srt/x.py``; patchkit runtime likewise; else None."""
    path = filename.replace("\\", "/")
    for marker, keep in (("/patchkit/runtime/", "patchkit/runtime/"), ("/patchkit/backends/", "patchkit/backends/")):
        i = path.rfind(marker)
        if i >= 0:
            return keep + path[i + len(marker) :]
    i = path.rfind("/sglang/")
    if i >= 0:
        return "sglang/" + path[i + len("/sglang/") :]
    return None


def attribute(frame: Any) -> str:
    """Site key of the innermost sglang/patchkit-runtime frame at or above ``frame``."""
    first = frame
    while frame is not None:
        rel = site_of_filename(frame.f_code.co_filename)
        if rel is not None:
            return f"{rel}:{frame.f_code.co_name}:{frame.f_lineno}"
        frame = frame.f_back
    if first is None:
        return "<other>:?"
    return f"<other>:{first.f_code.co_filename}:{first.f_code.co_name}:{first.f_lineno}"


def _bump(key: str) -> None:
    global _version
    with _lock:
        _counts[key] += 1
        _version += 1


#: For other modules' probes (worker_steps.py): count one call under ``key``.
bump = _bump


def _count_at(kind: str, frame: Any) -> None:
    _bump(f"{kind}|{attribute(frame)}")


def _wrap_tensor_method(torch: Any, kind: str) -> None:
    original = getattr(torch.Tensor, kind)
    if getattr(original, "__pk_e2e_wrapped__", False):
        return

    def counted(self, *args, **kwargs):
        # A tensor subclass's __torch_function__ re-enters the (wrapped) method: count
        # the outermost call only.
        if getattr(_local, "inside", False):
            return original(self, *args, **kwargs)
        if self.is_cuda:
            _bump(f"{kind}|{attribute(sys._getframe(1))}")
        _local.inside = True
        try:
            return original(self, *args, **kwargs)
        finally:
            _local.inside = False

    counted.__pk_e2e_wrapped__ = True  # type: ignore[attr-defined]
    counted.__name__ = original.__name__
    counted.__doc__ = original.__doc__
    setattr(torch.Tensor, kind, counted)


def _counted_wait(original: Any) -> Any:
    if getattr(original, "__pk_e2e_wrapped__", False):
        return original

    def waited(*args, **kwargs):
        _bump(f"{WAIT}|{attribute(sys._getframe(1))}")
        return original(*args, **kwargs)

    waited.__pk_e2e_wrapped__ = True  # type: ignore[attr-defined]
    waited.__name__ = getattr(original, "__name__", "synchronize")
    waited.__doc__ = getattr(original, "__doc__", None)
    return waited


def _wrap_waits(torch: Any) -> None:
    """Count host waits on the device: every call blocks until the device reached
    that point (sglang's overlap scheduler waits on its verify-done event so)."""
    cuda = getattr(torch, "cuda", None)
    if cuda is None:
        return
    for cls_name in ("Event", "Stream"):
        cls = getattr(cuda, cls_name, None)
        if cls is not None and hasattr(cls, "synchronize"):
            cls.synchronize = _counted_wait(cls.synchronize)
    if hasattr(cuda, "synchronize"):
        cuda.synchronize = _counted_wait(cuda.synchronize)


def _wrap_call_probe(module: Any, owner: Optional[str], func: str) -> None:
    target = getattr(module, owner) if owner else module
    original = getattr(target, func)
    if getattr(original, "__pk_e2e_wrapped__", False):
        return
    key = f"call|{module.__name__}:{(owner + '.') if owner else ''}{func}"

    def probed(*args, **kwargs):
        _bump(key)
        return original(*args, **kwargs)

    probed.__pk_e2e_wrapped__ = True  # type: ignore[attr-defined]
    probed.__name__ = original.__name__
    probed.__qualname__ = getattr(original, "__qualname__", func)
    setattr(target, func, probed)


def on_import(name: str, hook: Any) -> None:
    """Run ``hook(module)`` once module ``name`` is imported in this process (at
    once when it already is). The hook must not raise into the import."""
    _after_import.setdefault(name, []).append(hook)
    if name in sys.modules:
        _run_hook(hook, sys.modules[name])


def _run_hook(hook: Any, module: Any) -> None:
    try:
        hook(module)
    except Exception as exc:  # noqa: BLE001  never break sglang's own import
        print(f"[pk_gpu_e2e] hook on {module.__name__} failed: {exc!r}", file=sys.stderr)


def note(key: str, value: Any) -> None:
    """Put ``key: value`` (JSON-able) in this process's dump, under ``notes``."""
    global _version
    with _lock:
        _notes[key] = value
        _version += 1


class _ProbeLoader(importlib.abc.Loader):
    def __init__(self, inner: Any, hooks: list):
        self.inner = inner
        self.hooks = hooks

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        for hook in list(self.hooks):
            _run_hook(hook, module)

    def __getattr__(self, name):  # get_code, get_source, is_package, ...
        return getattr(self.inner, name)


class _ProbeFinder(importlib.abc.MetaPathFinder):
    """Wraps the loader of the hooked modules, whichever tree they come from."""

    def find_spec(self, fullname, path=None, target=None):
        hooks = _after_import.get(fullname)
        if not hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _ProbeLoader(spec.loader, hooks)
                return spec
        return None


def snapshot() -> dict:
    with _lock:
        return {
            "pid": os.getpid(),
            "argv": list(sys.argv[:3]),
            "time": time.time(),
            "counts": dict(_counts),
            "notes": dict(_notes),
        }


def flush(force: bool = False) -> None:
    global _written
    if _dir is None:
        return
    with _lock:
        version = _version
    if version == _written and not force:
        return
    data = snapshot()
    path = os.path.join(_dir, f"syncs-{os.getpid()}.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh, sort_keys=True)
    os.replace(tmp, path)
    _written = version


def _flusher(period: float) -> None:
    while True:
        time.sleep(period)
        try:
            flush()
        except Exception:  # noqa: BLE001  never disturb the process being measured
            pass


def _count_in(torch: Any) -> None:
    for kind in TENSOR_KINDS:
        _wrap_tensor_method(torch, kind)
    _wrap_waits(torch)
    # torch's own count of host waits and the pageable-copy check (issue 53)
    note("sync_debug_armed", host_waits.install(torch, _count_at))
    sys.meta_path.insert(0, _ProbeFinder())
    for name, probe in CALL_PROBES.items():
        on_import(name, lambda module, probe=probe: _wrap_call_probe(module, *probe))


def install(directory: Optional[str] = None) -> bool:
    """Wrap the tensor methods and the probes in this process; start the flusher."""
    global _dir, _installed
    directory = directory or os.environ.get(ENV_DIR)
    if not directory or _installed:
        return False
    import torch

    os.makedirs(directory, exist_ok=True)
    _dir = directory
    counting = not os.environ.get(ENV_COUNTERS_OFF)
    note("counters", counting)
    engine_env.note_in_process(note)  # --engine-env: what this process sees (issue 67)
    if counting:
        _count_in(torch)
    period = float(os.environ.get(ENV_FLUSH, "0.2"))
    threading.Thread(target=_flusher, args=(period,), daemon=True, name="pk-e2e-sync-flush").start()
    atexit.register(flush, True)
    _installed = True
    return True


# ----------------------------------------------------------------- reading side


def read_dir(directory: str) -> list[dict]:
    """Every process's latest dump in ``directory``."""
    out: list[dict] = []
    if not os.path.isdir(directory):
        return out
    for name in sorted(os.listdir(directory)):
        if name.startswith("syncs-") and name.endswith(".json"):
            try:
                with open(os.path.join(directory, name)) as fh:
                    out.append(json.load(fh))
            except (OSError, ValueError):
                continue  # being replaced right now: os.replace makes that rare
    return out


def aggregate(dumps: Iterable[Mapping]) -> dict[str, int]:
    """Sum the per-process tables: ``{"kind|site": n}`` over all processes."""
    total: Counter = Counter()
    for dump in dumps:
        total.update({k: int(v) for k, v in dump.get("counts", {}).items()})
    return dict(total)


def delta(after: Mapping[str, int], before: Mapping[str, int]) -> dict[str, int]:
    """Counts that happened between two aggregates (zero entries dropped)."""
    out = {}
    for key, n in after.items():
        d = int(n) - int(before.get(key, 0))
        if d:
            out[key] = d
    return out


def split_key(key: str) -> tuple[str, str]:
    kind, _, site = key.partition("|")
    return kind, site


def syncs_only(table: Mapping[str, int]) -> dict[str, int]:
    """Both counters' entries (no probe calls)."""
    return {k: v for k, v in table.items() if split_key(k)[0] in KINDS}


def wrapper_only(table: Mapping[str, int]) -> dict[str, int]:
    """The wrapper counter's entries (``.cpu/.item/.tolist``, waits): the cross-check."""
    return {k: v for k, v in table.items() if split_key(k)[0] in WRAPPER_KINDS}


def calls_of(table: Mapping[str, int], func: str) -> int:
    """Number of counted calls of a probed function (matched by its name)."""
    return sum(v for k, v in table.items() if split_key(k)[0] == "call" and split_key(k)[1].endswith("." + func))


def site_function(site: str) -> str:
    """``path:function:line`` -> ``path:function`` (lines differ between trees)."""
    parts = site.rsplit(":", 1)
    return parts[0] if len(parts) == 2 and parts[1].isdigit() else site
