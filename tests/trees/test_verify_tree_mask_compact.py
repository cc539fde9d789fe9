"""The verify tree mask where verify never reads it (sglang #32886, #32920) and
no mask on TRT-LLM MLA's draft-side instances (#31527).

build_tree_kernel_efficient filled the whole preallocated FULL_MASK mask
(max_bs * D * (context + D) cells) every verify step, for backends that never
read it: FlashMLA, TRT-LLM MLA, FA3 with topk 1. Now those backends record
``verify_tree_mask_is_read`` and allocate the compact QLEN_ONLY layout, and the
spec-v2 worker asks the kernel for that layout (``tree_mask_mode_for``).
Trees patched by an earlier patchkit upgrade to exactly what a fresh apply
writes (snippets, and the real files of 0.5.10, 0.5.12.post1 and 0.5.15).
"""

from __future__ import annotations

import pytest
from test_verify_tree_mask_compact_snippets import (
    DRAFT_RUNNER_LINES,
    OLD_FA3_ALLOC,
    OLD_TRT_ALLOC,
    downgrade,
)

from patchkit.codemods import fa3_spec_v2 as fa3
from patchkit.codemods import flashmla_spec_v2 as flashmla
from patchkit.codemods import trtllm_mla_spec_v2 as mla
from patchkit.codemods import verify_tree_mask_fits as fits
from patchkit.codemods.common.base import State
from patchkit.testing import run_all

# -- real files: a fresh apply, and the upgrade of an earlier patchkit's output -----------------

FA3_FILE = "srt/layers/attention/flashattention_backend.py"
FLASHMLA_FILE = "srt/layers/attention/flashmla_backend.py"
TRT_FILE = "srt/layers/attention/trtllm_mla_backend.py"
WORKER_FILE = "srt/speculative/eagle_worker_v2.py"
OLD_IMPORT = "from sglang.srt._patchkit.backends.verify_tree_mask import verify_tree_mask_for_batch\n"
NEW_IMPORT = (
    "from sglang.srt._patchkit.backends.verify_tree_mask import tree_mask_mode_for, verify_tree_mask_for_batch\n"
)


@pytest.mark.trees
@pytest.mark.parametrize("version", ["0.5.10", "0.5.12.post1", "0.5.15"])
def test_real_files_upgrade_to_exactly_a_fresh_apply(make_tree, version):
    tree = make_tree(version)
    files = [
        (
            FA3_FILE,
            [fa3.InitTreeMask, fa3.AllocTreeMask],
            OLD_FA3_ALLOC.format(draft="self.speculative_num_draft_tokens"),
            False,
        ),
        (
            FLASHMLA_FILE,
            [flashmla.InitTreeMask, flashmla.AllocTreeMask],
            OLD_FA3_ALLOC.format(draft="self.num_draft_tokens"),
            False,
        ),
    ]
    if version != "0.5.15":  # TRT-LLM MLA's mask is upstream's from 0.5.13
        files.append((TRT_FILE, [mla.InitCustomMask, mla.AllocCustomMask], OLD_TRT_ALLOC, True))
    for rel, codemods, old_alloc, draft_runner_is_new in files:
        fresh, states = run_all(codemods, (tree / rel).read_text())
        assert states == [State.DONE] * len(codemods), rel
        old = downgrade(fresh, old_alloc, with_record=True)
        if draft_runner_is_new:
            old = DRAFT_RUNNER_LINES.sub("", old)
        assert run_all(codemods, old)[0] == fresh, rel
    worker = [fits.DraftHandsOverAFittingTreeMask, fits.DraftAsksForTheBackendsLayout]
    fresh, states = run_all(worker, (tree / WORKER_FILE).read_text())
    assert states == [State.DONE] * 2 and fresh.count("tree_mask_mode_for(self.tree_mask_mode, ") == 1
    old = fresh.replace(NEW_IMPORT, OLD_IMPORT).replace(
        "tree_mask_mode_for(self.tree_mask_mode, self.target_worker.model_runner.attn_backend)", "self.tree_mask_mode"
    )
    assert old != fresh and run_all(worker, old)[0] == fresh
