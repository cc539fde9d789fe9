"""``patchkit audit`` walks the whole tree: modules a vendor adds (an attention
backend subclassing a real one, a multi-step draft wrapper, a spec-decoding
worker, a model, a helper), dropped into a copy of a real release, are found
and each read classified, unpatched and patched; ``apply`` ends with one line
naming the vendor's unguarded reads. One apply for the module (shared tree).
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from support import PRIMARY

from patchkit import audit
from patchkit.audit import facts as audit_facts
from patchkit.cli import main
from patchkit.fetch import copy_tree

pytestmark = pytest.mark.trees

# Written for these tests (no sglang source): rel -> code. Each read's line
# ends with `# v:<verdict>`.
VENDOR = {
    # A base in a module that never names the mirror: the inheritance walk finds it.
    "srt/layers/attention/acme_base.py": (
        "from sglang.srt.layers.attention.triton_backend import TritonAttnBackend\n\n\n"
        "class AcmeTritonBase(TritonAttnBackend):\n"
        "    pass\n"
    ),
    "srt/layers/attention/acme_backends.py": (
        "from sglang.srt.layers.attention.base_attn_backend import AttentionBackend\n"
        "from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend\n"
        "from sglang.srt.layers.attention.acme_base import AcmeTritonBase\n\n\n"
        "class AcmeKeepsBackend(FlashInferAttnBackend):\n"
        "    # inherits needs_cpu_seq_lens = True: the mirror is kept whenever it runs\n"
        "    def init_forward_metadata(self, forward_batch):\n"
        "        self.max_len = int(forward_batch.seq_lens_cpu.max())  # v:safe\n\n\n"
        "class AcmeCompressedBackend(AcmeTritonBase):\n"
        "    # DeepSeek-V4-style compressed attention on top of Triton (opted out by the patch)\n"
        "    def init_forward_metadata(self, forward_batch):\n"
        "        total = forward_batch.seq_lens_sum  # v:unguarded\n"
        "        if forward_batch.seq_lens_cpu is not None:  # v:guarded\n"
        "            self.lens = forward_batch.seq_lens_cpu.tolist()  # v:guarded\n"
        "        return total\n\n\n"
        "class AcmeSparseBackend(AttentionBackend):\n"
        "    needs_cpu_seq_lens = False\n\n"
        "    def init_forward_metadata(self, forward_batch):\n"
        "        assert forward_batch.seq_lens_cpu is not None  # v:unguarded\n"
        "        return forward_batch.seq_lens_sum if forward_batch.seq_lens_sum is not None else 0  # v:guarded\n\n\n"
        "class AcmeMultiStepDraftBackend:\n"
        "    # a multi-step draft wrapper holding opted-out step backends\n"
        "    def __init__(self, model_runner, steps):\n"
        "        self.attn_backends = [AcmeCompressedBackend(model_runner) for _ in range(steps)]\n\n"
        "    def init_forward_metadata(self, forward_batch):\n"
        "        bound = forward_batch.seq_lens_sum * 2  # v:unguarded\n"
        "        for backend in self.attn_backends:\n"
        "            backend.init_forward_metadata_capture_cuda_graph(forward_batch.seq_lens_cpu)  # v:safe\n"
        "        return bound\n\n\n"
        "class AcmeKeepsMultiStepBackend:\n"
        "    def __init__(self, model_runner):\n"
        "        self.attn_backends = [AcmeKeepsBackend(model_runner)]\n\n"
        "    def init_forward_metadata(self, forward_batch):\n"
        "        return forward_batch.seq_lens_sum + 1  # v:safe\n"
    ),
    "srt/speculative/acme_dflash_worker_v2.py": (
        "from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2\n\n\n"
        "class AcmeDFlashWorkerV2(EAGLEWorkerV2):\n"
        "    def verify(self, batch):\n"
        "        lens = batch.seq_lens_cpu.tolist()  # v:unguarded\n"
        "        if batch.seq_lens_sum is None:  # v:guarded\n"
        "            return lens\n"
        "        batch.seq_lens_sum += len(lens)  # v:guarded\n"
        "        return lens\n"
    ),
    # A spec-v2 worker of the vendor's own that lists no attention backends:
    # the decision keeps the mirror whenever it runs (issue 45 §5).
    "srt/speculative/acme_own_worker_v2.py": (
        "from sglang.srt.speculative.acme_own_info import draft_lens\n\n\n"
        "class AcmeOwnWorkerV2:\n"
        "    def __init__(self, target_worker):\n"
        "        self.target_worker = target_worker\n\n"
        "    def verify(self, batch):\n"
        "        return batch.seq_lens_cpu.tolist(), draft_lens(batch)  # v:kept-mirror\n"
    ),
    "srt/speculative/acme_own_info.py": (
        "def draft_lens(batch):\n    return batch.seq_lens_sum + 1  # v:kept-mirror\n"
    ),
    "srt/models/acme_v4.py": (
        "from torch import nn\n\n\n"
        "class AcmeV4ForCausalLM(nn.Module):\n"
        "    def forward(self, input_ids, positions, forward_batch):\n"
        "        if getattr(forward_batch, 'seq_lens_cpu', None) is not None:\n"
        "            self.longest = forward_batch.seq_lens_cpu.max()  # v:guarded\n"
        "        return forward_batch.seq_lens_sum  # v:unguarded\n"
    ),
    "srt/utils/acme_helpers.py": (
        "def total_tokens(batch):\n"
        "    return int(batch.seq_lens_cpu.sum())  # v:unguarded\n\n\n"
        "def total_tokens_or_none(batch):\n"
        "    if batch.seq_lens_cpu is None:  # v:guarded\n"
        "        return None\n"
        "    return int(batch.seq_lens_cpu.sum())  # v:guarded\n"
    ),
}
PROBLEMS = sum(code.count("# v:unguarded") for code in VENDOR.values())


def expected() -> dict[tuple[str, int], str]:
    found = {}
    for rel, code in VENDOR.items():
        for number, line in enumerate(code.splitlines(), 1):
            if "# v:" in line:
                found[(rel, number)] = line.rsplit("# v:", 1)[1]
    return found


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    """(unpatched audit json, apply result, patched tree): one copy of the
    release with the vendor's modules, audited, then applied once."""
    tree = copy_tree(PRIMARY, tmp_path_factory.mktemp("vendor") / "t")
    for rel, code in VENDOR.items():
        (tree / rel).write_text(code)
    before = json.loads(run("audit", tree, "--format", "json").output)
    strict_before = run("audit", tree, "--strict").exit_code
    applied = run("apply", tree)
    assert applied.exit_code == 0, applied.output
    return before, strict_before, applied, tree


