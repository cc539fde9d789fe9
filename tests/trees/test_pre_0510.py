"""Releases before 0.5.10 that have spec v2 (docs/research/pre-0.5.10.md), and
apply's safety rule (needs-cpu-seq-lens's postcondition, patchkit/checks/mirror_reads.py),
one real tree per outcome: each test applies, audits, verifies and reverts in
one go (trees are costly)."""

from __future__ import annotations

import json

import pytest
from support import pristine_snapshot, snapshot

from patchkit import audit, registry

DECISION = "needs-cpu-seq-lens"


def _apply(cli, tree):
    result = cli("apply", tree, "-q")
    lines = {line.split(":")[1].strip(): line for line in result.output.splitlines() if line.startswith("not applied:")}
    return result, lines


def _states(cli, tree) -> dict[str, str]:
    doc = json.loads(cli("status", tree, "--format", "json").output)
    return {p["id"]: p["state"] for p in doc["patches"]}


def _revert_exact(cli, tree, version):
    assert cli("revert", tree, "-q").exit_code == 0
    assert snapshot(tree) == pristine_snapshot(version)


@pytest.mark.trees
def test_guarded_by_the_patch_0_5_4(cli, linked_tree):
    """0.5.4.post3: the DP padding sits inline in prepare_mlp_sync_batch and is
    guarded there; TRT-LLM MLA's draft extend re-reads the mirror's max, which
    trtllm-mla-spec-v2 drops (0.5.6's form); the worker never replays a
    draft-extend graph, so the three draft-extend graph patches are not
    applicable: apply exits 0."""
    tree = linked_tree("0.5.4.post3")
    result, refused = _apply(cli, tree)
    assert result.exit_code == 0 and not refused, result.output
    assert "add_or_none" in (tree / "srt/model_executor/forward_batch_info.py").read_text()
    mla = (tree / "srt/layers/attention/trtllm_mla_backend.py").read_text()
    assert "needs_cpu_seq_lens: bool = False" in mla and "max_seq = forward_batch.seq_lens_cpu.max().item()" not in mla
    assert mla.count("max_seq = host_max_seq_len(") == 1  # the None-tested max, with the static bound (issue 53)
    doc = json.loads(cli("status", tree, "--format", "json").output)
    states = {p["id"]: p["state"] for p in doc["patches"]}
    assert states[DECISION] == states["trtllm-mla-spec-v2"] == states["fa3-spec-v2"] == "applied"
    reasons = {p["id"]: p.get("reason", "") for p in doc["patches"] if p["state"] == "not-applicable"}
    assert set(reasons) == {
        "dsa-no-mirror",  # no spec-v2 draft extend on NSA before 0.5.7
        "dsa-draft-extend-graph",  # builds on dsa-no-mirror
        "draft-extend-graph-no-topk",
        "fa3-draft-extend-graph",
        "flashinfer-draft-extend-graph",
        "trtllm-mha-draft-extend-v2",
        "spec-v2-decode-copies",
        "seq-lens-host-bound",
        "flashinfer-swa-host-sum",
        "triton-draft-extend-prefix",  # the draft-extend branch serves V1 only before 0.5.8
    }  # the kv lengths stay on the device there (and the KV allocations: no host bound)
    assert "never replays its draft-extend CUDA graph" in reasons["fa3-draft-extend-graph"]
    assert cli("verify", tree, "-q").exit_code == 0
    assert audit.audit_tree(tree).ok
    _revert_exact(cli, tree, "0.5.4.post3")


