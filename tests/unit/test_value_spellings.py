"""Equivalent spellings are the same anchor (issue 45 §2), for the shared
codemods that anchor on a value: ``primitives.spelled`` / ``host_scalar``
(the value as a matcher, its captures kept) on their own, then each family
before/after in each spelling a vendor may use: the host max of the mirror
(FA3's and TRT-LLM MHA's eager and replay reads, FlashMLA's), the batch's
total length (the decode metrics), the seq_lens copy to the host (the
spec-v2 decode sync) and the kv-indices size (Triton)."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m
import pytest

from patchkit.codemods import fa3_spec_v2 as fa3
from patchkit.codemods import needs_cpu_seq_lens_guards as guards
from patchkit.codemods import needs_cpu_seq_lens_sync as sync
from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import State
from patchkit.testing import apply, detect

code_of = cst.Module([]).code_for_node
MIRROR = primitives.save(primitives.attr("seq_lens_cpu", m.Name("forward_batch")), "M")


# -- the primitive ------------------------------------------------------------------------------

# spelling -> the host max of forward_batch.seq_lens_cpu
MAX_SPELLINGS = {
    "item": "forward_batch.seq_lens_cpu.max().item()",
    "int": "int(forward_batch.seq_lens_cpu.max())",
    "torch-max": "torch.max(forward_batch.seq_lens_cpu).item()",
    "cast-receiver": "forward_batch.seq_lens_cpu.to(torch.int64).max().item()",
    "int-cast-receiver": "forward_batch.seq_lens_cpu.int().max().item()",
    "cast-max": "forward_batch.seq_lens_cpu.max().int().item()",
    "parentheses": "((forward_batch.seq_lens_cpu).max()).item()",
    "batch-slice": "forward_batch.seq_lens_cpu[:bs].max().item()",
}


@pytest.mark.parametrize("spelling", sorted(MAX_SPELLINGS))
def test_host_scalar_captures_the_value_in_each_spelling(spelling):
    found = m.extract(cst.parse_expression(MAX_SPELLINGS[spelling]), primitives.host_scalar("max", MIRROR))
    assert found is not None and code_of(found["M"]).strip("()") == "forward_batch.seq_lens_cpu"


def test_host_scalar_without_slices_leaves_the_rows_max_alone():
    assert (
        m.extract(
            cst.parse_expression(MAX_SPELLINGS["batch-slice"]), primitives.host_scalar("max", MIRROR, slices=False)
        )
        is None
    )


@pytest.mark.parametrize(
    "other",
    [
        "forward_batch.seq_lens_cpu.sum().item()",  # another reduction
        "forward_batch.seq_lens.max().item()",  # another value
        "forward_batch.seq_lens_cpu[1:].max().item()",  # not the batch's rows
        "forward_batch.seq_lens_cpu.max()",  # not read to the host
    ],
)
def test_host_scalar_refuses_other_values(other):
    assert m.extract(cst.parse_expression(other), primitives.host_scalar("max", MIRROR)) is None


@pytest.mark.parametrize(
    "src", ["x", "x.int()", "int(x)", "x.to(torch.int32)", "(x)[:bs]", "x[:bs].long()", "torch.as_tensor(x, device=d)"]
)
def test_spelled_captures_through_casts_and_slices(src):
    found = m.extract(cst.parse_expression(src), primitives.spelled(primitives.save(m.Name("x"), "X")))
    assert found is not None and code_of(found["X"]).strip("()") == "x"
    assert m.matches(cst.parse_expression("x[1:]"), primitives.spelled(m.Name("x"))) is False


# -- the host max of the mirror (FA3 / TRT-LLM MHA eager reads) -------------------------------

EAGER = """
class FlashAttentionBackend(AttentionBackend):
    def init_forward_metadata(self, forward_batch):
        metadata.max_seq_len_k = {value}
