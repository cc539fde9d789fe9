"""dsa-no-mirror (sglang #29414, past upstream on #33973) on the real releases: applied on
0.5.10 .. 0.5.12.post1, on 0.5.7 .. 0.5.9 with the verify / draft-extend lengths
expanded on the device, and on 0.5.13 .. 0.5.14 (the renamed backend before upstream's
opt-out), partial then applied on 0.5.15+ (only the eager fallback), not applicable
elsewhere with its reason; exact revert; the audit clean; two fork shapes (a
renamed backend, a vendor edit inside the indexer); and the eager width, run from the
release's own code without the mirror, reading the device on upstream and not once patched."""

from __future__ import annotations

import re

import pytest
from dsa_shapes import DEVICE_MAX, MAX_CONTEXT_LEN, eager_width
from support import PRE_UPSTREAM, patch_states, snapshot, verified_idempotent_reverted

from patchkit.codemods.dsa_no_mirror.verify import MARK
from patchkit.runtime.host_bound import SeqLensBound

ID = "dsa-no-mirror"
REQUIRES = ("needs-cpu-seq-lens", "replay-no-stale-mirror")
NSA = "srt/layers/attention/nsa_backend.py"
DSA = "srt/layers/attention/dsa_backend.py"
INDEXER = "srt/layers/attention/nsa/nsa_indexer.py"
PRECOMPUTE = "srt/layers/attention/nsa/nsa_backend_mtp_precompute.py"
RUNTIME = "srt/_patchkit/backends/dsa.py"
DSA_INDEXER = "srt/layers/attention/dsa/dsa_indexer.py"
DSA_PRECOMPUTE = "srt/layers/attention/dsa/dsa_backend_mtp_precompute.py"
UPSTREAM_OPT_OUT = ["0.5.15", "0.5.20", "0.5.23"]
HOST_EXPANSION = ["0.5.7", "0.5.8", "0.5.9"]  # 0.5.8.post1's nsa files are 0.5.8's
RENAMED_BEFORE_OPT_OUT = ["0.5.13", "0.5.13.post1", "0.5.14"]  # 0.5.13.post1's dsa files are 0.5.13's


def state(cli, tree) -> dict:
    return patch_states(cli, tree, ID)[ID]


def audit_findings(cli, tree) -> set[str]:
    """The audit's unguarded / stale reads, by file and method (line numbers move when a file is patched)."""
    result = cli("audit", tree)
    found = (ln for ln in result.output.splitlines() if ": unguarded: " in ln or ": stale: " in ln)
    return {re.sub(r"^.*?/(srt/[^:]+):\d+:", r"\1:", ln) for ln in found}


#: target verify's query lengths copied from the host list [D] * bs (0.5.10 .. 0.5.14 eager and
#: replay; the eager only from 0.5.15): a blocking copy from pageable memory each decode step.
HOST_LENGTHS = re.compile(r"torch\.tensor\(\s*extend_seq_lens_cpu")
FILL = "torch.full(({}), self.speculative_num_draft_tokens, dtype=torch.int32, device={})"


def assert_verify_lengths_filled(pristine: str, patched: str, replay_native: bool = False) -> None:
    """The release copies the verify lengths from the host in both branches (the eager one
    only, from 0.5.15); patched, neither does: the fill on the device instead, patchkit's
    (its comment) in each branch that copied, upstream's left in a replay that has it."""
    copies = 1 if replay_native else 2
    assert len(HOST_LENGTHS.findall(pristine)) == copies
    assert not HOST_LENGTHS.search(patched)
    assert patched.count(MARK) == copies
    assert FILL.format("batch_size,", "device") in patched
    assert (FILL.format("bs,", "self.device") in patched) is not replay_native
    assert "forward_batch.extend_seq_lens_cpu = extend_seq_lens_cpu" in patched  # the batch's host list stays


def changed(before: dict, after: dict) -> set[str]:
    return {rel for rel in before.keys() | after.keys() if before.get(rel) != after.get(rel)}


