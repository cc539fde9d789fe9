"""fa3-draft-extend-graph: the worker's graph check admits FA3 (each form the
check takes, a fork's drift, the vendor's own change), the FA3 branch check,
then the patch on every release it targets and upstream's native form."""

from __future__ import annotations

import pytest
from drift import DRIFTS, drift
from support import snapshot

PATCH = "fa3-draft-extend-graph"
WORKER = "srt/speculative/eagle_worker_v2.py"
FA3 = "srt/layers/attention/flashattention_backend.py"
#: Every release the patch targets (0.5.23 has it upstream).
TARGETS = [
    "0.5.10",
    "0.5.10.post1",
    "0.5.11",
    "0.5.12",
    "0.5.12.post1",
    "0.5.13",
    "0.5.13.post1",
    "0.5.14",
    "0.5.15",
    "0.5.15.post1",
    "0.5.16",
    "0.5.17",
    "0.5.18",
    "0.5.19",
    "0.5.20",
    "0.5.21",
    "0.5.22",
]
UPSTREAM = "0.5.23"


# --- the FA3 branches the patch relies on ----------------------------------------------


def test_a_release_without_the_branch_is_refused_in_one_line_and_unchanged(make_tree, cli):
    package = make_tree("0.5.12.post1")
    fa3 = package / FA3
    fa3.write_text(
        fa3.read_text().replace("elif forward_mode.is_draft_extend_v2():", "elif forward_mode.is_draft_extend():")
    )
    before = snapshot(package)
    result = cli("apply", package, PATCH)
    assert result.exit_code == 1
    assert "no DRAFT_EXTEND_V2 CUDA-graph replay branch" in result.output
    assert snapshot(package) == before


# --- real trees ------------------------------------------------------------------------


@pytest.mark.trees
@pytest.mark.parametrize("version", TARGETS)
def test_every_targeted_release_applies_verifies_and_reverts_exactly(make_tree, cli, version):
    package = make_tree(version)
    before = snapshot(package)
    assert cli("status", package, PATCH).output.count("absent") == 1
    result = cli("apply", package, PATCH)
    assert result.exit_code == 0, result.output
    text = (package / WORKER).read_text()
    assert "supports_cuda_draft_extend_graph = isinstance(\n" in text and "FlashAttentionBackend" in text
    assert cli("verify", package, PATCH).exit_code == 0
    assert cli("revert", package, PATCH).exit_code == 0
    assert snapshot(package) == before


@pytest.mark.trees
def test_upstream_has_it_natively(make_tree, cli):
    package = make_tree(UPSTREAM)
    before = snapshot(package)
    assert "native" in cli("status", package, PATCH).output
    assert cli("apply", package, PATCH).exit_code == 0
    assert snapshot(package) == before


@pytest.mark.trees
@pytest.mark.parametrize("version", ["0.5.10", "0.5.12.post1"])
def test_with_every_other_patch_the_check_is_one_tuple_and_fa3_after_it(make_tree, cli, version):
    """trtllm-mha-draft-extend-v2 rebuilds the same check into one tuple; the
    two compose in either order, and revert of one keeps the other."""
    package = make_tree(version)
    before = snapshot(package)
    assert cli("apply", package, PATCH).exit_code == 0
    assert cli("apply", package).exit_code == 0
    text = (package / WORKER).read_text()
    assert "TRTLLMHAAttnBackend," in text and "self.draft_extend_attn_backend, FlashAttentionBackend" in text
    assert cli("verify", package).exit_code == 0
    assert cli("revert", package, PATCH).exit_code == 0
    text = (package / WORKER).read_text()
    assert "TRTLLMHAAttnBackend," in text and "FlashAttentionBackend" not in text
    assert cli("revert", package).exit_code == 0
    assert snapshot(package) == before


@pytest.mark.trees
@pytest.mark.parametrize("kind", sorted(DRIFTS))
def test_a_drifted_worker_applies_verifies_and_reverts(make_tree, cli, kind):
    package = make_tree("0.5.12.post1")
    drift(package, [WORKER], kind)
    before = snapshot(package)
    result = cli("apply", package, PATCH)
    assert result.exit_code == 0, result.output
    assert cli("verify", package, PATCH).exit_code == 0
    assert cli("revert", package, PATCH).exit_code == 0
    assert snapshot(package) == before
