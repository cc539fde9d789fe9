"""needs-cpu-seq-lens (#26128 + #26738, and #25818's deferred sum):
before/after snippets for every codemod (ours and upstream's shapes), then
the real trees."""

from __future__ import annotations

import libcst as cst
import pytest
from support import PRE_UPSTREAM, patch_states, pristine, snapshot
from test_needs_cpu_seq_lens_snippets import DEFERRED

from patchkit import registry
from patchkit.codemods.common.base import State

PID = "needs-cpu-seq-lens"


# -- real trees -----------------------------------------------------------------------------------

FILES = {
    "srt/layers/attention/base_attn_backend.py",
    "srt/layers/attention/triton_backend.py",
    "srt/speculative/eagle_worker_v2.py",
    "srt/managers/scheduler.py",
    "srt/speculative/eagle_info_v2.py",
    "srt/managers/schedule_batch.py",
    "srt/model_executor/forward_batch_info.py",
    "srt/model_executor/cuda_graph_runner.py",
    "srt/speculative/eagle_draft_extend_cuda_graph_runner.py",
    "srt/observability/scheduler_metrics_mixin.py",
}

# What each item of the issue looks like once applied (file -> snippets).
PRESENT = {
    "srt/layers/attention/base_attn_backend.py": ["    needs_cpu_seq_lens: bool = True\n"],
    "srt/layers/attention/triton_backend.py": [
        "class TritonAttnBackend(AttentionBackend):\n    # CUDA-graph replay",
        "    needs_cpu_seq_lens: bool = False\n\n    def __init__(\n",
        "seq_lens_sum_or_bound(forward_batch.seq_lens_sum, forward_batch.batch_size, self.max_context_len, forward_batch)",
        "prefix_lens_sum_or_bound(forward_batch.extend_prefix_lens_cpu,",
        "max_extend_len = max_of_extend_lens(forward_batch.extend_seq_lens_cpu, forward_batch.extend_seq_lens)",
    ],
    "srt/speculative/eagle_worker_v2.py": [
        "    def spec_v2_attn_backends(self) -> tuple:\n",
        "tree_mask_seq_lens_sum(model_worker_batch.seq_lens_sum, tree_mask_buf,",
    ],
    "srt/managers/scheduler.py": [
        "configure_needs_cpu_seq_lens(self.server_args, self.draft_worker, self.tp_worker)\n\n        self.future_map = FutureMap(\n",
    ],
    "srt/speculative/eagle_info_v2.py": [
        "        if not needs_cpu_seq_lens():\n",
        "            batch.seq_lens_cpu = batch.seq_lens.cpu()\n",
        "batch.extend_prefix_lens = draft_extend_prefix_lens(seq_lens_cpu_, batch.seq_lens, num_draft_tokens)",
    ],
    "srt/managers/schedule_batch.py": [
        "self.seq_lens_cpu = index_or_none(self.seq_lens_cpu, keep_indices)",
        "self.seq_lens_cpu = cat_or_none(self.seq_lens_cpu, other.seq_lens_cpu)",
        "        self.out_cache_loc = None\n        # patchkit (sglang #25818): deferred;",
        "        if self.seq_lens_sum is None and seq_lens_cpu is not None:\n"
        "            self.seq_lens_sum = int(seq_lens_cpu.sum())\n\n        return ModelWorkerBatch(\n",
    ],
    "srt/model_executor/forward_batch_info.py": [
        "assert isinstance(batch.extend_prefix_lens, (list, torch.Tensor))",
        "ret.extend_seq_lens_cpu = host_list_or_none(batch.extend_seq_lens)",
        "self.seq_lens_sum = add_or_none(self.seq_lens_sum,",
    ],
    "srt/model_executor/cuda_graph_runner.py": [
        "add_or_none(forward_batch.seq_lens_sum, (bs - raw_bs) * self.seq_len_fill_value),"
    ],
    "srt/speculative/eagle_draft_extend_cuda_graph_runner.py": ["seq_lens_sum=add_or_none(forward_batch.seq_lens_sum,"],
    "srt/observability/scheduler_metrics_mixin.py": [
        "total_context = float(decode_total_seq_lens(batch))",
        "self.stats.decode_sum_seq_lens = decode_total_seq_lens(batch)",
    ],
}