@pytest.mark.trees
@pytest.mark.parametrize("version", PRE_UPSTREAM)
def test_carried_onto_0_5_10_to_0_5_12_post1(make_tree, cli, version):
    tree = make_tree(version)
    package = tree / "sglang" if (tree / "sglang").is_dir() else tree
    before = snapshot(tree)
    before_nsa = (package / NSA).read_text()
    assert state(cli, tree)["state"] == "absent"
    result = cli("apply", tree, ID)
    assert result.exit_code == 0, result.output
    assert state(cli, tree)["state"] == "applied"
    nsa = (package / NSA).read_text()
    assert nsa.count("needs_cpu_seq_lens: bool = False") == 2
    assert "host_max_seq_len(forward_batch.seq_lens_cpu, self.max_context_len, forward_batch)" in nsa
    assert "assert seq_lens_cpu is not None\n" not in nsa and "graph_max_len(seq_lens_cpu" in nsa
    assert "forward_batch.seq_lens.numel() == 0" in (package / INDEXER).read_text()
    assert "graph_max_len(" in (package / PRECOMPUTE).read_text()
    assert (package / RUNTIME).is_file()
    assert_verify_lengths_filled(before_nsa, nsa)
    # run from the tree's own code: no device read, the batch's host bound
    assert eager_width(nsa, "NativeSparseAttnBackend", SeqLensBound(300, 2000)) == (300, 0)
    assert cli("verify", tree, ID).exit_code == 0
    audit = cli("audit", tree, "--strict")
    assert audit.exit_code == 0, audit.output
    patched = snapshot(tree)
    assert cli("apply", tree, ID).exit_code == 0 and snapshot(tree) == patched  # idempotent
    # reverting the patch alone gives back the release's bytes of its files; the rest stays
    assert cli("revert", tree, ID).exit_code == 0
    now = snapshot(tree)
    assert all(now.get(rel) == before.get(rel) for rel in (NSA, INDEXER, PRECOMPUTE))
    assert {s["state"] for p, s in patch_states(cli, tree, *REQUIRES).items() if p in REQUIRES} == {"applied"}
    assert cli("revert", tree).exit_code == 0
    assert snapshot(tree) == before


@pytest.mark.trees
@pytest.mark.parametrize("version", HOST_EXPANSION)
def test_carried_onto_0_5_7_to_0_5_9_with_the_lengths_expanded_on_the_device(make_tree, cli, version):
    """0.5.7 .. 0.5.9 expand the verify and draft-extend lengths on the host from the
    mirror (`seq_lens_cpu.tolist()`); patched, they call backends.dsa seqlens_expand on
    the device lengths (0.5.10's shape), and the rest is 0.5.10's patch."""
    tree = make_tree(version)
    package = tree / "sglang" if (tree / "sglang").is_dir() else tree
    before = snapshot(tree)
    assert state(cli, tree)["state"] == "absent"
    assert cli("apply", tree, *REQUIRES).exit_code == 0
    required = snapshot(tree)
    result = cli("apply", tree, ID)
    assert result.exit_code == 0, result.output
    nsa = (package / NSA).read_text()
    eager = nsa.split("    def init_forward_metadata(", 1)[1].split("\n    def ", 1)[0]
    replay = nsa.split("    def init_forward_metadata_replay_cuda_graph(", 1)[1].split("\n    def ", 1)[0]
    spec_eager = eager.split("elif forward_batch.forward_mode.is_extend():")[0]  # decode, verify, draft extend
    for part in (spec_eager, replay):
        assert "seq_lens_cpu.tolist()" not in part and "seqlens_int32_cpu" not in part
        assert "torch.cat(" not in part and ".item()" not in part.replace("graph_max_len", "")
        assert not HOST_LENGTHS.search(part) and MARK not in part  # nothing to fill: the width is a host int
    assert (
        "seqlens_expand(self.speculative_num_draft_tokens, (forward_batch.seq_lens + "
        "self.speculative_num_draft_tokens), self.speculative_num_draft_tokens * batch_size)" in eager
    )
    assert (
        "seqlens_expand(forward_batch.extend_seq_lens, forward_batch.seq_lens, "
        "sum(forward_batch.extend_seq_lens_cpu))" in eager
    )
    assert "seqlens_expand(extend_seq_lens, seq_lens, sum(extend_seq_lens_cpu))" in replay
    assert "from sglang.srt._patchkit.backends.dsa import graph_max_len, seqlens_expand" in nsa
    assert "forward_batch.seq_lens_cpu.tolist()" in eager.split("elif forward_batch.forward_mode.is_extend():")[1]
    assert nsa.count("needs_cpu_seq_lens: bool = False") == 2
    assert "forward_batch.seq_lens.numel() == 0" in (package / INDEXER).read_text()
    assert eager_width(nsa, "NativeSparseAttnBackend", SeqLensBound(300, 2000)) == (300, 0)
    audit = cli("audit", tree, "--strict")
    assert audit.exit_code == 0, audit.output
    verified_idempotent_reverted(cli, tree, ID, required)  # applied, verify, idempotent, exact revert
    assert cli("revert", tree).exit_code == 0
    assert snapshot(tree) == before