"""


@pytest.mark.parametrize("spelling", sorted(set(MAX_SPELLINGS) - {"batch-slice"}))
def test_eager_mirror_max_in_each_spelling(spelling):
    src = EAGER.format(value=MAX_SPELLINGS[spelling])
    assert detect(fa3.EagerMetadataWithoutMirror, src).state is State.TODO
    out = apply(fa3.EagerMetadataWithoutMirror, src)
    assert "metadata.max_seq_len_k = host_max_seq_len(" in out and ".max()" not in out, out
    assert detect(fa3.EagerMetadataWithoutMirror, out).state is State.DONE


def test_eager_rows_max_keeps_its_rows():
    src = EAGER.format(value="int(seq_lens_cpu[:batch_size].int().max())")
    out = apply(fa3.EagerMetadataWithoutMirror, src)
    assert "metadata.max_seq_len_k = rows_max(seq_lens_cpu, forward_batch.seq_lens, batch_size)" in out, out


# -- the batch's total length (decode metrics) -----------------------------------------------

METRICS = """
class SchedulerMetricsMixin:
    def report_decode_stats(self, can_run_cuda_graph, running_batch=None):
        batch = running_batch or self.running_batch
        self.stats.decode_sum_seq_lens = {value}
"""
SUM_SPELLINGS = {
    "item": "batch.seq_lens_cpu.sum().item()",
    "int": "int(batch.seq_lens_cpu.sum())",
    "torch-sum": "torch.sum(batch.seq_lens_cpu).item()",
    "cast": "batch.seq_lens_cpu.to(torch.int64).sum().item()",
    "parentheses": "(batch.seq_lens_cpu.sum()).item()",
}


@pytest.mark.parametrize("spelling", sorted(SUM_SPELLINGS))
def test_metrics_total_in_each_spelling(spelling):
    src = METRICS.format(value=SUM_SPELLINGS[spelling])
    assert detect(guards.GuardDecodeStats, src).state is State.TODO
    out = apply(guards.GuardDecodeStats, src)
    assert "self.stats.decode_sum_seq_lens = decode_total_seq_lens(batch)\n" in out, out
    assert detect(guards.GuardDecodeStats, out).state is State.DONE


# -- the seq_lens copy to the host (the spec-v2 decode sync) ---------------------------------

DECODE = """
class EagleDraftInputV2Mixin:
    def prepare_for_decode(self, batch):
        batch.maybe_wait_verify_done()
        batch.seq_lens_cpu = {value}
        batch.seq_lens_sum = batch.seq_lens_cpu.sum().item()
"""
COPY_SPELLINGS = {
    "cpu": "batch.seq_lens.cpu()",
    "to-cpu": 'batch.seq_lens.to("cpu", non_blocking=True)',
    "cast-before": "batch.seq_lens.to(torch.int64).cpu()",
    "cast-after": "batch.seq_lens.cpu().int()",
    "batch-slice": "batch.seq_lens[:bs].cpu()",
    "parentheses": "(batch.seq_lens).cpu()",
}


@pytest.mark.parametrize("spelling", sorted(COPY_SPELLINGS))
def test_decode_copy_in_each_spelling_is_gated(spelling):
    value = COPY_SPELLINGS[spelling]
    src = DECODE.format(value=value)
    assert detect(sync.GateDecodeSync, src).state is State.TODO
    out = apply(sync.GateDecodeSync, src)
    assert (
        "        if not needs_cpu_seq_lens():\n" in out
        and f"        else:\n            batch.seq_lens_cpu = {value}\n" in out
    ), out
    assert detect(sync.GateDecodeSync, out).state is State.DONE


def test_another_value_copied_is_not_the_sync():
    src = DECODE.format(value="batch.positions.cpu()")
    assert detect(sync.GateDecodeSync, src).state is not State.TODO


# -- the kv-indices size (Triton) ------------------------------------------------------------

TRITON = """
class TritonAttnBackend(AttentionBackend):
    def init_forward_metadata(self, forward_batch):
        kv_indices = torch.empty({value}, dtype=torch.int64, device=self.device)
