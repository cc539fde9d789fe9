"""``patchkit audit`` (patchkit/audit/__init__.py) on real trees: every read of the CPU
seq_lens mirror on the spec-v2 paths of the patched tree is guarded, patched or
safe; the pristine tree has the unguarded ones the patch exists for; reads a
vendor plants where no patch knows about them are found and classified, each
once. Run with ``-rP`` to see the list.
"""

from __future__ import annotations

import ast
import json
from collections import Counter

import libcst as cst
import pytest
from support import PRIMARY

from patchkit.audit import MODULES, audit_tree, to_text
from patchkit.codemods.common import primitives

pytestmark = pytest.mark.trees

PID = "needs-cpu-seq-lens"

# The patch's own sites: on the patched tree, handled by it.
PATCH_SITES = {
    "ScheduleBatch.filter_batch",
    "ScheduleBatch.merge_batch",
    "ForwardBatch._pad_inputs_to_size",
    "CudaGraphRunner.replay_prepare",
    "EAGLEDraftExtendCudaGraphRunner.replay",
    "EagleDraftWorker.draft",
    "EagleDraftInputV2Mixin.prepare_for_decode",
    "EagleDraftInputV2Mixin.prepare_for_extend_to_fill_draft_kvcache",
    "TritonAttnBackend.init_forward_metadata",
    "TritonMultiStepDraftBackend.common_template",
}


@pytest.mark.parametrize("version", ["0.5.10", PRIMARY])
def test_every_mirror_read_of_the_patched_tree_is_accounted_for(make_tree, cli, version):
    tree = make_tree(version)
    assert cli("apply", tree, PID).exit_code == 0
    result = audit_tree(tree)
    print(to_text(result, str, verbose=True))
    assert result.ok, to_text(result, str)
    assert PATCH_SITES <= {r.function for r in result.reads if r.verdict == "patched"}
    assert all(r.patch == PID for r in result.reads if r.verdict == "patched")
    # The premise of the first MIRROR_ALWAYS entry: spec returns before any read.
    source = (tree / "srt/managers/schedule_batch.py").read_text()
    method = next(
        n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == "prepare_for_decode"
    )
    spec_return = next(
        s.lineno
        for s in method.body
        if isinstance(s, ast.If)
        and "spec_algorithm.is_none()" in ast.unparse(s.test)
        and isinstance(s.body[-1], ast.Return)
    )
    assert spec_return < min(r.line for r in result.reads if r.function == "ScheduleBatch.prepare_for_decode")
    # verify names the count and points to the audit.
    verified = cli("verify", tree)
    assert "audit: 0 read(s) of the CPU seq_lens mirror unguarded or stale" in verified.output


def test_the_pristine_tree_has_the_reads_the_patch_guards(make_tree, cli):
    """The audit has teeth: without the patch, the known consumers are unguarded."""
    tree = make_tree(PRIMARY)
    result = audit_tree(tree)
    assert {r.function for r in result.reads if r.verdict == "unguarded"} >= PATCH_SITES - {
        "EagleDraftInputV2Mixin.prepare_for_decode"  # the sync itself: the mirror was just set
    }
    assert not any(r.verdict == "patched" for r in result.reads)
    strict = cli("audit", tree, "--strict")
    assert strict.exit_code == 1 and "unguarded: ScheduleBatch.filter_batch" in strict.output
    assert cli("audit", tree).exit_code == 0


# A vendor's own reads: (module, class, method, statements, {marker: verdict}).
# Each statement carries `# planted:<marker>`; the reads on that line get the verdict (None: no read there).
PLANTED = [
    (
        "srt/model_executor/cuda_graph_runner.py",
        "CudaGraphRunner",
        "replay_prepare",
        # NVTX labels from the runner's CPU buffer: stale once the mirror is dropped.
        "nvtx_label = f'bs={raw_bs} seq_lens={self.buffers.seq_lens_cpu[:raw_bs].tolist()}'  # planted:nvtx\n"
        # Filling the buffer is a write, not a read.
        "self.buffers.seq_lens_cpu[:raw_bs] = 0  # planted:buffer-write\n",
        {"nvtx": "stale", "buffer-write": None},
    ),
    (
        "srt/speculative/eagle_worker_v2.py",
        "EagleDraftWorker",
        "draft",
        "logger.debug('draft seq lens %s', model_worker_batch.seq_lens_cpu.tolist())  # planted:log\n"
        "if model_worker_batch.seq_lens_sum is None:  # planted:early-test\n"
        "    return None\n"
        "profile_tokens = model_worker_batch.seq_lens_sum  # planted:after-early-return\n",
        {"log": "unguarded", "early-test": "guarded", "after-early-return": "guarded"},
    ),
    (
        "srt/observability/scheduler_metrics_mixin.py",
        "SchedulerMetricsMixin",
        "report_decode_stats",
        "if batch.seq_lens_cpu is not None:  # planted:metrics-if\n"
        "    self.stats.max_seq_len = int(batch.seq_lens_cpu.max())  # planted:metrics-guarded\n"
        "total = batch.seq_lens_sum if batch.seq_lens_sum is not None else 0  # planted:ifexp\n"
        "longest = batch.seq_lens_cpu is not None and batch.seq_lens_cpu.max()  # planted:and\n"
        "for req_batch in [batch]:  # planted:loop\n"
        "    if req_batch.seq_lens_cpu is None:  # planted:loop-test\n"
        "        continue\n"
        "    self.stats.min_seq_len = int(req_batch.seq_lens_cpu.min())  # planted:after-continue\n"
        "self.stats.last_sum = batch.seq_lens_sum  # planted:metrics-unguarded\n",
        {
            "metrics-if": "guarded",
            "metrics-guarded": "guarded",
            "ifexp": "guarded",
            "and": "guarded",
            "loop-test": "guarded",
            "after-continue": "guarded",
            "metrics-unguarded": "unguarded",
        },
    ),
]


