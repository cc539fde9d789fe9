"""The needs-cpu-seq-lens decision under DP attention, two-batch overlap, an
MoE all-to-all backend (DeepEP) and the DP LM head, taken by each real patched
tree's own code (docs/research/dp-attention.md).

0.5.10 .. 0.5.12.post1: the patched scheduler's own
``configure_needs_cpu_seq_lens(...)`` line in ``Scheduler.init_overlap``, run
with the tree's vendored runtime on a stand-in scheduler of each DP rank.
0.5.13 (patched) and 0.5.23 (released; patchkit changes nothing there):
upstream's ``decide_needs_cpu_seq_lens`` of the tree's
``managers/overlap_utils.py``. Neither reads the piecewise-CUDA-graph switch any
more (piecewise-no-forced-mirror, sglang #28633), so both of its values are
tried. The release's own parsing of the settings and the real backend classes
are checked on the imported 0.5.12.post1 modules in
tests/behaviour/test_dp_attention_behaviour.py.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
import types
from pathlib import Path
from types import SimpleNamespace as NS

import pytest
from dp_settings import SETTINGS, rank_view
from support import linked_copy

from patchkit.fetch import fetch_tree

pytestmark = pytest.mark.trees

PATCHKIT_DECISION = ["0.5.10", "0.5.11", "0.5.12.post1"]
#: The patches that write the decision (the scheduler's call and, on 0.5.13,
#: overlap_utils' rules); the backends' flags are checked in the behaviour test.
DECISION_PATCHES = ("needs-cpu-seq-lens", "piecewise-no-forced-mirror")
OPTED_OUT = (NS(needs_cpu_seq_lens=False),) * 3 + (None,)  # target, draft, draft extend, no 4th slot
KEEPS = OPTED_OUT[:2] + (NS(needs_cpu_seq_lens=True),)  # e.g. FlashInfer MLA as the draft-extend backend
DP_RANKS = range(4)


@pytest.fixture(scope="module")
def patched(tmp_path_factory):
    """patched(version) -> the package folder of a copy patched with the decision's patches."""
    from click.testing import CliRunner

    from patchkit.cli import main

    trees = {}

    def make(version):
        if version not in trees:
            package = linked_copy(fetch_tree(version), tmp_path_factory.mktemp(version) / "sglang")
            result = CliRunner().invoke(main, ["apply", str(package), *DECISION_PATCHES], catch_exceptions=False)
            assert result.exit_code == 0, result.output
            trees[version] = package
        return trees[version]

    return make


def vendored_runtime(package: Path):
    """The patched tree's own copy of patchkit's runtime (what the server imports)."""
    name = f"dp_runtime_{abs(hash(str(package)))}"
    spec = importlib.util.spec_from_file_location(name, package / "srt/_patchkit/runtime/seq_lens.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def scheduler_decision(package: Path):
    """decision(self) -> the value of the patched ``init_overlap``'s own
    ``configure_needs_cpu_seq_lens(...)`` statement for stand-in ``self``."""
    runtime = vendored_runtime(package)
    source = (package / "srt/managers/scheduler.py").read_text()
    call = next(
        line.strip() for line in source.splitlines() if line.strip().startswith("configure_needs_cpu_seq_lens(")
    )
    assert "piecewise_reads_mirror=False" in call

    def decide(me):
        try:
            eval(call, {"configure_needs_cpu_seq_lens": runtime.configure_needs_cpu_seq_lens, "self": me})
            return runtime.needs_cpu_seq_lens()
        finally:
            runtime.set_needs_cpu_seq_lens(True)

    return decide


class _Algorithm:
    """sglang's ``SpeculativeAlgorithm.from_string(name)``, as far as the decision reads it."""

    def __init__(self, name):
        self.name = (name or "").upper()

    @classmethod
    def from_string(cls, name):
        return cls(name)

    def is_ngram(self):
        return self.name == "NGRAM"


def upstream_decision(package: Path, monkeypatch):
    """decision(self) -> what the tree's ``overlap_utils.decide_needs_cpu_seq_lens``
    returns for the backends of stand-in ``self`` (0.5.13: ``(server_args,
    backends)``; 0.5.23: ``(backends)``, the args read through ``get_exec()`` /
    ``get_spec()``). The function is run by itself, its module's imports left out."""
    tree = ast.parse((package / "srt/managers/overlap_utils.py").read_text())
    function = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "decide_needs_cpu_seq_lens")
    spec_info = types.ModuleType("sglang.srt.speculative.spec_info")
    spec_info.SpeculativeAlgorithm = _Algorithm
    monkeypatch.setitem(sys.modules, spec_info.__name__, spec_info)
    namespace = {
        "SpeculativeAlgorithm": _Algorithm,
        "Sequence": object,
        "AttentionBackend": object,
        "ServerArgs": object,
    }
    exec(compile(ast.Module(body=[function], type_ignores=[]), str(package), "exec"), namespace)
    decide = namespace["decide_needs_cpu_seq_lens"]
    takes_args = len(function.args.args) == 2

    def run(me):
        backends = me.draft_worker.spec_v2_attn_backends
        if takes_args:
            return decide(me.server_args, backends)
        namespace["get_exec"] = lambda: NS(overlap=me.server_args)
        namespace["get_spec"] = lambda: me.server_args
        return decide(backends)

    return run


def decisions(decide, fields, backends):
    """The decision of every DP rank, for both values of the piecewise switch."""
    return {
        decide(
            rank_view(
                NS(**{"enable_two_batch_overlap": False, **fields, "disable_piecewise_cuda_graph": pcg_off}),
                backends,
                rank,
            )
        )
        for pcg_off in (True, False)
        for rank in DP_RANKS
    }


@pytest.mark.parametrize("version", PATCHKIT_DECISION)
def test_patchkits_decision_per_setting(patched, version):
    decide = scheduler_decision(patched(version))
    for name, (fields, keeps_mirror) in SETTINGS.items():
        assert decisions(decide, fields, OPTED_OUT) == {keeps_mirror}, name
        assert decisions(decide, fields, KEEPS) == {True}, name


def test_0_5_13_upstreams_decision_per_setting(patched, monkeypatch):
    decide = upstream_decision(patched("0.5.13"), monkeypatch)
    for name, (fields, keeps_mirror) in SETTINGS.items():
        assert decisions(decide, fields, OPTED_OUT) == {keeps_mirror}, name
        assert decisions(decide, fields, KEEPS) == {True}, name


def test_0_5_23_upstreams_decision_per_setting(monkeypatch):
    """The newest release: the same rules (only TBO keeps the mirror; DP
    attention, DeepEP and the DP LM head do not enter the decision)."""
    decide = upstream_decision(fetch_tree("0.5.23"), monkeypatch)
    for name, (fields, keeps_mirror) in SETTINGS.items():
        assert decisions(decide, fields, OPTED_OUT) == {keeps_mirror}, name
        assert decisions(decide, fields, KEEPS) == {True}, name
