"""Shapes found in real vendor forks, written into copies of the real files of
0.5.10 and 0.5.12.post1 (the forks themselves are not available):

1. the draft-extend CUDA-graph whitelist with more terms (extra names and
   calls first or last, a tuple isinstance, nested parentheses, a local);
2. a fork that already removed the seq_lens sync its own way (the mirror set
   to None, a helper of its own fills it later) and guards its metrics reads
   with None tests of every form.

Each variant runs the codemod on the forked real file (fast); the whole tree
(apply, verify, status, revert) runs once per release with one combination.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
from support import PRIMARY, carried_states, snapshot

from patchkit.codemods import needs_cpu_seq_lens_guards as guards
from patchkit.codemods import needs_cpu_seq_lens_sync as sync
from patchkit.codemods import trtllm_mha_draft_extend_v2 as dev2
from patchkit.codemods.common.base import State
from patchkit.fetch import fetch_tree
from patchkit.testing import run

pytestmark = pytest.mark.trees

RELEASES = ["0.5.10", PRIMARY]
WORKER = "srt/speculative/eagle_worker_v2.py"
SYNC = "srt/speculative/eagle_info_v2.py"
METRICS = "srt/observability/scheduler_metrics_mixin.py"
SUBJECT = "self.draft_extend_attn_backend"

# -- 1. the whitelist ------------------------------------------------------------------

WHITELISTS = {
    "extra-terms-last": """
        supports_cuda_draft_extend_graph = (_is_cuda or _is_hcu or _is_musa or is_cuda_draft_extend_device) and (
            isinstance(self.draft_extend_attn_backend, TritonAttnBackend)
            or isinstance(self.draft_extend_attn_backend, TRTLLMMLABackend)
            or is_nsa_draft_extend_backend
        )
    """,
    "extra-terms-first": """
        supports_cuda_draft_extend_graph = _is_cuda and (
            is_nsa_draft_extend_backend
            or self._vendor_graph_backend_ok()
            or isinstance(self.draft_extend_attn_backend, TritonAttnBackend)
            or isinstance(self.draft_extend_attn_backend, TRTLLMMLABackend)
        )
    """,
    "tuple-isinstance": """
        supports_cuda_draft_extend_graph = _is_cuda and (
            isinstance(self.draft_extend_attn_backend, (TritonAttnBackend, TRTLLMMLABackend))
            or is_nsa_draft_extend_backend
        )
    """,
    "nested-parentheses": """
        supports_cuda_draft_extend_graph = (_is_cuda and not _is_hip) and (
            (
                is_nsa_draft_extend_backend
                or (
                    (isinstance(self.draft_extend_attn_backend, TritonAttnBackend))
                    or isinstance(self.draft_extend_attn_backend, TRTLLMMLABackend)
                )
            )
        )
    """,
    "computed-in-a-local": """
        graph_backend_ok = is_nsa_draft_extend_backend or isinstance(
            self.draft_extend_attn_backend, (TritonAttnBackend, TRTLLMMLABackend)
        )
        supports_cuda_draft_extend_graph = _is_cuda and graph_backend_ok
    """,
}
EXTRA_TERMS = ("is_nsa_draft_extend_backend", "_vendor_graph_backend_ok")


def fork_whitelist(text: str, variant: str) -> str:
    """The real file with its whitelist assignment replaced by ``variant``."""
    found = re.search(r"\n( +)supports_cuda_draft_extend_graph = .*?\n\1\)\n", text, re.S)
    indent = found.group(1)
    lines = [line for line in WHITELISTS[variant].strip("\n").splitlines()]
    base = len(lines[0]) - len(lines[0].lstrip())
    new = "".join(indent + line[base:] + "\n" for line in lines)
    return text[: found.start() + 1] + new + text[found.end() :]


def whitelisted(text: str) -> tuple[set[str], set[str], int]:
    """(classes accepted by isinstance checks of the backend, names used,
    number of those checks) in the method that assigns the whitelist."""
    method = next(
        n
        for n in ast.walk(ast.parse(text))
        if isinstance(n, ast.FunctionDef) and "supports_cuda_draft_extend_graph" in ast.unparse(n)
    )
    classes, names, checks = set(), set(), 0
    for node in ast.walk(method):
        if (
            isinstance(node, ast.Call)
            and ast.unparse(node.func) == "isinstance"
            and ast.unparse(node.args[0]) == SUBJECT
        ):
            checks += 1
            kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            classes |= {ast.unparse(k) for k in kinds}
        if isinstance(node, (ast.Name, ast.Attribute)):
            names.add(node.id if isinstance(node, ast.Name) else node.attr)
    return classes, names, checks


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("variant", sorted(WHITELISTS))
def test_whitelist_variants_on_the_real_file(release, variant):
    forked = fork_whitelist((fetch_tree(release) / WORKER).read_text(), variant)
    compile(forked, WORKER, "exec")
    before, after, again = run(dev2.WhitelistTRTLLMHA, forked)
    assert (before, again) == (State.TODO, State.DONE)
    classes, names, checks = whitelisted(after)
    # One isinstance tuple with the MHA backend after MLA's; the fork's own terms stay.
    assert classes == {"TritonAttnBackend", "TRTLLMMLABackend", "TRTLLMHAAttnBackend"} and checks == 1
    assert re.search(r"\n +TRTLLMMLABackend,\n +TRTLLMHAAttnBackend,\n", after)
    assert {t for t in EXTRA_TERMS if t in WHITELISTS[variant]} <= names
    assert "from sglang.srt.layers.attention.trtllm_mha_backend import TRTLLMHAAttnBackend" in after
    assert run(dev2.WhitelistTRTLLMHA, after) == (State.DONE, after, State.DONE)


def test_whitelist_without_an_isinstance_disjunction_names_file_line_and_shape():
    forked = re.sub(
        r"\n( +)supports_cuda_draft_extend_graph = .*?\n\1\)\n",
        "\n        supports_cuda_draft_extend_graph = _is_cuda and vendor_backend_supports_graphs(self)\n",
        (fetch_tree(PRIMARY) / WORKER).read_text(),
        count=1,
        flags=re.S,
    )
    import libcst as cst
    from libcst.codemod import CodemodContext

    finding = dev2.WhitelistTRTLLMHA(CodemodContext(filename=WORKER)).detect(cst.parse_module(forked))
    line = next(i for i, text in enumerate(forked.splitlines(), 1) if "vendor_backend_supports_graphs(self)" in text)
    assert finding.state is State.MISSING
    assert f"{WORKER}:{line}:" in finding.detail
    assert "_is_cuda and vendor_backend_supports_graphs(self)" in finding.detail
    assert "the patch needs one (or a single isinstance(self.draft_extend_attn_backend, (...)) check)" in finding.detail


# -- 2. the mirror dropped by the fork, reads guarded by it -------------------------------

SYNC_LINES = re.compile(
    r"( +)# FIXME\(lsyin\): make this sync optional\n\1batch\.seq_lens_cpu = batch\.seq_lens\.cpu\(\)\n"
    r"\1batch\.seq_lens_sum = batch\.seq_lens_cpu\.sum\(\)\.item\(\)\n"
)


def fork_lazy_mirror(text: str, helper: str) -> str:
    """prepare_for_decode no longer copies seq_lens to the host; ``helper``
    (module level) fills the mirror for whoever needs it."""
    dropped = (
        rf"\1# vendor: no D2H here; {helper}() fills the mirror on demand"
        "\n"
        r"\1batch.seq_lens_cpu = None"
        "\n"
        r"\1batch.seq_lens_sum = None"
        "\n"
    )
    text, count = SYNC_LINES.subn(dropped, text)
    assert count == 1
    return text + (
        f"\n\ndef {helper}(batch):\n"
        "    if batch.seq_lens_cpu is None:\n"
        "        batch.seq_lens_cpu = batch.seq_lens.cpu()\n"
        "        batch.seq_lens_sum = batch.seq_lens_cpu.sum().item()\n"
        "    return batch.seq_lens_cpu\n"
    )


DECODE_SUM = re.compile(r"( +)self\.stats\.decode_sum_seq_lens = batch\.seq_lens_cpu\.sum\(\)\.item\(\)\n")
GUARD_FORMS = {
    "if-not-none": r"\1if batch.seq_lens_cpu is not None:"
    "\n"
    r"\1    self.stats.decode_sum_seq_lens = batch.seq_lens_cpu.sum().item()"
    "\n",
    "early-return": r"\1if batch.seq_lens_cpu is None:"
    "\n"
    r"\1    return"
    "\n"
    r"\1self.stats.decode_sum_seq_lens = batch.seq_lens_cpu.sum().item()"
    "\n",
    "conditional-expression": r"\1self.stats.decode_sum_seq_lens = batch.seq_lens_cpu.sum().item() if batch.seq_lens_cpu is not None else 0"
    "\n",
    "and": r"\1self.stats.decode_sum_seq_lens = batch.seq_lens_cpu is not None and batch.seq_lens_cpu.sum().item()"
    "\n",
    "not-none-in-an-and": r"\1if self.enable_metrics and batch.seq_lens_cpu is not None:"
    "\n"
    r"\1    self.stats.decode_sum_seq_lens = batch.seq_lens_cpu.sum().item()"
    "\n",
}
TOTAL_CONTEXT = re.compile(r"( +)total_context = float\(batch\.seq_lens_cpu\.sum\(\)\.item\(\)\)\n")
LOOP = re.compile(r"( +)for sl in batch\.seq_lens_cpu:\n")


def fork_guarded_metrics(text: str, form: str) -> str:
    """The metrics reads of the mirror, guarded by the fork (``form`` for the
    decode stats; an early return and a conditional expression elsewhere)."""
    text, count = DECODE_SUM.subn(GUARD_FORMS[form], text)
    assert count == 1
    text = TOTAL_CONTEXT.sub(
        r"\1if batch.seq_lens_cpu is None:"
        "\n"
        r"\1    return 0.0, 0.0, 0.0"
        "\n"
        r"\1total_context = float(batch.seq_lens_cpu.sum().item())"
        "\n",
        text,
    )
    return LOOP.sub(r"\1for sl in (batch.seq_lens_cpu if batch.seq_lens_cpu is not None else ()):" "\n", text)


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("helper", ["materialize_seq_lens_cpu", "_vendor_fill_cpu_mirror"])
def test_a_fork_that_dropped_the_sync_is_not_gated_again(release, helper):
    import libcst as cst
    from libcst.codemod import CodemodContext

    forked = fork_lazy_mirror((fetch_tree(release) / SYNC).read_text(), helper)
    finding = sync.GateDecodeSync(CodemodContext(filename=SYNC)).detect(cst.parse_module(forked))
    line = next(i for i, text in enumerate(forked.splitlines(), 1) if text.strip() == "batch.seq_lens_cpu = None")
    assert finding.state is State.SUPERSEDED
    assert (
        finding.detail
        == f"this tree avoids the seq_lens sync itself at {SYNC}:{line} (`batch.seq_lens_cpu = None`); patchkit leaves it as it is"
    )
    assert run(sync.GateDecodeSync, forked) == (State.SUPERSEDED, forked, State.SUPERSEDED)


METRIC_GUARDS = [guards.GuardDecodeStats, guards.GuardDecodePerfMetrics, guards.GuardScheduledRequestMetrics]


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("form", sorted(GUARD_FORMS))
def test_metrics_reads_guarded_by_the_fork_are_left_alone(release, form):
    forked = fork_guarded_metrics((fetch_tree(release) / METRICS).read_text(), form)
    compile(forked, METRICS, "exec")
    for codemod in METRIC_GUARDS:
        before, after, again = run(codemod, forked)
        if codemod is guards.GuardScheduledRequestMetrics and release == "0.5.10":
            assert before is State.SUPERSEDED  # no request metrics before 0.5.12
            continue
        assert (before, again) == (State.DONE, State.DONE), codemod
        assert after == forked


def fork_dropped_metric_reads(text: str) -> str:
    """The decode metrics no longer read the mirror: the fork sums the
    requests' own lengths (what decode_total_seq_lens does without it)."""
    text, count = DECODE_SUM.subn(
        r"\1self.stats.decode_sum_seq_lens = sum(req.seqlen for req in batch.reqs)" "\n", text
    )
    assert count == 1
    text, count = TOTAL_CONTEXT.subn(r"\1total_context = float(sum(req.seqlen for req in batch.reqs))" "\n", text)
    assert count == 1
    return text


