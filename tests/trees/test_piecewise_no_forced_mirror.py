"""piecewise-no-forced-mirror (sglang #28633): snippets of each part, the
release runners read as they ship, the decision on the real patched
scheduler, and the real trees (0.5.10, 0.5.12.post1 and 0.5.13 patched,
0.5.14 native, a tree patched before this patch upgraded byte for byte)."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest
from support import patch_states, snapshot

from patchkit.codemods import piecewise_no_forced_mirror as pw
from patchkit.codemods.common.base import State
from patchkit.fetch import fetch_tree
from patchkit.testing import detect

PATCH = "piecewise-no-forced-mirror"
OVERLAP = "srt/managers/overlap_utils.py"
SCHEDULER = "srt/managers/scheduler.py"
RUNNERS = {
    "srt/model_executor/piecewise_cuda_graph_runner.py": pw.PiecewiseRunnerHandsMirrorThrough,
    "srt/model_executor/breakable_cuda_graph_runner.py": pw.BreakableRunnerHandsMirrorThrough,
}


@pytest.mark.trees
@pytest.mark.parametrize("version", ["0.5.10", "0.5.11", "0.5.12.post1", "0.5.13"])
def test_release_runners_only_hand_the_mirror_through(version):
    tree = fetch_tree(version)
    for rel, codemod in RUNNERS.items():
        if (tree / rel).exists():
            assert detect(codemod, (tree / rel).read_text()).state is State.SUPERSEDED, rel


@pytest.mark.trees
@pytest.mark.parametrize("version", ["0.5.10", "0.5.12.post1", "0.5.13"])
def test_release_apply_verify_and_exact_revert(linked_tree, cli, version):
    tree = linked_tree(version)
    before = snapshot(tree)
    assert patch_states(cli, tree, PATCH)[PATCH]["state"] == "absent"
    result = cli("apply", tree, PATCH)
    assert result.exit_code == 0, result.output
    if version == "0.5.13":
        assert "is_ngram()" in (tree / OVERLAP).read_text()
        assert (
            "disable_piecewise_cuda_graph"
            not in (tree / OVERLAP).read_text().split("def decide_needs_cpu_seq_lens")[1].split("\ndef ")[0]
        )
    else:
        assert "piecewise_reads_mirror=False)" in (tree / SCHEDULER).read_text()
    assert patch_states(cli, tree, PATCH)[PATCH]["state"] == "applied"
    assert cli("verify", tree, PATCH).exit_code == 0
    patched = snapshot(tree)
    assert cli("apply", tree, PATCH).exit_code == 0 and snapshot(tree) == patched
    assert cli("revert", tree, "--cascade").exit_code == 0
    assert snapshot(tree) == before


@pytest.mark.trees
def test_0_5_14_is_native(linked_tree, cli):
    tree = linked_tree("0.5.14")
    before = snapshot(tree)
    assert patch_states(cli, tree, PATCH)[PATCH]["state"] == "native"
    assert cli("apply", tree, PATCH).exit_code == 0 and snapshot(tree) == before


@pytest.mark.trees
def test_a_tree_patched_without_it_upgrades_to_what_a_fresh_apply_writes(linked_tree, cli):
    earlier, fresh = linked_tree(), linked_tree()
    assert cli("apply", earlier, "--skip", PATCH).exit_code == 0
    assert cli("apply", earlier).exit_code == 0
    assert cli("apply", fresh).exit_code == 0
    assert snapshot(earlier) == snapshot(fresh)


@pytest.mark.trees
def test_the_patched_decision_drops_the_mirror_with_piecewise_cuda_graph_on(linked_tree, cli):
    """The patched 0.5.12.post1 scheduler's own init_overlap, run on a stand-in
    scheduler with sglang's default settings (piecewise CUDA graph on)."""
    import importlib.util
    import sys

    tree = linked_tree()
    assert cli("apply", tree).exit_code == 0
    runtime_path = tree / "srt/_patchkit/runtime/seq_lens.py"
    spec = importlib.util.spec_from_file_location("patched_seq_lens", runtime_path)
    runtime = importlib.util.module_from_spec(spec)
    sys.modules["patched_seq_lens"] = runtime
    spec.loader.exec_module(runtime)
    source = (tree / SCHEDULER).read_text()
    call = next(
        line.strip() for line in source.splitlines() if line.strip().startswith("configure_needs_cpu_seq_lens(")
    )
    triton = NS(needs_cpu_seq_lens=False)
    me = NS(
        server_args=NS(enable_two_batch_overlap=False, disable_piecewise_cuda_graph=False),
        draft_worker=NS(spec_v2_attn_backends=(triton, triton, triton, None)),
        tp_worker=NS(model_runner=NS(model_is_mrope=False)),
    )
    eval(call, {"configure_needs_cpu_seq_lens": runtime.configure_needs_cpu_seq_lens, "self": me})
    assert runtime.needs_cpu_seq_lens() is False