def _plant(package, rel: str, cls: str, method: str, source: str) -> None:
    path = package / rel
    module = cst.parse_module(path.read_bytes())
    module = primitives.replace_class(
        module, cls, lambda c: primitives.replace_method(c, method, lambda fn: primitives.insert_at_start(fn, source))
    )
    path.write_bytes(module.bytes)


def test_planted_vendor_reads_are_found_and_classified_once(make_tree, cli):
    tree = make_tree(PRIMARY)
    assert cli("apply", tree).exit_code == 0
    before = audit_tree(tree)
    assert before.ok
    for rel, cls, method, source, _ in PLANTED:
        _plant(tree, rel, cls, method, source)
    result = audit_tree(tree)
    print(to_text(result, str, verbose=True))

    expected = {}
    for rel, _, _, _, verdicts in PLANTED:
        lines = (tree / rel).read_text().splitlines()
        for marker, verdict in verdicts.items():
            line = next(i for i, text in enumerate(lines, 1) if text.endswith(f"# planted:{marker}"))
            expected[(rel, line)] = verdict
    planted = [r for r in result.reads if (r.file, r.line) in expected]
    assert {(r.file, r.line) for r in planted} == {k for k, v in expected.items() if v is not None}
    for r in planted:
        assert r.verdict == expected[(r.file, r.line)], (r, expected[(r.file, r.line)])
    # Nothing reported twice, nothing else changed verdict.
    assert not [k for k, n in Counter((r.file, r.line, r.column) for r in result.reads).items() if n > 1]
    assert len(result.reads) == len(before.reads) + len(planted)
    assert Counter(r.verdict for r in result.reads if (r.file, r.line) not in expected) == Counter(
        r.verdict for r in before.reads
    )
    # The CLI: text lists exactly the problems; json carries every read; --strict fails.
    text = cli("audit", tree)
    problems = [line for line in text.output.splitlines() if ": unguarded: " in line or ": stale: " in line]
    assert len(problems) == sum(v in ("unguarded", "stale") for v in expected.values())
    assert any("stale: CudaGraphRunner.replay_prepare: self.buffers.seq_lens_cpu" in line for line in problems)
    doc = json.loads(cli("audit", tree, "--format", "json").output)
    assert doc["schema"] == "patchkit.audit/1" and doc["ok"] is False
    assert doc["summary"]["total"] == len(result.reads) and doc["summary"]["stale"] == 1
    # Every module that reads the mirror, across the tree (not only MODULES).
    assert set(doc["modules"]) == {r.file for r in result.reads} > set(MODULES) & set(doc["modules"])
    assert {rel for rel, *_ in PLANTED} <= set(doc["modules"])
    assert {r["origin"] for r in doc["reads"] if (r["file"], r["line"]) in expected} == {"vendor"}
    assert cli("audit", tree, "--strict").exit_code == 1
    assert "audit: 3 read(s) of the CPU seq_lens mirror unguarded or stale" in cli("verify", tree).output


def test_verify_names_the_audit_count_and_caches_it(make_tree, cli, monkeypatch):
    """verify's audit line is computed once per content of the audited files
    (the audit parses 14 modules), then read from .patchkit/cache.json."""
    from patchkit import audit

    tree = make_tree(PRIMARY)
    assert cli("apply", tree).exit_code == 0
    first = cli("verify", tree)
    assert "audit: 0 read(s) of the CPU seq_lens mirror" in first.output

    def refuse(package):
        raise AssertionError("verify audited files whose count it had cached")

    monkeypatch.setattr(audit, "audit_tree", refuse)
    again = cli("verify", tree)
    assert again.exit_code == 0 and again.output == first.output
    scheduler = tree / "srt/managers/scheduler.py"
    scheduler.write_text(scheduler.read_text() + "\n# edited\n")
    with pytest.raises(AssertionError, match="cached"):
        cli("verify", tree)  # other bytes: the audit runs again
