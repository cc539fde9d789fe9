"""Names 0.5.9 imports from ``sgl_kernel`` that the image's build no longer has (issue 43).

0.5.9 pins sgl-kernel 0.3.21, built for torch 2.9.1, which the GPU image lacks; the
bundle gives it sglang-kernel 0.4.2.post2 (the same ``sgl_kernel`` module, built for the
image's torch 2.11). Its first run stopped at import: ``from sgl_kernel import
awq_dequantize, awq_marlin_moe_repack, awq_marlin_repack`` in the AWQ quantization
module, which every model config imports, although an unquantized Llama never calls it.

Where ``PK_E2E_KERNEL_GAPS`` is set (``wheels.RELEASE_ENV`` sets it for 0.5.9 only),
``sgl_kernel`` answers a name it lacks with a stand-in that raises when called, naming
itself: an import-only gap lets the engine start, and a gap on the served path stops the
run with that name rather than passing silently. A submodule not imported yet is
imported, not stood in for (``from sgl_kernel import flash_ops`` loads FA3's ops). Each name asked for, and each one
called, is noted in the process's sync dump (``kernel_gaps``, ``kernel_gaps_called``), so
the report says which gaps the run met.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from . import syncs

ENV = "PK_E2E_KERNEL_GAPS"
MODULE = "sgl_kernel"
_asked: set[str] = set()
_called: set[str] = set()


class KernelGap(RuntimeError):
    pass


def stand_in(name: str, version: str):
    """A function named ``name`` that raises when called, after noting the call."""

    def missing(*args: Any, **kwargs: Any):
        _called.add(name)
        syncs.note("kernel_gaps_called", sorted(_called))
        raise KernelGap(
            f"sgl_kernel.{name} is not in sglang-kernel {version} (the stand-in "
            f"for this release's own sgl-kernel build); the served path called it"
        )

    missing.__name__ = missing.__qualname__ = name
    return missing


def fill(module: Any) -> None:
    """Give ``module`` a module-level ``__getattr__`` (PEP 562) for names it lacks."""
    version = getattr(module, "__version__", "?")

    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if hasattr(module, "__path__"):  # a package: a submodule not imported yet is no gap
            try:  # (`from sgl_kernel import flash_ops` loads FA3's ops)
                return importlib.import_module(f"{module.__name__}.{name}")
            except ModuleNotFoundError as exc:
                if exc.name != f"{module.__name__}.{name}":
                    raise
        _asked.add(name)
        syncs.note("kernel_gaps", sorted(_asked))
        return stand_in(name, version)

    module.__getattr__ = __getattr__


def install() -> None:
    if os.environ.get(ENV):
        syncs.on_import(MODULE, fill)


def met(dumps: Any) -> dict:
    """Which stand-ins a run's processes were asked for, and which they called, over
    every process's dump (the run's record keeps them: ``runner.py``)."""
    seen: dict = {"asked": set(), "called": set()}
    for dump in dumps:
        notes = dump.get("notes") or {}
        seen["asked"].update(notes.get("kernel_gaps") or ())
        seen["called"].update(notes.get("kernel_gaps_called") or ())
    return {key: sorted(names) for key, names in seen.items()}
