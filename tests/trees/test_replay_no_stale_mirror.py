"""replay-no-stale-mirror (sglang #31364, the runners' half): snippets, the
evidence that no backend of the first five patches reads the stale buffer, and
the real trees (0.5.10, 0.5.12.post1, 0.5.13, 0.5.14 patched; 0.5.16 native)."""

from __future__ import annotations

import json

import pytest
from support import pristine, snapshot

PATCH = "replay-no-stale-mirror"
FA3 = "srt/layers/attention/flashattention_backend.py"
DRAFT_EXTEND_RUNNER = "srt/speculative/eagle_draft_extend_cuda_graph_runner.py"
VERIFY_RUNNER = {
    "0.5.10": "srt/model_executor/cuda_graph_runner.py",
    "0.5.12.post1": "srt/model_executor/cuda_graph_runner.py",
    "0.5.13": "srt/model_executor/cuda_graph_runner.py",
    "0.5.14": "srt/model_executor/runner/decode_cuda_graph_runner.py",
}


# -- the stale pinned buffer without fa3-spec-v2 ---------------------------------------------

#: The backends that opt out with the first five patches, and their replay hooks.
OPTED_OUT = {
    "srt/layers/attention/triton_backend.py": ("TritonAttnBackend", "TritonMultiStepDraftBackend"),
    "srt/layers/attention/trtllm_mla_backend.py": ("TRTLLMMLABackend", "TRTLLMMLAMultiStepDraftBackend"),
}


def _replay_reads_of_the_mirror(source: str, classes) -> dict[str, list]:
    """Per replay method of ``classes``: the lines reading ``seq_lens_cpu``
    outside a hand-over to the parent (``super().<same method>(...)``)."""
    import ast

    found = {}
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.ClassDef) and node.name in classes):
            continue
        for fn in node.body:
            if not (isinstance(fn, ast.FunctionDef) and "replay" in fn.name):
                continue
            handed_to_parent = {
                id(n)
                for call in ast.walk(fn)
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == fn.name
                for n in ast.walk(call)
            }
            reads = [
                n.lineno
                for n in ast.walk(fn)
                if id(n) not in handed_to_parent
                and (
                    (isinstance(n, ast.Name) and n.id == "seq_lens_cpu" and isinstance(n.ctx, ast.Load))
                    or (isinstance(n, ast.Attribute) and n.attr == "seq_lens_cpu")
                )
            ]
            found[f"{node.name}.{fn.name}"] = reads
    return found


@pytest.mark.trees
@pytest.mark.parametrize("version", ["0.5.10", "0.5.10.post1", "0.5.11", "0.5.12", "0.5.12.post1"])
def test_five_patch_trees_never_read_the_stale_buffer(version):
    """Why the runners' None hand-over lives with fa3-spec-v2: before it, the
    replay of every backend that can opt out (Triton, TRT-LLM MLA) reads no
    ``seq_lens_cpu`` (TRT-LLM MLA only passes it on to its parent for modes the
    spec-v2 graph runners never replay), so the stale pinned buffer reaches no
    reader; FA3's replay does read it."""
    tree = pristine(version)
    for rel, classes in OPTED_OUT.items():
        reads = _replay_reads_of_the_mirror((tree / rel).read_text(), classes)
        assert reads and all(lines == [] for lines in reads.values()), (rel, reads)
    fa3_reads = _replay_reads_of_the_mirror((tree / FA3).read_text(), ("FlashAttentionBackend",))
    assert fa3_reads["FlashAttentionBackend.init_forward_metadata_replay_cuda_graph"]


# -- real trees ----------------------------------------------------------------------------


def state(cli, tree) -> dict:
    result = cli("status", tree, PATCH, "--format", "json")
    assert result.exit_code == 0, result.output
    return {p["id"]: p for p in json.loads(result.output)["patches"]}[PATCH]


@pytest.mark.trees
@pytest.mark.parametrize("version", sorted(VERIFY_RUNNER))
def test_release_apply_verify_and_exact_revert(linked_tree, cli, version):
    tree = linked_tree(version)
    before = snapshot(tree)
    assert state(cli, tree)["state"] == "absent"
    result = cli("apply", tree, PATCH)
    assert result.exit_code == 0, result.output
    for rel in (VERIFY_RUNNER[version], DRAFT_EXTEND_RUNNER):
        text = (tree / rel).read_text()
        assert "mirror_or_none(forward_batch.seq_lens_cpu, buffers.seq_lens_cpu" in text, rel
        assert "from sglang.srt._patchkit.backends.mirror_reads import mirror_or_none\n" in text
    assert state(cli, tree)["state"] == "applied"
    patched = snapshot(tree)
    assert cli("apply", tree, PATCH).exit_code == 0 and snapshot(tree) == patched
    assert cli("revert", tree).exit_code == 0
    assert snapshot(tree) == before


@pytest.mark.trees
@pytest.mark.parametrize("version", ["0.5.16", "0.5.23"])
def test_upstream_releases_are_native(linked_tree, cli, version):
    tree = linked_tree(version)
    before = snapshot(tree)
    assert state(cli, tree)["state"] == "native"
    assert cli("apply", tree, PATCH).exit_code == 0
    assert snapshot(tree) == before
