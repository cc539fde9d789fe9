"""Which verify tree mask each spec-v2 draft step used (issue 44's eager batch).

fa3-spec-v2 / flashmla-spec-v2 preallocate the verify tree mask for the captured
batch size and hand it over only to a batch it fits
(``backends.verify_tree_mask.verify_tree_mask_for_batch``); a batch above
``cuda_graph_max_bs`` gets None and the tree build allocates a mask of its own.
This wraps that helper in the patched tree (vendored as
``sglang.srt._patchkit.backends.verify_tree_mask``) and counts, per call with a
buffer offered, whether the preallocated one was handed over or the per-batch one
taken: the counts travel in the sync dumps as ``call`` keys (:func:`per_batch`,
:func:`preallocated` read them). Pristine trees have no such helper: no counts.
Nothing here reads a CUDA tensor's value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import syncs

MODULE = "sglang.srt._patchkit.backends.verify_tree_mask"
HELPER = "verify_tree_mask_for_batch"
PREALLOCATED = "tree_mask_preallocated"
PER_BATCH = "tree_mask_per_batch"


def install() -> None:
    syncs.on_import(MODULE, wrap)


def wrap(module: Any) -> None:
    original = getattr(module, HELPER, None)
    if original is None or getattr(original, "__pk_e2e_wrapped__", False):
        return

    def probed(tree_mask_buf, *args, **kwargs):
        out = original(tree_mask_buf, *args, **kwargs)
        if tree_mask_buf is not None:
            syncs._bump(f"call|pk_probe.{PREALLOCATED if out is not None else PER_BATCH}")
        return out

    probed.__pk_e2e_wrapped__ = True  # type: ignore[attr-defined]
    probed.__name__, probed.__qualname__ = original.__name__, original.__qualname__
    setattr(module, HELPER, probed)


def counts(table: Mapping[str, int]) -> dict:
    """``{"preallocated": n, "per_batch": m}`` of one sync-table delta."""
    return {"preallocated": syncs.calls_of(table, PREALLOCATED), "per_batch": syncs.calls_of(table, PER_BATCH)}
