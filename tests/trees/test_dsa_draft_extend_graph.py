"""dsa-draft-extend-graph (sglang #29413 + #30378) on the real releases: applied on 0.5.10
and 0.5.12.post1 (apply, verify, idempotent, exact revert), on 0.5.8 / 0.5.9 (the
worker's capture gate inline, the replay on dsa-no-mirror's device expansion) and on
0.5.13 / 0.5.14 (the renamed backend's _apply_cuda_graph_metadata), native on
0.5.15 and 0.5.23, not applicable on 0.5.7 (its draft-extend graph is NPU only) and with
dsa-no-mirror's reasons elsewhere; and two fork shapes on
0.5.12.post1 (upstream's names taken early; a draft-extend replay that returns early,
refused in one line while the rest applies)."""

from __future__ import annotations

import pytest
from support import patch_states, snapshot, verified_idempotent_reverted

ID = "dsa-draft-extend-graph"
NSA = "srt/layers/attention/nsa_backend.py"
DSA = "srt/layers/attention/dsa_backend.py"
WORKER = "srt/speculative/eagle_worker_v2.py"
RUNTIME = "srt/_patchkit/backends/dsa_graph.py"
MARK = f"# patchkit {ID}"


def state(cli, tree) -> dict:
    return patch_states(cli, tree, ID)[ID]


def package_of(tree):
    return tree / "sglang" if (tree / "sglang").is_dir() else tree


def replay_of(source: str) -> str:
    return source.split("def init_forward_metadata_replay_cuda_graph(", 1)[1].split("\n    def ", 1)[0]


@pytest.mark.trees
@pytest.mark.parametrize("version", ["0.5.10", "0.5.12.post1"])
def test_carried_onto_0_5_10_and_0_5_12_post1(make_tree, cli, version):
    tree = make_tree(version)
    package = package_of(tree)
    before = snapshot(tree)
    assert state(cli, tree)["state"] == "absent"
    result = cli("apply", tree, ID)  # pulls in dsa-no-mirror and what it requires
    assert result.exit_code == 0, result.output
    assert state(cli, tree)["state"] == "applied"
    replay = replay_of((package / NSA).read_text())
    fixed, shared = replay.split("elif forward_mode.is_draft_extend_v2():", 1)[1].split(
        "elif forward_mode.is_draft_extend(include_v2=True):"
    )
    assert MARK in fixed and ".tolist()" not in fixed and "spec_info" not in fixed
    assert "repeats=self.speculative_num_draft_tokens" in fixed and ".clamp_(min=0)" in fixed
    # the v1 draft extend keeps its branch (accept_length up to 0.5.10.post1, num_accept_tokens after)
    assert "spec_info.num_accept_tokens[:bs]" in shared or "spec_info.accept_length[:bs]" in shared
    worker = (package / WORKER).read_text()
    assert "supports_cuda_draft_extend_graph = is_dsa_backend(" in worker and MARK in worker
    assert (package / RUNTIME).is_file()
    assert cli("verify", tree, ID).exit_code == 0
    patched = snapshot(tree)
    assert cli("apply", tree, ID).exit_code == 0 and snapshot(tree) == patched  # idempotent
    assert cli("revert", tree, ID).exit_code == 0  # alone: dsa-no-mirror stays
    assert MARK not in (package / NSA).read_text() and MARK not in (package / WORKER).read_text()
    assert patch_states(cli, tree, "dsa-no-mirror")["dsa-no-mirror"]["state"] == "applied"
    assert cli("revert", tree).exit_code == 0
    assert snapshot(tree) == before


@pytest.mark.trees
@pytest.mark.parametrize("version", ["0.5.8", "0.5.9"])
def test_carried_onto_0_5_8_and_0_5_9(make_tree, cli, version):
    """No named graph check before 0.5.10: a flag of the patch's own joins the capture
    gate's `or`; the replay's new branch calls dsa-no-mirror's device expansion."""
    tree = make_tree(version)
    package = package_of(tree)
    before = snapshot(tree)
    assert state(cli, tree)["state"] == "absent"
    assert cli("apply", tree, "dsa-no-mirror").exit_code == 0
    required = snapshot(tree)
    result = cli("apply", tree, ID)
    assert result.exit_code == 0, result.output
    replay = replay_of((package / NSA).read_text())
    fixed, shared = replay.split("elif forward_mode.is_draft_extend_v2():", 1)[1].split(
        "elif forward_mode.is_draft_extend(include_v2=True):"
    )
    assert MARK in fixed and ".tolist()" not in fixed and "spec_info" not in fixed
    assert "seqlens_expand(\n" in fixed and ".clamp_(min=0)" in fixed
    assert "spec_info.accept_length[:bs]" in shared  # the v1 draft extend keeps its branch
    worker = (package / WORKER).read_text()
    assert "dsa_draft_extend_graph = (" in worker and "or dsa_draft_extend_graph\n" in worker
    assert "is_dsa_backend(self.draft_extend_attn_backend)" in worker and MARK in worker
    verified_idempotent_reverted(cli, tree, ID, required)  # applied, verify, idempotent, exact revert
    assert cli("revert", tree).exit_code == 0
    assert snapshot(tree) == before