"""


@pytest.mark.parametrize(
    "value", ["forward_batch.seq_lens_sum", "int(forward_batch.seq_lens_sum)", "(forward_batch.seq_lens_sum)"]
)
def test_triton_kv_size_in_each_spelling(value):
    src = TRITON.format(value=value)
    out = apply(guards.GuardTritonMetadata, src)
    # The read as the vendor wrote it (parentheses kept), inside its cast.
    assert (
        f"seq_lens_sum_or_bound({value.removeprefix('int(').removesuffix(')') if value.startswith('int') else value}, forward_batch.batch_size, self.max_context_len, forward_batch)"
        in out
    ), out
    assert detect(guards.GuardTritonMetadata, out).state is State.DONE


# -- a None-able value plus another term (DP padding; FlashMLA's verify lengths) --------------

from patchkit.codemods.flashmla_spec_v2 import EagerMetadataWithoutMirror as FlashMLAEager  # noqa: E402

PAD = """
class ForwardBatch:
    def _pad_inputs_to_size(self, model_runner, num_tokens, bs):
        self.seq_lens_sum = {value}
"""
ADD_SPELLINGS = {
    "plain": "self.seq_lens_sum + fill * (bs - self.seq_lens.shape[0])",
    "operand-order": "fill * (bs - self.seq_lens.shape[0]) + self.seq_lens_sum",
    "torch-add": "torch.add(self.seq_lens_sum, fill * (bs - self.seq_lens.shape[0]))",
    "torch-add-order": "torch.add(fill * (bs - self.seq_lens.shape[0]), self.seq_lens_sum)",
}


@pytest.mark.parametrize("spelling", sorted(ADD_SPELLINGS))
def test_padded_sum_in_each_operand_order(spelling):
    src = PAD.format(value=ADD_SPELLINGS[spelling])
    out = apply(guards.GuardPadInputs, src)
    assert "self.seq_lens_sum = add_or_none(self.seq_lens_sum, fill * (bs - self.seq_lens.shape[0]))\n" in out, out
    assert detect(guards.GuardPadInputs, out).state is State.DONE


def test_added_captures_the_value_as_left():
    matcher = primitives.added(primitives.attr("seq_lens_sum"))
    for src in ("a.seq_lens_sum + 1", "1 + a.seq_lens_sum", "torch.add(1, a.seq_lens_sum)"):
        found = m.extract(cst.parse_expression(src), matcher)
        assert code_of(found["LEFT"]) == "a.seq_lens_sum" and code_of(found["RIGHT"]) == "1"
    assert m.extract(cst.parse_expression("a.seq_lens_sum - 1"), matcher) is None


FLASHMLA_VERIFY = """
class FlashMLABackend(FlashInferMLAAttnBackend):
    def init_forward_metadata(self, forward_batch):
        seq_lens_cpu = {value}
        max_seqlen_pad = triton.cdiv(seq_lens_cpu.max().item(), PAGE_SIZE)
"""


@pytest.mark.parametrize(
    "value",
    [
        "forward_batch.seq_lens_cpu + self.num_draft_tokens",
        "self.num_draft_tokens + forward_batch.seq_lens_cpu",
        "torch.add(forward_batch.seq_lens_cpu, self.num_draft_tokens)",
    ],
)
def test_flashmla_verify_lengths_in_each_operand_order(value):
    out = apply(FlashMLAEager, FLASHMLA_VERIFY.format(value=value))
    assert "seq_lens_cpu = plus_or_none(forward_batch.seq_lens_cpu, self.num_draft_tokens)\n" in out, out
    assert "host_max_seq_len(seq_lens_cpu, self.max_context_len + self.num_draft_tokens, forward_batch)" in out


# -- the replay's page count (FA3's page-table writer) ------------------------------------------

REPLAY_PAGES = """
class FlashAttentionBackend(AttentionBackend):
    def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens,
                                                 forward_mode, spec_info, seq_lens_cpu):
        normal_decode_set_metadata(metadata.cache_seqlens_int32, metadata.cu_seqlens_k, metadata.page_table,
                                   self.req_to_token, req_pool_indices, strided, {pages}, seq_lens, 1, self.page_size)
"""


@pytest.mark.parametrize(
    "pages", ["max_seq_pages", "int(max_seq_pages)", "max_seq_pages.to(torch.int32)", "(max_seq_pages)"]
)
def test_replay_page_count_in_each_spelling(pages):
    src = REPLAY_PAGES.format(pages=pages)
    assert detect(fa3.ReplayPageTableFits, src).state is State.TODO
    out = apply(fa3.ReplayPageTableFits, src)
    assert f"pages_within({pages}, metadata.page_table)" in out, out
    assert detect(fa3.ReplayPageTableFits, out).state is State.DONE