@pytest.mark.trees
@pytest.mark.parametrize("version", RENAMED_BEFORE_OPT_OUT)
def test_carried_onto_0_5_13_and_0_5_14_the_renamed_backend_before_upstreams_opt_out(make_tree, cli, version):
    """DeepseekSparseAttnBackend before 0.5.15's opt-out: its GPU-only draft extend (upstream's,
    needs-cpu-seq-lens native there) hands over extend_seq_lens_cpu but no mirror and no prefix
    list; patched, the backend opts out and needs neither (the eager width from the host bound,
    the draft extend's assert of the prefix list gone, the replay and precompute at the table's
    width, the indexer's empty-batch test a shape), and the audit finds no read it did not before."""
    tree = make_tree(version)
    package = tree / "sglang" if (tree / "sglang").is_dir() else tree
    before = snapshot(tree)
    before_dsa = (package / DSA).read_text()
    audited = audit_findings(cli, tree)  # upstream's own findings elsewhere (mamba, metrics): unchanged
    assert state(cli, tree)["state"] == "absent"
    assert cli("apply", tree, *REQUIRES).exit_code == 0  # replay-no-stale-mirror; needs-cpu-seq-lens is native
    required = snapshot(tree)
    result = cli("apply", tree, ID)
    assert result.exit_code == 0, result.output
    assert {rel for rel in changed(required, snapshot(tree)) if not rel.startswith("srt/_patchkit/")} == {
        DSA,
        DSA_INDEXER,
        DSA_PRECOMPUTE,
    }
    dsa = (package / DSA).read_text()
    assert dsa.count("needs_cpu_seq_lens: bool = False") == 2
    eager = dsa.split("    def init_forward_metadata(self, forward_batch", 1)[1].split("\n    def ", 1)[0]
    spec, prefill = eager.split("elif forward_batch.forward_mode.is_extend():")
    assert "assert forward_batch.seq_lens_cpu is not None" not in eager and "extend_prefix_lens_cpu" not in spec
    assert "extend_prefix_lens_cpu is not None" in prefill  # the prefill branch keeps its assert
    assert "sum(extend_seq_lens_cpu)" in spec  # the list the GPU-only draft extend hands over
    replay = dsa.split("    def _apply_cuda_graph_metadata(", 1)[1].split("\n    def ", 1)[0]
    assert "assert seq_lens_cpu is not None\n" not in replay and "seq_lens_cpu.max().item()" not in replay
    assert "graph_max_len(seq_lens_cpu" in replay
    assert_verify_lengths_filled(before_dsa, dsa)
    assert FILL.format("bs,", "self.device") in replay  # the replay's verify, renamed _apply_cuda_graph_metadata
    assert "forward_batch.seq_lens.numel() == 0" in (package / DSA_INDEXER).read_text()
    assert "graph_max_len(" in (package / DSA_PRECOMPUTE).read_text()
    # run from the tree's own code: no device read, the static bound (0.5.13+ keep no host bound)
    assert eager_width(dsa, "DeepseekSparseAttnBackend", None) == (MAX_CONTEXT_LEN, 0)
    assert audit_findings(cli, tree) == audited
    verified_idempotent_reverted(cli, tree, ID, required)  # applied, verify, idempotent, exact revert
    assert cli("revert", tree).exit_code == 0
    assert snapshot(tree) == before


@pytest.mark.trees
def test_the_release_as_shipped_needs_the_mirror(make_tree):
    tree = make_tree("0.5.12.post1")
    package = tree / "sglang" if (tree / "sglang").is_dir() else tree
    with pytest.raises(AssertionError):  # `assert forward_batch.seq_lens_cpu is not None`
        eager_width((package / NSA).read_text(), "NativeSparseAttnBackend", None)


