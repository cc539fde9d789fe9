"""Vendor forks V (issue 55): five code shapes real forks tripped on, each a
synthetic fork (small edits written here on a real release tree), and the
messages a fork maintainer reads.

1. an early metrics mixin: upstream's move to observability/ carried onto
   0.5.9, with ``log_decode_stats`` and none of the methods that replaced it;
2. a local guard the audit did not see (``x = batch.seq_lens_sum`` then
   ``if x is None: x = bound``), on a fork and on pristine 0.5.13;
3. 0.5.13's metrics reporter in a fork of 0.5.12.post1 (before #26128);
4. a third backend in the draft-extend whitelist chain;
5. a draft-extend runner with upstream's guard and a padded sum of the
   vendor's own beside it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support import NATIVE, PRIMARY, carries_every_patch, edit_file, patch_states

from patchkit.audit import audit_tree
from patchkit.fetch import fetch_tree

pytestmark = pytest.mark.trees

DECISION = "needs-cpu-seq-lens"
METRICS = "srt/observability/scheduler_metrics_mixin.py"
REPORTER = "srt/managers/scheduler_components/metrics_reporter.py"
TRITON = "srt/layers/attention/triton_backend.py"
WORKER = "srt/speculative/eagle_worker_v2.py"
RUNNER = "srt/speculative/eagle_draft_extend_cuda_graph_runner.py"


def _move(tree: Path, old_rel: str, new_rel: str, rename: tuple[str, str] = ("", "")) -> None:
    """The fork moved a module (and perhaps renamed a class in it): its importers follow."""
    old_mod, new_mod = ("sglang." + r[:-3].replace("/", ".") for r in (old_rel, new_rel))
    for folder in Path(new_rel).parents:
        if folder != Path("."):
            (tree / folder).mkdir(exist_ok=True)
            (tree / folder / "__init__.py").touch()
    (tree / new_rel).write_text(
        (tree / old_rel).read_text().replace(*rename) if rename[0] else (tree / old_rel).read_text()
    )
    (tree / old_rel).unlink()
    for path in (tree / "srt").rglob("*.py"):
        data = path.read_bytes()
        if old_mod.encode() in data:
            text = data.decode().replace(old_mod, new_mod)
            path.write_text(text.replace(*rename) if rename[0] else text)


def _paths_named_once_and_relative(output: str, tree: Path, rel: str) -> None:
    for line in output.splitlines():
        assert str(tree) not in line, line
        assert line.count(rel) <= 1, line


# -- 1. an early metrics mixin -----------------------------------------------------------


def test_an_early_metrics_mixincarries_every_patch(make_tree, cli):
    tree = make_tree("0.5.9")
    _move(tree, "srt/managers/scheduler_metrics_mixin.py", METRICS)
    # 0.5.9 expands NSA's verify lengths on the host: dsa-no-mirror moves that expansion to the device
    output = carries_every_patch(cli, tree)
    # The read the fork has is guarded; a replacement in a module the release lacks there, said once, relative.
    assert f"{METRICS}:" in output and "GuardLogDecodeStats" in output
    _paths_named_once_and_relative(output, tree, METRICS)
    cli("apply", tree)
    assert "decode_sum_seq_lens = decode_total_seq_lens(batch)" in (tree / METRICS).read_text()
    notes = patch_states(cli, tree, DECISION)[DECISION]["notes"]
    # The methods the fork does not have are nothing to guard: said, not a missing anchor.
    assert any("has no _estimate_decode_perf" in n and "nothing to guard" in n for n in notes), notes


# -- 2. a local guard ----------------------------------------------------------------------

LOCAL_GUARD = """                seq_lens_sum = forward_batch.seq_lens_sum
                if seq_lens_sum is None:
                    seq_lens_sum = bs * self.max_context_len
                kv_indices = torch.empty(
                    seq_lens_sum, dtype=torch.int64, device=self.device
                )
"""
RELEASE_SIZE = """                kv_indices = torch.empty(
                    forward_batch.seq_lens_sum, dtype=torch.int64, device=self.device
                )