@pytest.mark.trees
@pytest.mark.parametrize(
    ("version", "shared"),
    [
        ("0.5.13", "elif forward_mode.is_draft_extend(include_v2=True):"),  # v1 and v2 share the replay's branch
        ("0.5.14", None),  # its own DRAFT_EXTEND_V2 branch at the accepted counts
    ],
)
def test_carried_onto_0_5_13_and_0_5_14(make_tree, cli, version, shared):
    """The renamed backend before upstream's #29413 (0.5.15): the replay is
    _apply_cuda_graph_metadata; 0.5.13 gets a fixed-width branch before the shared one,
    0.5.14's own branch at the counts gets the fixed-width body; the worker admits it
    after its graph check (an isinstance tuple, 0.5.13's init_cuda_graphs, 0.5.14's
    _capture_cuda_graphs)."""
    tree = make_tree(version)
    package = package_of(tree)
    before = snapshot(tree)
    assert state(cli, tree)["state"] == "absent"
    assert cli("apply", tree, "dsa-no-mirror").exit_code == 0
    required = snapshot(tree)
    result = cli("apply", tree, ID)
    assert result.exit_code == 0, result.output
    replay = (package / DSA).read_text().split("    def _apply_cuda_graph_metadata(", 1)[1].split("\n    def ", 1)[0]
    fixed = replay.split("elif forward_mode.is_draft_extend_v2():", 1)[1]
    if shared:
        fixed, rest = fixed.split(shared)
        assert "spec_info.num_accept_tokens[:bs]" in rest  # the v1 draft extend keeps its branch
    assert MARK in fixed and ".tolist()" not in fixed and "spec_info" not in fixed
    assert "repeats=self.speculative_num_draft_tokens" in fixed and ".clamp_(min=0)" in fixed
    worker = (package / WORKER).read_text()
    assert "supports_cuda_draft_extend_graph = is_dsa_backend(" in worker and MARK in worker
    assert (package / RUNTIME).is_file()
    verified_idempotent_reverted(cli, tree, ID, required)  # applied, verify, idempotent, exact revert
    assert cli("revert", tree).exit_code == 0
    assert snapshot(tree) == before


@pytest.mark.trees
def test_not_applicable_on_0_5_7_where_the_draft_extend_graph_is_npu_only(linked_tree, cli):
    tree = linked_tree("0.5.7")
    st = state(cli, tree)
    assert st["state"] == "not-applicable", st
    assert "captured on NPU only" in st["reason"], st["reason"]
    assert patch_states(cli, tree, "dsa-no-mirror")["dsa-no-mirror"]["state"] == "absent"


@pytest.mark.trees
@pytest.mark.parametrize("version", ["0.5.15", "0.5.23"])
def test_native_from_0_5_15(linked_tree, cli, version):
    tree = linked_tree(version)
    st = state(cli, tree)
    assert st["state"] == "native", st


@pytest.mark.trees
@pytest.mark.parametrize(
    ("version", "reason"),
    [
        ("0.5.4.post3", "no spec-v2 draft extend here"),
        ("0.5.6.post2", "no spec-v2 draft extend here"),
    ],
)
def test_not_applicable_where_dsa_no_mirror_is_not(linked_tree, cli, version, reason):
    st = state(cli, linked_tree(version))
    assert st["state"] == "not-applicable", st
    assert st["reason"].count("builds on dsa-no-mirror, not applicable here") == 1 and reason in st["reason"]


@pytest.mark.trees
def test_fork_with_upstreams_names_is_carried(make_tree, cli):
    """0.5.12.post1 with the backend renamed as upstream did in 0.5.13 (dsa_backend.py)."""
    tree = make_tree("0.5.12.post1")
    package = package_of(tree)
    source = (package / NSA).read_text().replace("class NativeSparseAttnBackend(", "class DeepseekSparseAttnBackend(")
    source = source.replace("class NativeSparseAttnMultiStepBackend:", "class DeepseekSparseAttnMultiStepBackend:")
    (package / DSA).write_text(source)
    (package / NSA).unlink()
    result = cli("apply", tree, ID)
    assert result.exit_code == 0, result.output
    assert state(cli, tree)["state"] == "applied"
    dsa = (package / DSA).read_text()
    assert "class DeepseekSparseAttnBackend(" in dsa and MARK in replay_of(dsa)
    assert "is_dsa_backend(" in (package / WORKER).read_text()


@pytest.mark.trees
def test_fork_whose_draft_extend_replay_returns_early_is_refused_in_one_line(make_tree, cli):
    tree = make_tree("0.5.12.post1")
    package = package_of(tree)
    text = (package / NSA).read_text()
    tail = "            metadata.nsa_cache_seqlens_int32[: seqlens_expanded.shape[0]].copy_(\n                nsa_cache_seqlens\n            )\n"
    assert text.count(tail) == 1
    (package / NSA).write_text(
        text.replace(tail, tail + "            self.forward_metadata = metadata\n            return\n")
    )
    edited = (package / NSA).read_text()
    result = cli("apply", tree)
    assert result.exit_code == 1, result.output
    lines = [ln for ln in result.output.splitlines() if ln.startswith(f"not applied: {ID}")]
    assert len(lines) == 1 and "nsa_backend.py:" in lines[0] and "returns before the method's shared tail" in lines[0]
    assert f"--skip {ID}" in lines[0]
    assert "applied: dsa-no-mirror" in result.output  # the rest applies
    assert MARK not in (package / WORKER).read_text() and MARK not in (package / NSA).read_text()
    assert (package / NSA).read_text() != edited  # dsa-no-mirror's edits, not ours
