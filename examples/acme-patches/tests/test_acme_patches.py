"""Acme's patch set on a real sglang release: applies, verifies, reverts
byte for byte. Run from anywhere: pytest examples/acme-patches/tests."""

import hashlib
from pathlib import Path

from click.testing import CliRunner

from patchkit.cli import main
from patchkit.fetch import copy_tree

SET = Path(__file__).resolve().parent.parent / "acme_patches"
PATCH = "acme-torch-native-spec-v2"
FILE = "srt/layers/attention/torch_native_backend.py"


def patchkit(*args):
    return CliRunner().invoke(main, ["--patches", str(SET), *map(str, args)], catch_exceptions=False)


def digests(folder: Path) -> dict:
    return {p.relative_to(folder): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*")
            if p.is_file() and ".patchkit" not in p.parts}


def test_apply_verify_revert(tmp_path):
    tree = copy_tree("0.5.12.post1", tmp_path)
    pristine = digests(tree)
    assert "absent" in patchkit("status", tree, PATCH).output
    applied = patchkit("apply", tree, PATCH)
    assert applied.exit_code == 0, applied.output
    code = (tree / FILE).read_text()
    assert "def update_verify_buffers_to_fill_after_draft(self, spec_info, cuda_graph_bs):" in code
    assert "        if q.dim() != 2:\n            q = q.reshape(" in code
    assert patchkit("verify", tree, PATCH).exit_code == 0
    assert "1 file(s) changed" not in patchkit("apply", tree, PATCH).output  # idempotent
    assert patchkit("revert", tree, PATCH).exit_code == 0
    assert digests(tree) == pristine


def test_native_tree_is_left_alone(tmp_path):
    tree = copy_tree("0.5.12.post1", tmp_path)
    assert patchkit("apply", tree, PATCH).exit_code == 0
    patched = (tree / FILE).read_text()
    fresh = copy_tree("0.5.12.post1", tmp_path / "fork")  # a fork that carries the change by hand already
    (fresh / FILE).write_text(patched)
    status = patchkit("status", fresh, PATCH)
    assert f"{PATCH}  native" in status.output, status.output