@pytest.mark.trees
def test_refused_where_decode_reads_the_mirror_0_5_5(cli, linked_tree):
    """0.5.5.post3: prepare_for_decode reads the mirror right after the sync
    (req.kv_committed_len): the decision and its dependents are refused,
    nothing of them written; the other patches apply."""
    tree = linked_tree("0.5.5.post3")
    result, refused = _apply(cli, tree)
    assert result.exit_code == 1
    assert refused[DECISION].endswith(
        "refused: srt/speculative/eagle_info_v2.py:133: EagleDraftInputV2Mixin.prepare_for_decode reads "
        "`batch.seq_lens_cpu` unguarded once the mirror is dropped, so nothing of needs-cpu-seq-lens is written: "
        "guard that line with a None test (`if ... is None:`; `patchkit audit` lists every read), or "
        + registry.skip_advice(DECISION)
    )
    # The line of the file on disk (apply's would-be file has its imports above it).
    assert "batch.seq_lens_cpu[i]" in (tree / "srt/speculative/eagle_info_v2.py").read_text().splitlines()[132]
    assert refused["fa3-spec-v2"].endswith(f"requires {DECISION}, which is refused")
    assert refused["trtllm-mla-spec-v2"].endswith(f"requires {DECISION}, which is refused")
    # no CUDA draft-extend graph here (NPU only): not applicable, not "not applied"
    assert "fa3-draft-extend-graph" not in refused and "trtllm-mha-draft-extend-v2" not in refused
    pristine = pristine_snapshot("0.5.5.post3")
    now = snapshot(tree)
    for rel in ("srt/speculative/eagle_info_v2.py", "srt/managers/scheduler.py"):
        assert now[rel] == pristine[rel], rel
    # schedule_batch.py: min-new-tokens-no-sync's pinned output ids only (issue 53), nothing of the decision
    batch = (tree / "srt/managers/schedule_batch.py").read_text()
    assert "pin_memory=pin_memory_for(self.device)" in batch and "needs_cpu_seq_lens" not in batch
    states = _states(cli, tree)
    assert states["draft-extend-graph-no-topk"] == states["min-new-tokens-no-sync"] == "applied"
    assert states["fa3-draft-extend-graph"] == states["trtllm-mha-draft-extend-v2"] == "not-applicable"
    assert states[DECISION] == "absent"
    _revert_exact(cli, tree, "0.5.5.post3")


@pytest.mark.trees
def test_proven_not_to_run_there_0_5_7(cli, linked_tree):
    """0.5.7: DeepSeek's MHA one-shot reads the mirror in forward_batch_info.py,
    only under is_extend_without_speculative(): safe, and the decision applies."""
    tree = linked_tree("0.5.7")
    result, refused = _apply(cli, tree)
    assert result.exit_code == 0 and not refused, result.output
    found = audit.audit_tree(tree)
    assert found.ok
    (one_shot,) = [r for r in found.reads if r.function == "ForwardBatch.fetch_mha_one_shot_kv_indices"]
    assert one_shot.verdict == "safe" and "is_extend_without_speculative" in one_shot.why
    states = _states(cli, tree)
    # the verify runner's own populate_from_forward_batch already hands None (replay-no-stale-mirror: done)
    assert states[DECISION] == states["replay-no-stale-mirror"] == states["fa3-spec-v2"] == "applied"
    # the worker captures the draft extend on NPU only: both graph patches not applicable, with why
    assert states["fa3-draft-extend-graph"] == states["trtllm-mha-draft-extend-v2"] == "not-applicable"
    assert cli("verify", tree, "-q").exit_code == 0
    _revert_exact(cli, tree, "0.5.7")


@pytest.mark.trees
def test_inline_gate_admits_fa3_and_trtllm_mha_0_5_9(cli, linked_tree):
    """0.5.9 (as 0.5.8.post1) lists the draft-extend graph's backends inline,
    in the `if` that captures it: both patches join that `or`; exact revert."""
    tree = linked_tree("0.5.9")
    patches = ("fa3-draft-extend-graph", "trtllm-mha-draft-extend-v2")
    result = cli("apply", tree, *patches, "-q")
    assert result.exit_code == 0, result.output
    worker = (tree / "srt/speculative/eagle_worker_v2.py").read_text()
    assert "or fa3_draft_extend_graph" in worker
    assert "and isinstance(self.draft_extend_attn_backend, TRTLLMHAAttnBackend)" in worker
    assert cli("verify", tree, *patches, "-q").exit_code == 0
    _revert_exact(cli, tree, "0.5.9")
