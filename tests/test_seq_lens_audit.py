"""Static audit of the patched tree: every read of ``seq_lens_cpu`` /
``seq_lens_sum`` in the modules of the spec-v2 decode, draft, draft-extend and
verify paths is either guarded (a None-aware patchkit.runtime helper, an
``is None`` test around it, the decision's own branch), a plain copy of the
value (its uses are audited in turn), or on a path where the CPU mirror always
exists (listed below, each with the reason). Anything else fails.

Only parses files (ast); no sglang import. Run with ``-rP`` to see the list.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

import patchkit.runtime as runtime

pytestmark = pytest.mark.trees

PID = "needs-cpu-seq-lens"
MIRROR = ("seq_lens_cpu", "seq_lens_sum")
HELPERS = set(runtime.__all__)

# The modules of the spec-v2 paths (scheduler -> batch -> worker -> runners -> backend -> metrics).
MODULES = [
    "srt/managers/scheduler.py",
    "srt/managers/overlap_utils.py",
    "srt/managers/schedule_batch.py",
    "srt/managers/tp_worker.py",
    "srt/speculative/eagle_info_v2.py",
    "srt/speculative/eagle_worker_v2.py",
    "srt/speculative/eagle_utils.py",
    "srt/speculative/spec_utils.py",
    "srt/speculative/eagle_draft_cuda_graph_runner.py",
    "srt/speculative/eagle_draft_extend_cuda_graph_runner.py",
    "srt/model_executor/forward_batch_info.py",
    "srt/model_executor/cuda_graph_runner.py",
    "srt/layers/attention/triton_backend.py",
    "srt/observability/scheduler_metrics_mixin.py",
]

# Functions whose reads only run where the mirror always exists.
MIRROR_ALWAYS = {
    "ScheduleBatch.prepare_for_decode": "after `if not self.spec_algorithm.is_none(): return` (spec v2 decodes in "
    "EagleDraftInputV2Mixin.prepare_for_decode)",
    "ForwardBatch._compute_mrope_positions": "mrope models only; configure_needs_cpu_seq_lens keeps the mirror for them",
    "ForwardBatch.post_forward_mlp_sync_batch": "non-spec extend branch only (spec_info is None)",
    "CudaGraphRunner.capture_one_batch_size": "capture builds its own ForwardBatch with a mirror",
    "EAGLEDraftCudaGraphRunner.capture_one_batch_size": "capture builds its own ForwardBatch with a mirror",
    "EAGLEDraftExtendCudaGraphRunner.capture_one_batch_size": "capture builds its own ForwardBatch with a mirror",
    "TpModelWorker.forward_batch_split_prefill": "PD-multiplexing split prefill: never speculative",
}


@dataclass
class Read:
    file: str
    line: int
    where: str
    code: str
    verdict: str = ""
    why: str = ""


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _qualname(node: ast.AST, parents) -> str:
    names = []
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
    return ".".join(reversed(names))


def _none_test(test: ast.AST) -> bool:
    """Does ``test`` compare a mirror attribute (or a name holding it) with None?"""
    for node in ast.walk(test):
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops):
            if any(isinstance(c, ast.Constant) and c.value is None for c in node.comparators):
                left = node.left
                if (isinstance(left, ast.Attribute) and left.attr in MIRROR) or (
                    isinstance(left, ast.Name) and left.id in MIRROR
                ):
                    return True
    return False


def _decision_test(test: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "needs_cpu_seq_lens"
        for n in ast.walk(test)
    )


def _ancestors(node: ast.AST, parents, function: ast.AST):
    """(ancestor, the child of it on the way up) pairs, up to the function."""
    child, parent = node, parents.get(node)
    while parent is not None and parent is not function:
        yield parent, child
        child, parent = parent, parents.get(parent)


def classify(node: ast.AST, parents, function: ast.AST) -> tuple[str, str]:
    """(verdict, why) of one read; verdict '' = not accounted for."""
    for parent, child in _ancestors(node, parents, function):
        if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and parent.func.id in HELPERS:
            if child is not parent.func:
                return "guarded", f"argument of patchkit.runtime.{parent.func.id}()"
        if isinstance(parent, ast.Compare) and child is parent.left and _none_test(parent):
            return "guarded", "the None test itself"
    for parent, child in _ancestors(node, parents, function):
        if isinstance(parent, (ast.If, ast.IfExp)) and child is not parent.test:
            if _none_test(parent.test):
                return "guarded", "inside an `is None` / `is not None` test"
            if _decision_test(parent.test):
                return "guarded", "in the branch where needs_cpu_seq_lens() is True"
    # A plain copy of the value (possibly one branch of `a if c else b`).
    value, parent = node, parents.get(node)
    while isinstance(parent, ast.IfExp) and value is not parent.test:
        value, parent = parent, parents.get(parent)
    if isinstance(parent, ast.keyword) and parent.arg in MIRROR and value is parent.value:
        return "copy", f"passed on as {parent.arg}="
    if isinstance(parent, ast.Assign) and value is parent.value:
        targets = parent.targets
        if all(isinstance(t, ast.Attribute) and t.attr in MIRROR for t in targets):
            return "copy", "copied to " + ", ".join(ast.unparse(t) for t in targets)
        if all(isinstance(t, ast.Name) for t in targets):
            return "alias", ", ".join(t.id for t in targets)
    return "", ""


def audit(package: Path) -> list[Read]:
    reads: list[Read] = []
    for rel in MODULES:
        path = package / rel
        if not path.exists():
            continue
        source = path.read_text()
        tree = ast.parse(source)
        parents = _parents(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr in MIRROR and isinstance(node.ctx, ast.Load)):
                continue
            function = node
            while function in parents and not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                function = parents[function]
            where = _qualname(node, parents)
            read = Read(rel, node.lineno, where, ast.get_source_segment(source, node))
            verdict, why = classify(node, parents, function)
            if verdict == "alias":
                # A local holding the value: each use of it must be accounted for.
                uses = [
                    n
                    for n in ast.walk(function)
                    if isinstance(n, ast.Name) and n.id in why.split(", ") and isinstance(n.ctx, ast.Load)
                ]
                verdicts = [classify(n, parents, function) for n in uses]
                if uses and all(v and v != "alias" for v, _ in verdicts):
                    verdict, why = "guarded", f"held in {why}; its uses: " + "; ".join(w for _, w in verdicts)
                else:
                    verdict, why = "", f"held in {why}, used unguarded"
            if not verdict and isinstance(node.value, ast.Name) and node.value.id == "buffers":
                verdict, why = "mirror-always", "a CUDA-graph runner's static input buffer, not the batch's mirror"
            if not verdict and where in MIRROR_ALWAYS:
                verdict, why = "mirror-always", MIRROR_ALWAYS[where]
            read.verdict, read.why = verdict, why
            reads.append(read)
    return reads


def report(version: str, reads: list[Read]) -> str:
    lines = [f"seq_lens_cpu / seq_lens_sum reads in the spec-v2 modules of patched {version}: {len(reads)}"]
    for r in sorted(reads, key=lambda r: (r.file, r.line)):
        lines.append(f"  {r.file}:{r.line} {r.where}: {r.code}  [{r.verdict or 'UNGUARDED'}: {r.why}]")
    return "\n".join(lines)


@pytest.mark.parametrize("version", ["0.5.10", "0.5.11", "0.5.12.post1"])
def test_every_mirror_read_is_guarded_or_safe(make_tree, cli, version):
    tree = make_tree(version)
    assert cli("apply", tree, PID).exit_code == 0
    reads = audit(tree)
    print(report(version, reads))
    unguarded = [r for r in reads if not r.verdict]
    assert not unguarded, report(version, unguarded)
    # The patch's own sites are among the guarded reads.
    helpers = {r.where for r in reads if "patchkit.runtime" in r.why}
    assert {
        "ScheduleBatch.filter_batch",
        "ScheduleBatch.merge_batch",
        "ForwardBatch._pad_inputs_to_size",
        "CudaGraphRunner.replay_prepare",
        "EAGLEDraftExtendCudaGraphRunner.replay",
        "EagleDraftWorker.draft",
        "EagleDraftInputV2Mixin.prepare_for_extend_to_fill_draft_kvcache",
        "TritonAttnBackend.init_forward_metadata",
        "TritonMultiStepDraftBackend.common_template",
    } <= helpers
    # The premise of the first MIRROR_ALWAYS entry: spec returns before any read.
    source = (tree / "srt/managers/schedule_batch.py").read_text()
    method = next(
        n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == "prepare_for_decode"
    )
    spec_return = next(
        s.lineno
        for s in method.body
        if isinstance(s, ast.If) and "spec_algorithm.is_none()" in ast.unparse(s.test) and isinstance(s.body[-1], ast.Return)
    )
    first_read = min(r.line for r in reads if r.where == "ScheduleBatch.prepare_for_decode")
    assert spec_return < first_read


def test_the_pristine_tree_fails_the_audit(make_tree):
    """The audit has teeth: without the patch, the known consumers are unguarded."""
    tree = make_tree("0.5.12.post1")
    unguarded = {r.where for r in audit(tree) if not r.verdict}
    assert {
        "ScheduleBatch.filter_batch",
        "ScheduleBatch.merge_batch",
        "EagleDraftWorker.draft",
        "EagleDraftInputV2Mixin.prepare_for_extend_to_fill_draft_kvcache",
        "EagleDraftInputV2Mixin.prepare_for_decode",
        "TritonMultiStepDraftBackend.common_template",
    } <= unguarded
