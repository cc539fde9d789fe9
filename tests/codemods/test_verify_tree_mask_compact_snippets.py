"""Snippet tests of tests/trees/test_verify_tree_mask_compact.py (no release read; the quick loop runs them)."""

from __future__ import annotations

import enum
import re
from types import SimpleNamespace as NS

import pytest

from patchkit.backends import fa3 as fa3_rt
from patchkit.backends import trtllm_mla as mla_rt
from patchkit.backends import verify_tree_mask as vtm
from patchkit.codemods import fa3_spec_v2 as fa3
from patchkit.codemods import flashmla_spec_v2 as flashmla
from patchkit.codemods import trtllm_mla_spec_v2 as mla
from patchkit.codemods import verify_tree_mask_fits as fits
from patchkit.codemods.common.base import State
from patchkit.testing import apply, assert_codemod, assert_state, code, detect, run_all

torch = pytest.importorskip("torch")


class TreeMaskMode(enum.IntEnum):  # sglang's, as eagle_utils defines it
    FULL_MASK = 0
    QLEN_ONLY = 1
    QLEN_ONLY_BITPACKING = 2


@pytest.mark.parametrize(
    "recorded, expected",
    [(False, TreeMaskMode.QLEN_ONLY), (True, TreeMaskMode.FULL_MASK), (None, TreeMaskMode.FULL_MASK)],
)
def test_the_worker_asks_for_the_compact_layout_only_where_verify_never_reads(recorded, expected):
    backend = NS() if recorded is None else NS(verify_tree_mask_is_read=recorded)
    mode = vtm.tree_mask_mode_for(TreeMaskMode.FULL_MASK, backend)
    assert mode is expected and isinstance(mode, TreeMaskMode)
    assert vtm.tree_mask_mode_for(0, NS(verify_tree_mask_is_read=False)) == 1  # a fork's plain int


def test_alloc_sizes_an_unread_mask_compact_and_none_on_draft_instances():
    sizes = dict(max_num_tokens=8 * 4, max_context_len=131072, num_draft_tokens=4, skip_prefill=False, device="cpu")
    assert fa3_rt.alloc_verify_tree_mask(**sizes, is_draft_runner=False).numel() == 32 * (131072 + 4)
    assert fa3_rt.alloc_verify_tree_mask(**sizes, is_draft_runner=False, reads_mask=False).numel() == 32 * 4
    assert mla_rt.alloc_cuda_graph_custom_mask(**sizes, reads_mask=False).numel() == 32 * 4
    assert mla_rt.alloc_cuda_graph_custom_mask(**sizes, is_draft_runner=True, reads_mask=False) is None
    assert mla_rt.alloc_cuda_graph_custom_mask(**sizes).numel() == 32 * (131072 + 4)  # old call: unchanged


def test_a_compact_mask_goes_to_batches_it_fits_in_its_own_layout():
    d, max_bs = 4, 8
    mask = torch.zeros(max_bs * d * d, dtype=torch.bool)
    unread = NS(verify_tree_mask_max_bs=max_bs, verify_tree_mask_is_read=False, max_context_len=131072)
    assert vtm.verify_tree_mask_for_batch(mask, unread, torch.zeros(max_bs), d) is mask
    assert vtm.verify_tree_mask_for_batch(mask, unread, torch.zeros(max_bs + 1), d) is None
    read = NS(verify_tree_mask_max_bs=max_bs, verify_tree_mask_is_read=True, max_context_len=131072)
    assert vtm.verify_tree_mask_for_batch(mask, read, torch.zeros(1), d) is None  # too small for FULL_MASK


TRT_BACKEND = code("""
    class TRTLLMMLABackend(B):
        def __init__(self, model_runner, skip_prefill=False):
            self.num_draft_tokens = model_runner.server_args.speculative_num_draft_tokens

        def init_cuda_graph_state(self, max_bs, max_num_tokens, kv_indices_buf=None):
            self.padded_q_buffer = torch.zeros((max_bs,))

            super().init_cuda_graph_state(max_bs, max_num_tokens, kv_indices_buf)
""")


