"""TRT-LLM MHA backend helpers called by patched sglang code (sglang #25002).

``TRTLLMHAAttnBackend.init_forward_metadata_replay_cuda_graph`` (0.5.10 -
0.5.12.post1; ``_apply_cuda_graph_metadata`` from 0.5.13 on) fills the
draft-extend metadata of a captured CUDA graph before it is replayed. Upstream
gave DRAFT_EXTEND_V2 its own semantics there: every request contributes the
same number of query tokens (``spec_info.num_tokens_per_req``, the graph's fixed
stride), so ``max_seq_len_q`` is that stride and ``cu_seqlens_q`` is the
arithmetic progression ``0, s, 2s, ..., bs*s``. V1 (DRAFT_EXTEND) keeps its
variable-length ``cumsum(num_accept_tokens)`` path; patched code only calls in
here for V2.

CUDA-graph safety:

* ``cu_seqlens_q`` is the graph's preallocated buffer (captured kernels read
  it by address): it is written in place with ``torch.arange(..., out=view)``
  on a view of it. No new tensor is allocated, so the fill may also run while a
  graph is being captured.
* No host sync. ``num_tokens_per_req`` is a plain Python ``int`` on the spec
  inputs of these releases (``EagleDraftInput`` / ``EagleDraftExtendInput``
  dataclass field, ``-1`` until the worker sets it), so reading it costs
  nothing. Only when it is unset (``<= 0``: the synthetic input built for
  capture) does upstream fall back to the max of ``num_accept_tokens[:bs]``
  with ``.item()``; here the fallback first looks for that max on the host
  (``num_accept_tokens_cpu``, a CPU tensor) and then uses the stride the capture
  recorded in ``metadata.max_seq_len_q`` (``num_tokens // bs``: the synthetic
  ``num_accept_tokens`` buffer is filled with exactly that value, so it *is* the
  max), and reads the device tensor only as a last resort outside capture.

Standard library only at import time; torch is imported lazily.
"""

from __future__ import annotations

import numbers
# Imported by patched sglang at start-up: the typing names are for type
# checkers only (annotations are strings here).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional

__all__ = [
    "draft_extend_v2_stride",
    "fill_draft_extend_v2_cu_seqlens_q",
    "fill_strided_cu_seqlens",
]


# Accepted tokens per request on the spec input, by release, with the host
# mirror that counts the same thing: 0.5.12+ ``num_accept_tokens``, 0.5.11
# ``num_accepted_tokens``, 0.5.10 ``accept_length`` (its ``accept_length_cpu``
# counts accepted *drafts*, one less, so it is not used).
ACCEPTED = (
    ("num_accept_tokens", "num_accept_tokens_cpu"),
    ("num_accepted_tokens", "num_accepted_tokens_cpu"),
    ("accept_length", None),
)


def _positive_int(value: Any) -> Optional[int]:
    """``value`` as an int when it is a host-side positive integer, else None.

    Tensors are never read here (that could sync with the device)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):  # int, numpy ints
        return None
    return int(value) if int(value) > 0 else None


def _host_max(values: Any, bs: int) -> Optional[int]:
    """max(values[:bs]) if ``values`` lives on the host (list, tuple, CPU
    tensor), else None. Never touches a device tensor."""
    if values is None:
        return None
    if isinstance(values, (list, tuple)):
        head = [int(v) for v in values[:bs]]
        return max(head) if head else None
    device = getattr(values, "device", None)
    if device is not None and getattr(device, "type", None) == "cpu":
        head = values[:bs]
        if head.numel() == 0:
            return None
        return int(head.max())
    return None


def draft_extend_v2_stride(spec_info: Any, bs: int, capture_stride: Optional[int] = None) -> int:
    """The fixed per-request query width of a DRAFT_EXTEND_V2 batch.

    ``spec_info.num_tokens_per_req`` when it is set (> 0). Otherwise (capture,
    with a synthetic spec input) the max of ``num_accept_tokens[:bs]``, taken
    from a host copy when there is one, else ``capture_stride`` (the stride the
    captured graph was built for, which equals that max during capture). A
    device tensor is read (one host sync) only when none of these exists and
    no graph is being captured.
    """
    stride = _positive_int(getattr(spec_info, "num_tokens_per_req", None))
    if stride is not None:
        return stride
    accepted = next((getattr(spec_info, f) for f, _ in ACCEPTED if getattr(spec_info, f, None) is not None), None)
    for host in [getattr(spec_info, cpu, None) for f, cpu in ACCEPTED if cpu] + [accepted]:
        found = _host_max(host, bs)
        if found is not None and found > 0:
            return found
    hint = _positive_int(capture_stride)
    if hint is not None:
        return hint
    if accepted is None:
        raise ValueError(
            "DRAFT_EXTEND_V2: spec_info.num_tokens_per_req is unset and there is no "
            "num_accept_tokens to infer the per-request stride from"
        )
    import torch

    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            "DRAFT_EXTEND_V2: cannot infer the per-request stride while capturing a CUDA "
            "graph (num_tokens_per_req is unset and only a device num_accept_tokens exists); "
            "set spec_info.num_tokens_per_req or pass capture_stride"
        )
    found = int(accepted[:bs].max().item())  # host sync: last resort, upstream's fallback
    if found <= 0:
        raise ValueError(f"DRAFT_EXTEND_V2: per-request stride must be positive, got {found}")
    return found


def fill_strided_cu_seqlens(cu_seqlens: Any, bs: int, stride: int) -> Any:
    """Write ``0, stride, 2*stride, ..., bs*stride`` into ``cu_seqlens[: bs + 1]``
    in place (int32 buffer, any device). Returns the buffer."""
    import torch

    if stride <= 0:
        raise ValueError(f"stride must be positive, got {stride}")
    if bs < 0 or cu_seqlens.dim() != 1 or cu_seqlens.numel() < bs + 1:
        raise ValueError(f"cu_seqlens must be 1-D with at least bs + 1 = {bs + 1} elements, got shape {tuple(cu_seqlens.shape)}")
    if cu_seqlens.dtype != torch.int32:
        raise TypeError(f"cu_seqlens must be int32, got {cu_seqlens.dtype}")
    cu_seqlens[:1].zero_()
    if bs:
        # arange's out= writes into the view (same size: no resize, no new storage).
        torch.arange(
            stride,
            bs * stride + 1,
            stride,
            dtype=torch.int32,
            device=cu_seqlens.device,
            out=cu_seqlens[1 : bs + 1],
        )
    return cu_seqlens


def fill_draft_extend_v2_cu_seqlens_q(metadata: Any, spec_info: Any, bs: int) -> int:
    """DRAFT_EXTEND_V2 replay metadata: fixed stride for every request.

    Sets ``metadata.max_seq_len_q`` to the stride and fills
    ``metadata.cu_seqlens_q[: bs + 1]`` in place with ``0, s, ..., bs*s``.
    The capture recorded its stride in ``metadata.max_seq_len_q``; it is the
    fallback when ``spec_info.num_tokens_per_req`` is unset. Returns the stride.
    """
    stride = draft_extend_v2_stride(spec_info, bs, capture_stride=getattr(metadata, "max_seq_len_q", None))
    fill_strided_cu_seqlens(metadata.cu_seqlens_q, bs, stride)
    metadata.max_seq_len_q = stride
    return stride