@pytest.mark.trees
@pytest.mark.parametrize("version", PRE_UPSTREAM)
def test_real_tree_apply_verify_idempotent_revert(linked_tree, cli, version):
    tree = linked_tree(version)
    before = snapshot(tree)
    assert patch_states(cli, tree)[PID]["state"] == "absent"

    result = cli("apply", tree, PID)
    assert result.exit_code == 0, result.output
    after = snapshot(tree)
    assert {k for k in before if before[k] != after[k]} == FILES
    for rel, snippets in PRESENT.items():
        text = (tree / rel).read_text()
        compile(text, rel, "exec")
        for snippet in snippets:
            assert snippet in text, (version, rel, snippet)
    schedule_batch = (tree / "srt/managers/schedule_batch.py").read_text()
    # #25818: no eager sum left: no device sync in filter_batch, no arithmetic on a deferred sum.
    assert "self.seq_lens.sum().item()" not in schedule_batch and "self.seq_lens_sum +=" not in schedule_batch
    assert schedule_batch.count(DEFERRED) == 3
    metrics = (tree / "srt/observability/scheduler_metrics_mixin.py").read_text()
    # Forward-pass request metrics exist from 0.5.12 on.
    assert ("for sl in decode_seq_lens(batch):" in metrics) == version.startswith("0.5.12")
    report = patch_states(cli, tree)[PID]
    assert report["state"] == "applied"

    assert cli("apply", tree, PID).exit_code == 0
    assert snapshot(tree) == after
    assert cli("apply", tree, PID, "--check").exit_code == 0

    assert cli("revert", tree, PID).exit_code == 0
    assert snapshot(tree) == before
    assert patch_states(cli, tree)[PID]["state"] == "absent"


@pytest.mark.trees
@pytest.mark.parametrize("version", ["0.5.13", "0.5.14", "0.5.15", "0.5.17", "0.5.19", "0.5.23"])
def test_upstream_releases_are_native_and_untouched(linked_tree, cli, version):
    tree = linked_tree(version)
    before = snapshot(tree)
    assert patch_states(cli, tree)[PID]["state"] == "native"
    result = cli("apply", tree, PID)
    assert result.exit_code == 0, result.output
    assert snapshot(tree) == before


@pytest.mark.trees
@pytest.mark.parametrize("version", [f"0.5.{n}" for n in range(13, 24)])
def test_every_upstream_release_detects_native(version):
    """Detection only (no copy): every part is done or superseded, never todo
    or missing, on every release that has the change upstream."""
    root = pristine(version)
    patch = registry.by_id(PID)
    done = 0
    for target in patch.targets:
        path = root / target.file
        if not path.exists():
            assert target.optional, (version, target.file)
            continue
        module = cst.parse_module(path.read_bytes())
        for codemod in target.codemods:
            finding = codemod().detect(module)
            assert finding.state in (State.DONE, State.SUPERSEDED), (version, codemod.name(), finding)
            done += finding.state is State.DONE
    assert done >= 5


@pytest.mark.trees
@pytest.mark.parametrize("version", ["0.5.10", "0.5.11", "0.5.12.post1"])
def test_helpers_do_not_collide_with_names_in_the_patched_modules(linked_tree, cli, version):
    """A helper imported into a module must not be shadowed there (a local
    ``max_extend_len = max_extend_len(...)`` would raise UnboundLocalError)."""
    import ast

    import patchkit.runtime as runtime

    tree = linked_tree(version)
    assert cli("apply", tree, PID).exit_code == 0
    for rel in FILES:
        source = (tree / rel).read_text()
        module = ast.parse(source)
        imported = {
            alias.asname or alias.name
            for node in module.body
            if isinstance(node, ast.ImportFrom) and node.module == "sglang.srt._patchkit.runtime"
            for alias in node.names
        }
        assert imported <= set(runtime.__all__), rel
        bound = set()
        for node in ast.walk(module):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                bound.add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.add(node.name)
            elif isinstance(node, ast.arg):
                bound.add(node.arg)
        assert not imported & bound, (rel, imported & bound)