"""


def test_a_local_guard_is_audited_as_guarded_andcarries_every_patch(make_tree, cli):
    tree = make_tree(PRIMARY)
    edit_file(tree, TRITON, RELEASE_SIZE, LOCAL_GUARD)
    line = next(
        i
        for i, t in enumerate((tree / TRITON).read_text().splitlines(), 1)
        if t.strip() == "seq_lens_sum = forward_batch.seq_lens_sum"
    )
    [read] = [r for r in audit_tree(tree).reads if r.file == TRITON and r.line == line]
    assert read.verdict == "guarded" and f"fills it at line {line + 1}" in read.why, read
    carries_every_patch(cli, tree)


def test_pristine_0_5_13_lists_no_guarded_read_as_unguarded():
    result = audit_tree(fetch_tree(NATIVE))
    unguarded = {(r.file, r.function) for r in result.reads if r.verdict == "unguarded"}
    for site in (
        (TRITON, "TritonAttnBackend.init_forward_metadata"),
        (TRITON, "TritonMultiStepDraftBackend.common_template"),
        (WORKER, "EagleDraftWorker.draft"),
    ):
        assert site not in unguarded
        assert any(
            r.verdict == "guarded" and "fills it at line" in r.why for r in result.reads if (r.file, r.function) == site
        ), site


# -- 3. 0.5.13's metrics reporter before 0.5.13 ------------------------------------------------


def test_the_metrics_reporter_of_a_fork_before_0_5_13carries_every_patch(make_tree, cli):
    tree = make_tree(PRIMARY)
    _move(tree, METRICS, REPORTER, ("SchedulerMetricsMixin", "SchedulerMetricsReporter"))
    assert "for sl in batch.seq_lens_cpu:" in (tree / REPORTER).read_text()
    # The module this fork moved away is not in this tree: said so, not "removed upstream in 0.5.13".
    notes = patch_states(cli, tree, DECISION)[DECISION]["notes"]
    assert f"{METRICS}: not applicable here (not in this tree)" in notes, notes
    output = carries_every_patch(cli, tree)
    assert "GuardReporterScheduledRequestMetrics" in output
    _paths_named_once_and_relative(output, tree, REPORTER)
    cli("apply", tree)
    assert "for sl in decode_seq_lens(batch):" in (tree / REPORTER).read_text()


def test_upstream_s_reporter_is_native():
    report = patch_states_of(fetch_tree(NATIVE))
    assert report[DECISION] == "native"


def patch_states_of(package: Path) -> dict[str, str]:
    from click.testing import CliRunner

    from patchkit.cli import main

    out = CliRunner().invoke(main, ["status", str(package), "--format", "json"]).output
    return {p["id"]: p["state"] for p in json.loads(out)["patches"]}


# -- 4. a third backend in the whitelist -------------------------------------------------------


def test_a_third_backend_in_the_whitelist_chaincarries_every_patch(make_tree, cli):
    tree = make_tree(PRIMARY)
    release = "            or isinstance(self.draft_extend_attn_backend, TRTLLMMLABackend)\n"
    vendor = "            or isinstance(self.draft_extend_attn_backend, AcmeMLABackend)\n"
    edit_file(tree, WORKER, release, release + vendor)
    carries_every_patch(cli, tree)
    cli("apply", tree)
    text = (tree / WORKER).read_text()
    # The vendor's term stays as written; TRT-LLM MHA joins the chain.
    assert release + vendor + "            or isinstance(self.draft_extend_attn_backend, TRTLLMHAAttnBackend)\n" in text


# -- 5. a draft-extend runner of the vendor's own ------------------------------------------------

RELEASE_REPLAY = """            seq_lens=buffers.seq_lens,
            seq_lens_sum=forward_batch.seq_lens_sum
            + (bs - raw_bs) * self.seq_len_fill_value,
"""
VENDOR_REPLAY = """            seq_lens=buffers.seq_lens,
            seq_lens_sum=seq_lens_sum,
