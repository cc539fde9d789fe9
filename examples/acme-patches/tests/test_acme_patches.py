"""Acme's patch set: each codemod on a snippet, and the patch on a real sglang
release (applies with its runtime helper vendored, verifies, applies again
unchanged, reverts byte for byte), with patchkit.testing only.
Run from anywhere: pytest examples/acme-patches/tests."""

from pathlib import Path

from patchkit.testing import assert_codemod, check_release, set_codemod

SET = Path(__file__).resolve().parent.parent / "acme_patches"
PATCH = "acme-torch-native-spec-v2"
FILE = "srt/layers/attention/torch_native_backend.py"


def test_guard_decode_reshape():
    assert_codemod(
        set_codemod(SET, "torch_native:GuardDecodeReshape"),
        """
        class TorchNativeAttnBackend:
            def forward_decode(self, q, layer):
                # torch.compile may leave q 3-D
                q = q.reshape(-1, layer.tp_q_head_num * layer.qk_head_dim)
                return q
        """,
        """
        from sglang.srt._patchkit.acme_runtime import decode_q_needs_reshape
        class TorchNativeAttnBackend:
            def forward_decode(self, q, layer):
                # torch.compile may leave q 3-D
                if decode_q_needs_reshape(q):
                    q = q.reshape(-1, layer.tp_q_head_num * layer.qk_head_dim)
                return q
        """,
    )


def test_on_a_release(tmp_path):
    result = check_release(PATCH, "0.5.12.post1", tmp_path, patches=[SET])
    assert "def update_verify_buffers_to_fill_after_draft(self, spec_info, cuda_graph_bs):" in result.text(FILE)
    assert result.text("srt/_patchkit/acme_runtime.py").endswith((SET / "acme_runtime.py").read_text())