@pytest.mark.parametrize("release", RELEASES)
def test_metrics_reads_the_fork_removed_are_its_own_change_not_a_missing_anchor(release):
    import libcst as cst
    from libcst.codemod import CodemodContext

    forked = fork_dropped_metric_reads((fetch_tree(release) / METRICS).read_text())
    for codemod, method in (
        (guards.GuardDecodePerfMetrics, "_estimate_decode_perf"),
        (guards.GuardDecodeStats, "report_decode_stats"),
    ):
        finding = codemod(CodemodContext(filename=METRICS)).detect(cst.parse_module(forked))
        line = next(i for i, t in enumerate(forked.splitlines(), 1) if t.strip().startswith(f"def {method}("))
        assert finding.state is State.SUPERSEDED and finding.by_tree, finding
        assert (
            finding.detail
            == f"this tree reads no CPU seq_lens mirror here ({METRICS}:{line}); patchkit has nothing to guard"
        )
        assert run(codemod, forked) == (State.SUPERSEDED, forked, State.SUPERSEDED)


def test_an_unguarded_read_in_a_shape_no_codemod_knows_names_file_line_and_shape():
    import libcst as cst
    from libcst.codemod import CodemodContext

    text = (fetch_tree(PRIMARY) / METRICS).read_text()
    forked, count = DECODE_SUM.subn(
        r"\1self.stats.decode_sum_seq_lens = int(batch.seq_lens_cpu.float().mean())" "\n", text
    )
    assert count == 1
    finding = guards.GuardDecodeStats(CodemodContext(filename=METRICS)).detect(cst.parse_module(forked))
    line = next(i for i, t in enumerate(forked.splitlines(), 1) if "seq_lens_cpu.float().mean()" in t)
    assert finding.state is State.MISSING
    assert finding.detail.startswith(
        f"{METRICS}:{line}: `batch.seq_lens_cpu` is read unguarded in a shape this change does not know"
    )
    assert finding.detail.endswith("seq_lens_cpu.sum().item() -> decode_total_seq_lens) or a None test around it")