"""
VENDOR_SUM = """        seq_lens_sum = forward_batch.seq_lens_sum
        if seq_lens_sum is not None:
            seq_lens_sum = seq_lens_sum + (bs - raw_bs) * self.seq_len_fill_value
        self.acme_padded_sum = forward_batch.seq_lens_sum + (bs - raw_bs) * self.seq_len_fill_value
        self.draft_extend_attn_backend.init_forward_metadata_replay_cuda_graph(
"""


def _fork_runner(tree: Path, vendor_line: str) -> None:
    edit_file(tree, RUNNER, RELEASE_REPLAY, VENDOR_REPLAY)
    edit_file(
        tree,
        RUNNER,
        "        self.draft_extend_attn_backend.init_forward_metadata_replay_cuda_graph(\n",
        VENDOR_SUM.replace(
            "        self.acme_padded_sum = forward_batch.seq_lens_sum + (bs - raw_bs) * self.seq_len_fill_value\n",
            vendor_line,
        ),
    )


def test_the_vendor_s_padded_sum_in_its_runner_is_kept_guarded_and_said(make_tree, cli):
    tree = make_tree(PRIMARY)
    _fork_runner(
        tree, "        self.acme_padded_sum = forward_batch.seq_lens_sum + (bs - raw_bs) * self.seq_len_fill_value\n"
    )
    carries_every_patch(cli, tree)
    cli("apply", tree)
    text = (tree / RUNNER).read_text()
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "self.acme_padded_sum = " in t)
    assert text.splitlines()[line - 1].strip() == (
        "self.acme_padded_sum = add_or_none(forward_batch.seq_lens_sum, (bs - raw_bs) * self.seq_len_fill_value)"
    )
    notes = patch_states(cli, tree, DECISION)[DECISION]["notes"]
    assert (
        f"EAGLEDraftExtendCudaGraphRunner.replay: the vendor's own padded sum at {RUNNER}:{line} is kept, "
        "guarded by add_or_none beside upstream's guard"
    ) in notes, notes


def test_a_runner_read_no_guard_fits_is_the_vendor_s_in_one_warning_line(make_tree, cli):
    """A read of the vendor's own code that no guard fits stays the vendor's
    to guard (README and docs/ci.md say the same): apply writes the rest and
    ends with one line counting such reads; the audit names it at its line."""
    tree = make_tree(PRIMARY)
    _fork_runner(tree, "        self.acme_mean = float(forward_batch.seq_lens_sum) / raw_bs\n")
    result = cli("apply", tree)
    assert result.exit_code == 0 and "not applied" not in result.output, result.output
    assert result.stderr.strip().splitlines()[-1] == (
        "audit: 1 read(s) of the CPU seq_lens mirror in the vendor's own code are unguarded or stale once it is "
        "dropped (`patchkit audit TREE` lists them)"
    )
    on_disk = next(i for i, t in enumerate((tree / RUNNER).read_text().splitlines(), 1) if "self.acme_mean" in t)
    listed = cli("audit", tree).output.splitlines()
    assert any(
        ln.startswith(f"{tree / RUNNER}:{on_disk}: unguarded: EAGLEDraftExtendCudaGraphRunner.replay") for ln in listed
    )


# -- messages ----------------------------------------------------------------------------------


def test_a_missing_anchor_is_refused_in_one_line_with_what_to_do(make_tree, cli):
    tree = make_tree(PRIMARY)
    edit_file(
        tree,
        WORKER,
        "        supports_cuda_draft_extend_graph = (_is_cuda or _is_musa) and (\n"
        "            isinstance(self.draft_extend_attn_backend, TritonAttnBackend)\n"
        "            or isinstance(self.draft_extend_attn_backend, TRTLLMMLABackend)\n"
        "        )\n",
        "        supports_cuda_draft_extend_graph = acme_graph_ok(self)\n",
    )
    # status and verify say the same of it.
    status = patch_states(cli, tree, "trtllm-mha-draft-extend-v2")["trtllm-mha-draft-extend-v2"]
    assert status["state"] == "not-applicable"
    assert "trtllm-mha-draft-extend-v2: not-applicable" in cli("verify", tree).output.splitlines()[-1]
    text = cli("status", tree, "trtllm-mha-draft-extend-v2").output
    assert re.search(r"trtllm-mha-draft-extend-v2\s+not-applicable\s+\(.*; verify fails on it\)", text), text
    on_disk = next(i for i, t in enumerate((tree / WORKER).read_text().splitlines(), 1) if "acme_graph_ok(self)" in t)
    assert f"({WORKER}:{on_disk}: EagleDraftWorker." in text  # the path once, with the line
    result = cli("apply", tree)
    [line] = [ln for ln in result.output.splitlines() if ln.startswith("not applied: trtllm-mha-draft-extend-v2: ")]
    # The line of the file as the apply leaves it (other patches add imports above it).
    on_disk = next(i for i, t in enumerate((tree / WORKER).read_text().splitlines(), 1) if "acme_graph_ok(self)" in t)
    assert line.startswith(f"not applied: trtllm-mha-draft-extend-v2: refused: {WORKER}:{on_disk}: ")
    assert line.endswith("or `--skip trtllm-mha-draft-extend-v2` (the other patches still apply)")
    _paths_named_once_and_relative(result.output, tree, WORKER)
