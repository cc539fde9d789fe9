"""Acme's runtime helper, which the patched sglang code calls. patchkit copies
it into the tree as sglang.srt._patchkit.acme_runtime (or, in package mode,
imports it from this installed package): standard library only."""


def decode_q_needs_reshape(q) -> bool:
    """torch.compile's rotary_emb may hand decode a 3-D q; a 2-D q is in shape."""
    return q.dim() != 2
