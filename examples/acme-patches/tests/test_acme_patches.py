"""Acme's patch set: each codemod on a snippet (patchkit's tests/codemod_testing.py),
and on a real sglang release: applies with its runtime helper vendored,
verifies, reverts byte for byte. Run from anywhere: pytest examples/acme-patches/tests."""

import hashlib
import sys
from pathlib import Path

from click.testing import CliRunner

from patchkit.cli import main
from patchkit.fetch import copy_tree

SET = Path(__file__).resolve().parent.parent / "acme_patches"
sys.path[:0] = [str(SET.parent), str(SET.parents[2] / "tests")]  # this set; patchkit's test helpers

from acme_patches.torch_native import GuardDecodeReshape  # noqa: E402
from codemod_testing import assert_codemod  # noqa: E402

PATCH = "acme-torch-native-spec-v2"
FILE = "srt/layers/attention/torch_native_backend.py"


def patchkit(*args):
    return CliRunner().invoke(main, ["--patches", str(SET), *map(str, args)], catch_exceptions=False)


def digests(folder: Path) -> dict:
    return {p.relative_to(folder): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*")
            if p.is_file() and ".patchkit" not in p.parts}


def test_guard_decode_reshape():
    assert_codemod(GuardDecodeReshape, """
        class TorchNativeAttnBackend:
            def forward_decode(self, q, layer):
                # torch.compile may leave q 3-D
                q = q.reshape(-1, layer.tp_q_head_num * layer.qk_head_dim)
                return q
        """, """
        from sglang.srt._patchkit.acme_runtime import decode_q_needs_reshape
        class TorchNativeAttnBackend:
            def forward_decode(self, q, layer):
                # torch.compile may leave q 3-D
                if decode_q_needs_reshape(q):
                    q = q.reshape(-1, layer.tp_q_head_num * layer.qk_head_dim)
                return q
        """)


def test_apply_verify_revert(tmp_path):
    tree = copy_tree("0.5.12.post1", tmp_path)
    pristine = digests(tree)
    assert patchkit("apply", tree, PATCH).exit_code == 0
    assert "def update_verify_buffers_to_fill_after_draft(self, spec_info, cuda_graph_bs):" in (tree / FILE).read_text()
    assert (tree / "srt/_patchkit/acme_runtime.py").read_text().endswith((SET / "acme_runtime.py").read_text())
    assert patchkit("verify", tree, PATCH).exit_code == 0
    assert patchkit("revert", tree, PATCH).exit_code == 0
    assert digests(tree) == pristine