def vendor_reads(doc) -> dict[tuple[str, int], list[dict]]:
    found: dict = {}
    for r in doc["reads"]:
        if r["file"] in VENDOR:
            found.setdefault((r["file"], r["line"]), []).append(r)
    return found


def check(doc) -> None:
    reads = vendor_reads(doc)
    want = expected()
    assert set(reads) == set(want), sorted(set(reads) ^ set(want))
    for key, found in reads.items():
        assert {r["verdict"] for r in found} == {want[key]}, (key, found)
        assert {r["origin"] for r in found} == {"vendor"}
    assert set(VENDOR) - {"srt/layers/attention/acme_base.py"} <= set(doc["modules"])
    assert "srt/layers/attention/acme_base.py" not in doc["modules"]


def test_vendor_modules_are_classified_on_the_unpatched_tree(trees):
    before, strict_before, _, _ = trees
    check(before)
    assert strict_before == 1
    # The release's own reads off the spec-v2 paths are the release's: none is a problem there.
    assert not [
        r
        for r in before["reads"]
        if r["origin"] == "release"
        and r["verdict"] in audit.PROBLEMS
        and r["file"] not in audit.MODULES
        and "Triton" not in r["function"]
    ]


def test_vendor_modules_are_classified_on_the_patched_tree(trees):
    _, _, _, tree = trees
    doc = json.loads(run("audit", tree, "--format", "json").output)
    check(doc)
    problems = [r for r in doc["reads"] if r["verdict"] in ("unguarded", "stale")]
    assert {r["file"] for r in problems} <= set(VENDOR) and len(problems) == PROBLEMS
    assert doc["ok"] is False and doc["summary"]["unguarded"] == PROBLEMS
    assert doc["release"] and doc["release"].endswith("sglang")
    assert run("audit", tree, "--strict").exit_code == 1
    why = {r["function"]: r["why"] for r in problems}
    assert "AcmeCompressedBackend opts out" in why["AcmeCompressedBackend.init_forward_metadata"]
    assert "builds AcmeCompressedBackend" in why["AcmeMultiStepDraftBackend.init_forward_metadata"]
    assert "assert" in why["AcmeSparseBackend.init_forward_metadata"]


def test_kept_mirror_reads_say_why(trees):
    before = json.loads(run("audit", trees[3], "--format", "json").output)
    kept = [r for r in before["reads"] if r["verdict"] == "kept-mirror"]
    assert {r["file"] for r in kept} == {"srt/speculative/acme_own_worker_v2.py", "srt/speculative/acme_own_info.py"}
    for r in kept:
        assert r["why"].startswith("kept mirror: ") and "AcmeOwnWorkerV2" in r["why"]
    assert before["summary"]["kept-mirror"] == len(kept)
    text = run("audit", trees[3]).output
    assert "kept-mirror" in text.splitlines()[-1] and "acme_own" not in text  # not listed as a problem


def test_apply_ends_with_one_line_naming_the_vendor_reads(trees):
    _, _, applied, _ = trees
    lines = applied.stderr.strip().splitlines()
    assert lines[-1] == (
        f"audit: {PROBLEMS} read(s) of the CPU seq_lens mirror in the vendor's own code are "
        "unguarded or stale once it is dropped (`patchkit audit TREE` lists them)"
    )
    assert sum("vendor's own code" in line for line in lines) == 1
    assert "vendor's own code" not in applied.stdout


def test_without_the_release_the_vendor_s_modules_are_still_the_vendor_s(trees, monkeypatch):
    """No cached release to compare with (never downloaded): the hashes
    patchkit ships tell the release's unchanged modules (origin "release"),
    the modules patchkit patched from them (the manifest), and the modules no
    known release reads the mirror in (the vendor's): the same origins, and
    the same count for apply, as with the release in the cache."""
    _, _, _, tree = trees
    warm = audit.audit_tree(tree)
    monkeypatch.setattr(audit_facts, "cached_release", lambda package: None)
    result = audit.audit_tree(tree)
    assert result.release is None and {r.origin for r in result.reads} == {"release", "vendor"}
    assert {r.origin for r in result.reads if r.file in VENDOR} == {"vendor"}
    assert [(r.file, r.line, r.verdict, r.origin) for r in result.reads] == [
        (r.file, r.line, r.verdict, r.origin) for r in warm.reads
    ]
    assert len(audit.vendor_problems(result)) == len(audit.vendor_problems(warm)) == PROBLEMS
    assert not result.ok
