"""A vendor's patch set declares a postcondition through the door patchkit's
own patches use (examples/acme-patches: checks.py, named by its TOML's
``postconditions``): apply refuses the vendor's patch in one line when the
check fails on the tree as it would be written (exit 1, nothing of it
written, the other patches applied) and applies it when the check holds."""

from __future__ import annotations

import shutil
from pathlib import Path

from support import PRIMARY, snapshot

SET = Path(__file__).resolve().parents[2] / "examples" / "acme-patches" / "acme_patches"
PATCH = "acme-torch-native-spec-v2"
OTHER = "min-new-tokens-no-sync"  # one of patchkit's own, which changes other files
FILE = "srt/layers/attention/torch_native_backend.py"
# A fork's own backend, deriving from the one the patch changes, that reshapes q itself.
SUBCLASS = """

class AcmeTorchNativeBackend(TorchNativeAttnBackend):
    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True):
{reshape}        return super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache)
"""
RESHAPE = "q = q.reshape(-1, layer.tp_q_head_num * layer.qk_head_dim)\n"


def fork(make_tree, reshape: str) -> Path:
    tree = make_tree(PRIMARY)
    path = tree / FILE
    path.write_text(path.read_text() + SUBCLASS.format(reshape=reshape))
    return tree


def test_a_failing_vendor_postcondition_refuses_its_patch_in_one_line(make_tree, cli):
    tree = fork(make_tree, "        " + RESHAPE)
    before = (tree / FILE).read_bytes()
    line = len(before.splitlines()) - 1  # the subclass's reshape
    result = cli("--patches", SET, "apply", tree, PATCH, OTHER)
    assert result.exit_code == 1, result.output
    refused = [text.strip() for text in result.output.splitlines() if "refused" in text]
    why = (
        f"refused: {FILE}:{line}: AcmeTorchNativeBackend.forward_decode reshapes q on every call: guard it "
        f"with `if decode_q_needs_reshape(q):` as {PATCH} does in TorchNativeAttnBackend, or `--skip {PATCH}` "
        "(the other patches still apply)"
    )
    assert refused == [f"not applied: {PATCH}: {why}"], result.output
    assert f"applied: {OTHER}" in result.output
    assert (tree / FILE).read_bytes() == before  # nothing of the refused patch is written
    assert not (tree / "srt" / "_patchkit" / "acme_runtime.py").exists()


def test_a_vendor_postcondition_that_holds_lets_its_patch_apply(make_tree, cli):
    tree = fork(make_tree, "        if decode_q_needs_reshape(q):\n            " + RESHAPE)
    result = cli("--patches", SET, "apply", tree, PATCH, OTHER)
    assert result.exit_code == 0, result.output
    assert f"applied: {PATCH}" in result.output and "refused" not in result.output
    assert "class AcmeTorchNativeBackend(TorchNativeAttnBackend):" in (tree / FILE).read_text()


def test_a_postcondition_that_fails_to_run_changes_nothing(make_tree, cli, tmp_path):
    broken = tmp_path / "acme"
    shutil.copytree(SET, broken)
    (broken / "checks.py").write_text(
        "from patchkit.postconditions import Postcondition\n\n\n"
        "class SubclassesGuardReshape(Postcondition):\n"
        "    def check(self, proposed):\n"
        "        raise RuntimeError('boom')\n"
    )
    tree = make_tree(PRIMARY)
    before = snapshot(tree)
    result = cli("--patches", broken, "apply", tree, PATCH, OTHER)
    assert result.exit_code == 2 and result.output.strip().splitlines() == [
        f"patchkit: error: postcondition SubclassesGuardReshape of {PATCH} failed to run: RuntimeError: boom; "
        "nothing was changed"
    ], result.output
    assert snapshot(tree) == before
