"""Snippet tests of tests/trees/test_primitives_values.py (no release read; the quick loop runs them)."""

from __future__ import annotations

import libcst as cst
import pytest

from patchkit.codemods import flashmla_spec_v2 as fm
from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import State
from patchkit.testing import apply, detect

SEQ_LENS = primitives.attr("seq_lens")


DRAFT = primitives.attr("num_draft_tokens")


# spelling -> (the function's body before the value, the value)
SPELLINGS = {
    "plain": ("", "forward_batch.seq_lens + self.num_draft_tokens"),
    "cast": ("", "forward_batch.seq_lens.to(torch.int32) + self.num_draft_tokens"),
    "int-cast": ("", "forward_batch.seq_lens.int() + self.num_draft_tokens"),
    "operand-order": ("", "self.num_draft_tokens + forward_batch.seq_lens.to(torch.int32)"),
    "parentheses": ("", "((forward_batch.seq_lens).to(torch.int32) + (self.num_draft_tokens))"),
    "batch-slice": ("", "forward_batch.seq_lens[:bs].to(torch.int32) + self.num_draft_tokens"),
    "slice-of-sum": ("", "(forward_batch.seq_lens + self.num_draft_tokens)[:bs]"),
    "temporary": ("lens = forward_batch.seq_lens[:bs].int()\n    ", "lens + self.num_draft_tokens"),
    "torch-add": ("", "torch.add(self.num_draft_tokens, forward_batch.seq_lens.int())"),
}


def function(body: str, value: str) -> cst.FunctionDef:
    return cst.parse_module(f"def f(self, forward_batch, bs):\n    {body}x = {value}\n").body[0]


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_sum_of_recognises_each_spelling(spelling):
    fn = function(*SPELLINGS[spelling])
    value = fn.body.body[-1].body[0].value
    found = primitives.sum_of(value, SEQ_LENS, DRAFT, primitives.Locals(fn))
    assert found is not None
    assert cst.Module([]).code_for_node(found.first) == "forward_batch.seq_lens"
    assert cst.Module([]).code_for_node(found.second).strip("()") == "self.num_draft_tokens"  # as written
    assert (found.bound is not None) == ("slice" in spelling or spelling == "temporary")


@pytest.mark.parametrize(
    "value",
    [
        "forward_batch.seq_lens - self.num_draft_tokens",  # another operation
        "forward_batch.seq_lens[1:] + self.num_draft_tokens",  # not a prefix of the batch
        "forward_batch.seq_lens[::2] + self.num_draft_tokens",
        "forward_batch.extend_seq_lens + self.num_draft_tokens",  # another value
        "forward_batch.seq_lens + self.topk",
    ],
)
def test_sum_of_refuses_other_values(value):
    fn = function("", value)
    assert primitives.sum_of(fn.body.body[-1].body[0].value, SEQ_LENS, DRAFT, primitives.Locals(fn)) is None


def test_peel_keeps_the_bound():
    peeled = primitives.peel(cst.parse_expression("(x[:bs]).to(torch.int32)"))
    assert cst.Module([]).code_for_node(peeled.value) == "x"
    assert cst.Module([]).code_for_node(peeled.bound) == "bs"


FORWARD_EXTEND = """
class FlashMLABackend(FlashInferMLAAttnBackend):
    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        if forward_batch.forward_mode == ForwardMode.EXTEND:
            return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache)
        bs = forward_batch.batch_size
        {body}o, _ = flash_mla_with_kvcache(q=q, cache_seqlens={value})
        return o
"""


CALL = "fixed_q_cache_seqlens(forward_batch, self.forward_metadata, self.num_draft_tokens)"


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_forward_extend_anchor_in_each_spelling(spelling):
    body, value = SPELLINGS[spelling]
    body = body.replace("\n    ", "\n        ")
    src = FORWARD_EXTEND.format(body=body, value=value)
    assert detect(fm.ForwardExtendFixedQDraftExtend, src).state is State.TODO
    out = apply(fm.ForwardExtendFixedQDraftExtend, src)
    sliced = "slice" in spelling or spelling == "temporary"
    want = CALL + ("[:bs]" if sliced else "")
    if spelling == "parentheses":  # the draft count as the vendor wrote it
        want = want.replace("self.num_draft_tokens", "(self.num_draft_tokens)")
    assert f"cache_seqlens={want})" in out, out
    assert detect(fm.ForwardExtendFixedQDraftExtend, out).state is State.DONE
