"""Copying a CUDA-graph runner's inputs into its static buffers in groups (sglang #28465).

The EAGLE draft and draft-extend CUDA-graph runners copy each input field into
its static buffer with ``buffer[:n].copy_(src)`` before every replay: one
``cudaMemcpyAsync`` a field, about thirteen a spec-v2 decode step. Upstream
0.5.14 (sglang #28465, unchanged in that respect through 0.5.23) hands them to
one ``torch._foreach_copy_`` per dtype pair instead: a few kernels replace the
memcpys. ``hidden_states`` stays a plain ``copy_`` there (large: the copy
engine beats the foreach kernel), and so it does in patched trees.

Imported by patched sglang code: standard library only at import time; torch
is imported inside the function.
"""

from __future__ import annotations

# Imported by patched sglang at start-up: typing names are for type checkers only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

__all__ = ["copy_grouped"]


def copy_grouped(pairs: Iterable[tuple[Any, Any]]) -> None:
    """``dst.copy_(src)`` for every ``(dst, src)`` pair, as one
    ``torch._foreach_copy_`` per group of pairs sharing dtypes and devices (a
    foreach call takes one dtype and one device a list; upstream groups by the
    dtype pair alone), a group of one pair included, as upstream. A torch
    without ``_foreach_copy_`` copies with ``copy_``, as upstream does. Where
    torch's foreach kernel cannot take a group (sizes or strides that differ,
    CPU tensors), it copies pair by pair itself: every pair is copied in any
    case."""
    import torch

    foreach_copy = getattr(torch, "_foreach_copy_", None)
    groups: dict[tuple, tuple[list, list]] = {}
    for dst, src in pairs:
        dsts, srcs = groups.setdefault((dst.dtype, src.dtype, dst.device, src.device), ([], []))
        dsts.append(dst)
        srcs.append(src)
    for dsts, srcs in groups.values():
        if foreach_copy is None:
            for dst, src in zip(dsts, srcs):
                dst.copy_(src)
        else:
            foreach_copy(dsts, srcs)