# -- the whole tree, once per release ------------------------------------------------------


def _fork(tree: Path) -> None:
    for rel, edit in (
        (WORKER, lambda t: fork_whitelist(t, "extra-terms-last")),
        (SYNC, lambda t: fork_lazy_mirror(t, "materialize_seq_lens_cpu")),
        (METRICS, lambda t: fork_guarded_metrics(t, "if-not-none")),
    ):
        (tree / rel).write_text(edit((tree / rel).read_text()))


def _states(cli, tree) -> dict[str, dict]:
    result = cli("status", tree, "--format", "json")
    assert result.exit_code == 0, result.output
    return {p["id"]: p for p in json.loads(result.output)["patches"]}


@pytest.mark.parametrize("release", RELEASES)
def test_vendor_fork_applies_verifies_and_reverts_exactly(make_tree, cli, release):
    tree = make_tree(release)
    _fork(tree)
    forked = snapshot(tree)

    applied = cli("apply", tree)
    assert applied.exit_code == 0, applied.output
    states = _states(cli, tree)
    assert carried_states({pid: p["state"] for pid, p in states.items()}) == {"applied"}
    # One verdict for the sync, with its place; nothing claims another file owns it.
    line = next(
        i for i, t in enumerate((tree / SYNC).read_text().splitlines(), 1) if t.strip() == "batch.seq_lens_cpu = None"
    )
    notes = states["needs-cpu-seq-lens"]["notes"]
    assert (
        f"EagleDraftInputV2Mixin.prepare_for_decode: this tree avoids the seq_lens sync itself at {SYNC}:{line} (`batch.seq_lens_cpu = None`); patchkit leaves it as it is"
        in notes
    )
    assert not any("owns" in note for note in notes)
    # The fork's guarded metrics are left as they are; the parts that still mean something are there.
    assert snapshot(tree)[METRICS] == forked[METRICS]
    assert "configure_needs_cpu_seq_lens(" in (tree / "srt/managers/scheduler.py").read_text()
    assert "needs_cpu_seq_lens: bool = False" in (tree / "srt/layers/attention/trtllm_mla_backend.py").read_text()
    classes, names, _ = whitelisted((tree / WORKER).read_text())
    assert "TRTLLMHAAttnBackend" in classes and "is_nsa_draft_extend_backend" in names
    verified = cli("verify", tree)
    assert verified.exit_code == 0 and "verify: OK" in verified.output, verified.output
    audit = json.loads(cli("audit", tree, "--format", "json").output)
    assert audit["ok"], [r for r in audit["reads"] if r["verdict"] in ("unguarded", "stale")]

    assert cli("revert", tree).exit_code == 0
    assert snapshot(tree) == forked
