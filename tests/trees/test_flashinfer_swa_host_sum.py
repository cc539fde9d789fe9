"""flashinfer-swa-host-sum (sglang #32218) on the real releases: applied on
0.5.14 .. 0.5.19 (apply, verify, a second apply changes nothing, revert
byte-exact), not applicable on 0.5.10 .. 0.5.13 (no prefix_lens=None case,
said in one line), native on 0.5.20+."""

from __future__ import annotations

import pytest
from support import class_section, patch_states, snapshot, verified_idempotent_reverted

PATCH = "flashinfer-swa-host-sum"
FLASHINFER = "srt/layers/attention/flashinfer_backend.py"
HOST_SUM = "paged_kernel_lens_sum = int(torch.clamp(seq_lens_cpu, max=sliding_window_size).sum())"


@pytest.mark.trees
@pytest.mark.parametrize("version", ["0.5.14", "0.5.19"])
def test_applied_verified_and_reverted_exactly(make_tree, cli, version):
    tree = make_tree(version)
    before = snapshot(tree)
    assert patch_states(cli, tree, PATCH)[PATCH]["state"] == "absent"
    result = cli("apply", tree, PATCH)
    assert result.exit_code == 0, result.output
    text = (tree / FLASHINFER).read_text()
    compile(text, FLASHINFER, "exec")
    updater = class_section(text, "FlashInferIndicesUpdaterPrefill")
    assert updater.count(HOST_SUM) == 1
    method = updater[updater.index("def update_sliding_window") :]
    flag = method.index("prefix_is_full_seq = prefix_lens is None and getattr(")
    assert flag < method.index("if prefix_lens is None:") < method.index("if prefix_is_full_seq and seq_lens_cpu")
    verified_idempotent_reverted(cli, tree, PATCH, before)


@pytest.mark.trees
@pytest.mark.parametrize(
    "version, state",
    [("0.5.10", "not-applicable"), ("0.5.13", "not-applicable"), ("0.5.20", "native"), ("0.5.23", "native")],
)
def test_other_releases(make_tree, cli, version, state):
    tree = make_tree(version)
    report = patch_states(cli, tree, PATCH)[PATCH]
    assert report["state"] == state
    if state == "not-applicable":
        assert "no prefix_lens=None case" in report["reason"] and "fails before the sum" in report["reason"]