FA3_BACKEND = code("""
    class FlashAttentionBackend(B):
        def __init__(self, model_runner, skip_prefill=False):
            self.topk = model_runner.server_args.speculative_eagle_topk or 0

        def init_cuda_graph_state(self, max_bs, max_num_tokens):
            self.decode_cuda_graph_metadata = {}
""")


FLASHMLA_BACKEND = FA3_BACKEND.replace("FlashAttentionBackend", "FlashMLABackend")


RECORD = re.compile(r"        # The mask holds max_bs requests:.*?self\.verify_tree_mask_max_bs = max_bs\n", re.S)


NEW_ALLOC = re.compile(
    r"        # [^\n]*\(sglang #3[^\n]*\n        self\.verify_tree_mask_is_read = [^\n]*\n.*?\n        \)\n", re.S
)


OLD_TRT_ALLOC = """        # Worst-case FULL_MASK tree mask (bool) for verify; build_tree fills it
        # in place, so the GPU-only spec-v2 path needs no seq_lens_sum.
        self.cuda_graph_custom_mask = alloc_cuda_graph_custom_mask(
            max_num_tokens=max_num_tokens,
            max_context_len=self.max_context_len,
            num_draft_tokens=self.num_draft_tokens,
            skip_prefill=self.skip_prefill,
            device=self.device,
        )
"""


OLD_FA3_ALLOC = """        # Worst-case FULL_MASK verify tree mask (bool), filled in place by
        # build_tree_kernel_efficient: the GPU-only path needs no seq_lens_sum.
        self.cuda_graph_custom_mask = alloc_verify_tree_mask(
            max_num_tokens=max_num_tokens,
            max_context_len=self.max_context_len,
            num_draft_tokens={draft},
            skip_prefill=self.skip_prefill,
            is_draft_runner=self.is_draft_runner,
            device=self.device,
        )
"""


DRAFT_RUNNER_LINES = re.compile(
    r"        # The draft worker's instances never verify: no tree mask there \(sglang #31527\)\.\n.*?\n"
)


def downgrade(fresh: str, old_alloc: str, *, with_record: bool) -> str:
    """What an earlier patchkit wrote: the FULL_MASK helper call for every
    backend (before #32920's layout), with or without the max_bs record."""
    assert len(NEW_ALLOC.findall(fresh)) == 1, fresh
    old = NEW_ALLOC.sub(lambda _: old_alloc, fresh)
    return old if with_record else RECORD.sub("", old)


CASES = [
    ([mla.InitCustomMask, mla.AllocCustomMask], TRT_BACKEND, OLD_TRT_ALLOC, True),
    (
        [fa3.InitTreeMask, fa3.AllocTreeMask],
        FA3_BACKEND,
        OLD_FA3_ALLOC.format(draft="self.speculative_num_draft_tokens"),
        False,
    ),
    (
        [flashmla.InitTreeMask, flashmla.AllocTreeMask],
        FLASHMLA_BACKEND,
        OLD_FA3_ALLOC.format(draft="self.num_draft_tokens"),
        False,
    ),
]


@pytest.mark.parametrize("with_record", [True, False], ids=["max_bs-recorded", "before-the-record"])
@pytest.mark.parametrize(
    "codemods, pristine, old_alloc, draft_runner_is_new", CASES, ids=["trtllm-mla", "fa3", "flashmla"]
)
def test_an_earlier_patchkits_mask_upgrades_to_exactly_a_fresh_apply(
    codemods, pristine, old_alloc, draft_runner_is_new, with_record
):
    fresh, states = run_all(codemods, pristine)
    assert states == [State.DONE] * len(codemods) and "self.verify_tree_mask_is_read = " in fresh
    old = downgrade(fresh, old_alloc, with_record=with_record)
    if draft_runner_is_new:  # TRT-LLM MLA's __init__ had no is_draft_runner before #31527 was carried
        old = DRAFT_RUNNER_LINES.sub("", old)
    alloc = detect(codemods[1], old)
    assert alloc.state is State.TODO and "FULL_MASK layout" in alloc.detail
    upgraded, states = run_all(codemods, old)
    assert upgraded == fresh and states == [State.DONE] * len(codemods)


