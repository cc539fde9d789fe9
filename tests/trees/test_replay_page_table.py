"""The replay's page table built on the device, each row to its real length
(common.page_table, on FA3 and TRT-LLM MHA): snippets, fork drift, the CPU
behaviour of the patched code, and the upgrade of a tree patched before it."""

from __future__ import annotations

import pytest

from patchkit import registry
from patchkit.codemods import fa3_spec_v2 as fa3
from patchkit.codemods import trtllm_mha_spec_v2 as mha
from patchkit.fetch import fetch_tree
from patchkit.testing import run_all

MHA_FILE = "srt/layers/attention/trtllm_mha_backend.py"
FA3_FILE = "srt/layers/attention/flashattention_backend.py"


# -- a tree patched before this change -----------------------------------------------------------


def _codemods(patch_id: str, rel: str) -> list[type]:
    patch = next(p for p in registry.all_patches() if p.id == patch_id)
    return [c for t in patch.targets if t.file == rel for c in t.codemods]


@pytest.mark.trees
@pytest.mark.parametrize(
    "patch_id, rel, version, new",
    [
        # patchkits without the replay's device build had no eager one either
        ("trtllm-mha-spec-v2", MHA_FILE, "0.5.10", (mha.ReplayPageTableOnDevice, mha.EagerPageTableOnDevice)),
        ("trtllm-mha-spec-v2", MHA_FILE, "0.5.13", (mha.ReplayPageTableOnDevice, mha.EagerPageTableOnDevice)),
        (
            "fa3-spec-v2",
            FA3_FILE,
            "0.5.12.post1",
            (fa3.ReplayPageTableOnDevice, fa3.FA3DecodePageWriterStopsAtLivePages),
        ),
        ("fa3-spec-v2", FA3_FILE, "0.5.15", (fa3.ReplayPageTableOnDevice,)),
        (
            "fa3-spec-v2",
            "srt/layers/attention/triton_ops/metadata.py",
            "0.5.14",
            (fa3.DecodePageWriterStopsAtLivePages,),
        ),
    ],
)
def test_an_earlier_patched_file_upgrades_to_a_fresh_apply(patch_id, rel, version, new):
    """A file patched by a patchkit without these codemods: the next apply
    runs only them (the others are done) and writes what a fresh apply writes."""
    src = (fetch_tree(version) / rel).read_text()
    codemods = _codemods(patch_id, rel)
    assert set(new) <= set(codemods)
    fresh, _ = run_all(codemods, src)
    earlier, _ = run_all([c for c in codemods if c not in new], src)
    upgraded, _ = run_all(codemods, earlier)
    assert upgraded == fresh != earlier