@pytest.mark.trees
@pytest.mark.parametrize("version", UPSTREAM_OPT_OUT)
def test_past_upstream_no_device_read_in_the_eager_fallback(make_tree, cli, version):
    """Upstream's opt-out (0.5.15+) reads seq_lens.max().item() without the mirror
    (sglang #33973); the patch rewrites that line and nothing else of the backend."""
    tree = make_tree(version)
    package = tree / "sglang" if (tree / "sglang").is_dir() else tree
    before = snapshot(tree)
    pristine = (package / DSA).read_text()
    assert eager_width(pristine, "DeepseekSparseAttnBackend", None) == (DEVICE_MAX, 1)  # fails: a device read
    st = state(cli, tree)
    assert st["state"] == "partial", st
    assert cli("apply", tree, *REQUIRES).exit_code == 0  # replay-no-stale-mirror is applied on 0.5.15
    required = snapshot(tree)
    result = cli("apply", tree, ID)
    assert result.exit_code == 0, result.output
    assert state(cli, tree)["state"] == "applied"
    patched = (package / DSA).read_text()
    assert_verify_lengths_filled(pristine, patched, replay_native=True)  # the eager verify, past upstream
    assert eager_width(patched, "DeepseekSparseAttnBackend", None) == (MAX_CONTEXT_LEN, 0)
    assert eager_width(patched, "DeepseekSparseAttnBackend", SeqLensBound(300, 2000)) == (300, 0)
    assert {rel for rel in changed(required, snapshot(tree)) if not rel.startswith("srt/_patchkit/")} == {DSA}
    assert cli("revert", tree).exit_code == 0
    assert snapshot(tree) == before


@pytest.mark.trees
@pytest.mark.parametrize(
    ("version", "reason"),
    [
        ("0.5.4.post3", "no spec-v2 draft extend here"),
        ("0.5.6.post2", "no spec-v2 draft extend here"),
    ],
)
def test_not_applicable_with_its_reason(make_tree, cli, version, reason):
    tree = make_tree(version)
    st = state(cli, tree)
    assert st["state"] == "not-applicable", st
    assert reason in st["reason"], st["reason"]


@pytest.mark.trees
def test_fork_with_upstreams_names_is_carried(make_tree, cli):
    """A 0.5.12.post1 fork that renamed the backend as upstream did in 0.5.13
    (DeepseekSparseAttnBackend in dsa_backend.py) and left its indexer in nsa/."""
    tree = make_tree("0.5.12.post1")
    package = tree / "sglang" if (tree / "sglang").is_dir() else tree
    source = (package / NSA).read_text().replace("class NativeSparseAttnBackend(", "class DeepseekSparseAttnBackend(")
    source = source.replace("class NativeSparseAttnMultiStepBackend:", "class DeepseekSparseAttnMultiStepBackend:")
    (package / DSA).write_text(source)
    (package / NSA).unlink()
    result = cli("apply", tree, ID)
    assert result.exit_code == 0, result.output
    st = state(cli, tree)
    assert st["state"] == "applied", st
    dsa = (package / DSA).read_text()
    assert "class DeepseekSparseAttnBackend(" in dsa and "host_max_seq_len(forward_batch.seq_lens_cpu" in dsa
    assert_verify_lengths_filled(source, dsa)  # the fork's own copy of the verify branches, as the release's
    assert eager_width(dsa, "DeepseekSparseAttnBackend", SeqLensBound(300, 2000)) == (300, 0)


@pytest.mark.trees
def test_fork_with_its_own_indexer_test_is_refused_in_one_line(make_tree, cli):
    """A vendor edit inside the indexer: its own empty-batch test, the mirror still asserted."""
    tree = make_tree("0.5.12.post1")
    package = tree / "sglang" if (tree / "sglang").is_dir() else tree
    before = snapshot(tree)
    indexer = package / INDEXER
    text = indexer.read_text()
    assert text.count("if len(forward_batch.seq_lens_cpu) == 0:") == 1
    indexer.write_text(text.replace("if len(forward_batch.seq_lens_cpu) == 0:", "if forward_batch.batch_size == 0:"))
    edited = snapshot(tree)
    result = cli("apply", tree, ID)
    assert result.exit_code == 1, result.output
    line = next(ln for ln in result.output.splitlines() if ln.startswith(f"not applied: {ID}"))
    assert "nsa_indexer.py" in line and "len(forward_batch.seq_lens_cpu) == 0" in line, line
    assert all(snapshot(tree).get(rel) == edited.get(rel) for rel in (NSA, INDEXER, PRECOMPUTE))
    assert before != edited