def test_what_each_backend_records_and_the_trtllm_draft_gate():
    assert (
        "self.verify_tree_mask_is_read = self.topk > 1\n"
        in run_all([fa3.InitTreeMask, fa3.AllocTreeMask], FA3_BACKEND)[0]
    )
    assert (
        "self.verify_tree_mask_is_read = False\n"
        in run_all([flashmla.InitTreeMask, flashmla.AllocTreeMask], FLASHMLA_BACKEND)[0]
    )
    out = run_all([mla.InitCustomMask, mla.AllocCustomMask], TRT_BACKEND)[0]
    assert "self.verify_tree_mask_is_read = False\n" in out and "is_draft_runner=self.is_draft_runner,\n" in out
    assert 'self.is_draft_runner = getattr(model_runner, "is_draft_worker", False)\n' in out


def test_upstreams_own_trtllm_mla_mask_keeps_its_init():
    """0.5.13 .. 0.5.15: upstream's __init__ and torch.zeros allocation (native there)."""
    src = TRT_BACKEND.replace(
        "        self.num_draft_tokens = model_runner.server_args.speculative_num_draft_tokens\n",
        "        self.num_draft_tokens = model_runner.server_args.speculative_num_draft_tokens\n"
        "        self.cuda_graph_custom_mask = None\n",
    ).replace(
        "        self.padded_q_buffer = torch.zeros((max_bs,))\n",
        "        self.cuda_graph_custom_mask = torch.zeros(max_num_tokens * (self.max_context_len + 4), dtype=torch.bool)\n",
    )
    assert src != TRT_BACKEND and "torch.zeros(max_num_tokens" in src
    assert_state(mla.InitCustomMask, src, State.DONE)
    assert_state(mla.AllocCustomMask, src, State.DONE)


WORKER = code("""
    class EagleDraftWorker:
        def draft(self, model_worker_batch):
            tree_mask_buf, position_buf = (
                self.target_worker.model_runner.attn_backend.get_verify_buffers_to_fill_after_draft()
            )
            out = build_tree_kernel_efficient(
                bonus, parents, scores, tokens, model_worker_batch.seq_lens, model_worker_batch.seq_lens_sum,
                self.topk, self.speculative_num_steps, self.speculative_num_draft_tokens,
                self.tree_mask_mode,
                tree_mask_buf,
                position_buf,
            )
""")


IMPORT = "from sglang.srt._patchkit.backends.verify_tree_mask import tree_mask_mode_for\n"


WRAPPED = "tree_mask_mode_for(self.tree_mask_mode, self.target_worker.model_runner.attn_backend),"


def test_the_kernel_gets_the_layout_the_target_backend_reads():
    assert_codemod(fits.DraftAsksForTheBackendsLayout, WORKER, IMPORT + WORKER.replace("self.tree_mask_mode,", WRAPPED))


def test_a_keyword_mode_argument_is_found():
    src = WORKER.replace(
        "            self.tree_mask_mode,\n", "            tree_mask_mode=self.tree_mask_mode,\n"
    ).replace("            tree_mask_buf,\n            position_buf,\n", "            tree_mask_buf=tree_mask_buf,\n")
    assert "tree_mask_mode=self" in src
    out = apply(fits.DraftAsksForTheBackendsLayout, src)
    assert "tree_mask_mode=" + WRAPPED in out


def test_no_mode_argument_is_missing_and_a_moved_build_superseded():
    src = WORKER.replace(
        "            self.tree_mask_mode,\n            tree_mask_buf,\n            position_buf,\n", ""
    )
    assert "self.tree_mask_mode" not in src
    finding = detect(fits.DraftAsksForTheBackendsLayout, src)
    assert finding.state is State.MISSING and "tree_mask_mode" in finding.detail
    moved = WORKER.replace("get_verify_buffers_to_fill_after_draft", "verify_mask")
    assert_state(fits.DraftAsksForTheBackendsLayout, moved, State.SUPERSEDED)


def test_trtllm_mla_leaves_a_schedule_batch_draft_to_upstream():
    src = WORKER.replace("def draft(self, model_worker_batch):", "def draft(self, batch: ScheduleBatch):")
    assert_state(fits.DraftAsksForTheBackendsLayoutUpTo0512, src, State.SUPERSEDED)
    assert_state(fits.DraftAsksForTheBackendsLayout, src, State.TODO)
