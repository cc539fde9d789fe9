"""A value by meaning (issue 45 §2): ``primitives.sum_of`` / ``peel`` through
each spelling vendors use, and flashmla-spec-v2's forward_extend anchor
(the fixed-q kernel's verify lengths) before/after in each spelling."""

from __future__ import annotations

import pytest

CALL = "fixed_q_cache_seqlens(forward_batch, self.forward_metadata, self.num_draft_tokens)"


@pytest.mark.trees
def test_a_fork_spelling_the_lengths_with_a_slice_and_a_cast_applies(make_tree, cli):
    """The fork family of issue 45: forward_extend's fixed-q lengths as a slice
    of the batch and a cast before the draft tokens are added. flashmla-spec-v2
    finds its anchor; the vendor-code check passes (the slice is kept)."""
    from support import patch_states

    tree = make_tree("0.5.12.post1")
    path = tree / "srt/layers/attention/flashmla_backend.py"
    text = path.read_text()
    old = "cache_seqlens=forward_batch.seq_lens.to(torch.int32)\n                    + self.num_draft_tokens,"
    assert text.count(old) == 2
    path.write_text(
        text.replace(
            old, "cache_seqlens=(forward_batch.seq_lens[:bs].int()\n                    + self.num_draft_tokens),"
        )
    )
    result = cli("apply", tree, "flashmla-spec-v2")
    assert result.exit_code == 0, result.output
    assert patch_states(cli, tree, "flashmla-spec-v2")["flashmla-spec-v2"]["state"] == "applied"
    assert path.read_text().count(f"cache_seqlens={CALL}[:bs],") == 2
