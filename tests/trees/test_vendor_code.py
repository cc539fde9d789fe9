"""Code a vendor added inside a patch site survives `apply`, or the site is
refused naming file:line (issue 29 §1). Synthetic forks: a real release tree
with one vendor token inserted at a real patch site."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import PRIMARY

from patchkit import fetch, registry

VERSIONS = ["0.5.11", "0.5.12.post1"]

WORKER = "srt/speculative/eagle_worker_v2.py"
WHITELIST_LINE = "            or isinstance(self.draft_extend_attn_backend, TRTLLMMLABackend)\n"
REPLAY = "srt/model_executor/cuda_graph_runner.py"
REPLAY_KWARG = "            seq_lens_cpu=buffers.seq_lens_cpu[:bs],\n"
SYNC = "srt/speculative/eagle_info_v2.py"
SYNC_LINE = "        batch.seq_lens_cpu = batch.seq_lens.cpu()\n"
MHA = "srt/layers/attention/trtllm_mha_backend.py"
CAPTURE_DEF = "    def init_forward_metadata_capture_cuda_graph(\n"
BATCH = "srt/managers/schedule_batch.py"
EAGER_SUM = "self.seq_lens_sum = self.seq_lens.sum().item()"


def insert(tree: Path, rel: str, anchor: str, text: str, before: bool = False) -> int:
    """Put ``text`` after (or before) the first ``anchor`` in the file; the line it lands on."""
    path = tree / rel
    source = path.read_text()
    assert anchor in source, f"{rel}: {anchor!r} not found"
    at = source.index(anchor) + (0 if before else len(anchor))
    path.write_text(source[:at] + text + source[at:])
    return source[:at].count("\n") + 1


# (file, anchor, inserted text, the vendor token that must survive, insert before the anchor?)
SHAPES = {
    "isinstance-member": (
        WORKER,
        WHITELIST_LINE,
        "            or isinstance(self.draft_extend_attn_backend, AcmeVendorBackend)\n",
        "AcmeVendorBackend",
        False,
    ),
    "boolean-term": (WORKER, WHITELIST_LINE, "            or self.acme_vendor_flag\n", "acme_vendor_flag", False),
    "keyword": (REPLAY, REPLAY_KWARG, "            acme_vendor_kw=1,\n", "acme_vendor_kw=1", False),
    "statement": (SYNC, SYNC_LINE, "        acme_vendor_stmt = batch.seq_lens.numel()\n", "acme_vendor_stmt", True),
    "decorator": (MHA, CAPTURE_DEF, "    @acme_vendor_decorator\n", "@acme_vendor_decorator", True),
}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_vendor_token_is_carried(make_tree, cli, version, shape):
    tree = make_tree(version)
    rel, anchor, text, token, before = SHAPES[shape]
    insert(tree, rel, anchor, text, before)
    result = cli("apply", tree)
    assert result.exit_code == 0, result.output
    patched = (tree / rel).read_text()
    assert token in patched
    assert patched != fetch.pristine_source(version, rel).decode()  # the patch did change this file
    assert cli("verify", "-q", tree).exit_code == 0


def test_vendor_statement_inside_the_guarded_pair_is_refused_by_the_safety_rule(make_tree, cli):
    """A vendor statement between the mirror's copy and its sum: the guard
    would cover the copy alone and leave the sum reading None, so the safety
    rule (patchkit/checks/mirror_reads.py) refuses needs-cpu-seq-lens, naming the sum's line;
    the patches that do not require it apply; exit 1."""
    tree = make_tree(PRIMARY)
    insert(tree, SYNC, SYNC_LINE, "        acme_vendor_stmt = batch.seq_lens.numel()\n")
    before = (tree / SYNC).read_bytes()
    result = cli("apply", tree)
    assert result.exit_code == 1, result.output
    refused = [x for x in result.output.splitlines() if x.startswith("not applied: needs-cpu-seq-lens: refused: ")]
    assert len(refused) == 1 and "unguarded once the mirror is dropped" in refused[0], result.output
    assert "applied: trtllm-mha-overlap-hook" in result.output
    # Nothing of the decision written (the kv-lens and output-id copies of issue 53 are other patches').
    after = (tree / SYNC).read_text()
    assert "needs_cpu_seq_lens" not in after and SYNC_LINE in after and "acme_vendor_stmt" in after
    assert len(after.splitlines()) == len(before.decode().splitlines()) + 1  # their one import line


@pytest.mark.parametrize("version", VERSIONS)
def test_replaced_vendor_code_is_refused_with_its_line(make_tree, cli, version):
    """The refused patch and those requiring it are skipped, each with one
    line; every other patch applies (issue 45 §4); exit 1."""
    from support import patch_states

    tree = make_tree(version)
    line = insert(tree, BATCH, EAGER_SUM, " + acme_vendor_bias")
    batch = (tree / BATCH).read_bytes()
    result = cli("apply", tree)
    assert result.exit_code == 1, result.output
    # The line of the file on disk after the apply: the patches that did apply
    # (min-new-tokens-no-sync's import) may add lines above the vendor's.
    on_disk = next(n for n, text in enumerate((tree / BATCH).read_text().splitlines(), 1) if "acme_vendor_bias" in text)
    assert on_disk >= line
    refused = [x for x in result.output.splitlines() if f"refused: {BATCH}:{on_disk}: " in x]
    assert len(refused) == 1 and refused[0].startswith("not applied: needs-cpu-seq-lens: ")
    assert "acme_vendor_bias" in refused[0] and "DeferFilterBatchSum" in refused[0]
    assert refused[0].endswith(f"or {registry.skip_advice('needs-cpu-seq-lens')}")
    assert "--skip needs-cpu-seq-lens --cascade" in refused[0]
    assert "nothing was changed" not in result.output
    # Of the refused patch nothing; min-new-tokens-no-sync's copy and verify-wait-on-stream's wait only.
    assert unpinned((tree / BATCH).read_text()) == batch.decode()
    states = {pid: p["state"] for pid, p in patch_states(cli, tree).items()}
    assert states["needs-cpu-seq-lens"] == "absent"
    for dependent in ("replay-no-stale-mirror", "fa3-spec-v2", "piecewise-no-forced-mirror", "trtllm-mla-spec-v2"):
        assert states[dependent] != "applied"
        assert f"not applied: {dependent}: requires " in result.output
    for free in ("draft-extend-graph-no-topk", "trtllm-mha-overlap-hook", "trtllm-mla-draft-skip-template"):
        assert states[free] == "applied", (free, result.output)
    assert cli("revert", tree).exit_code == 0
    assert (tree / BATCH).read_bytes() == batch


def unpinned(text: str) -> str:
    """schedule_batch.py without the patches that still apply there beside the refused one:
    min-new-tokens-no-sync's pinned output-id copy and verify-wait-on-stream's stream wait."""
    text = text.replace("from sglang.srt._patchkit.runtime import pin_memory_for, wait_event_on_stream\n", "", 1)
    text = text.replace(
        "                # patchkit (sglang #25879): the schedule stream waits for the verify, not the\n"
        "                # host, which goes on preparing the next step (a host wait on ROCm, as upstream).\n"
        "                wait_event_on_stream(draft_input.verify_done)\n",
        "                draft_input.verify_done.synchronize()\n",
        1,
    )
    return text.replace(
        "pin_memory=pin_memory_for(self.device),\n                ).to(self.device, non_blocking=True)\n",
        "device=self.device,\n                )\n",
        1,
    )


def test_declared_replacement_is_reported(make_tree, cli, monkeypatch):
    from patchkit.codemods.needs_cpu_seq_lens_deferred_sum import DeferFilterBatchSum

    monkeypatch.setenv("PATCHKIT_TRANSFORM_CACHE", "off")
    monkeypatch.setattr(DeferFilterBatchSum, "REPLACES_VENDOR", (("acme_vendor_bias", "the sum is deferred"),))
    tree = make_tree("0.5.12.post1")
    line = insert(tree, BATCH, EAGER_SUM, " + acme_vendor_bias")
    result = cli("apply", tree)
    assert result.exit_code == 0, result.output
    notes = [x for x in result.output.splitlines() if "replaces the vendor's" in x]
    assert len(notes) == 1 and f"{BATCH}:{line}:" in notes[0] and "the sum is deferred" in notes[0]
    assert "acme_vendor_bias" not in (tree / BATCH).read_text()


def test_forward_mode_member_survives_on_0_5_13(make_tree, cli):
    """flashmla-spec-v2 drops DRAFT_EXTEND_V2 from forward_extend's early
    return tuple on 0.5.13 .. 0.5.15; a fork's own member stays, before or after it."""
    tree = make_tree("0.5.13")
    rel = "srt/layers/attention/flashmla_backend.py"
    insert(
        tree,
        rel,
        "            ForwardMode.DRAFT_EXTEND_V2,\n        ):\n",
        "            ForwardMode.ACME_MODE,\n",
        before=True,
    )
    insert(
        tree,
        rel,
        "            ForwardMode.DRAFT_EXTEND_V2,\n        ):\n",
        "            ForwardMode.ACME_LAST,\n",
        before=False,
    )
    result = cli("apply", tree)
    assert result.exit_code == 0, result.output
    patched = (tree / rel).read_text()
    assert "ForwardMode.ACME_MODE" in patched and "ForwardMode.ACME_LAST" in patched
