"""Snippet tests of tests/trees/test_replay_no_stale_mirror.py (no release read; the quick loop runs them)."""

from __future__ import annotations

from patchkit.codemods import replay_no_stale_mirror as replay
from patchkit.codemods.common.base import State
from patchkit.testing import apply, detect

RUNNER = """
class CudaGraphRunner:
    def capture_one_batch_size(self, bs, forward):
        seq_lens_cpu = buffers.seq_lens_cpu[:bs]
        return ForwardBatch(seq_lens_cpu=seq_lens_cpu)

    def replay_prepare(self, forward_batch, pp_proxy_tensors=None):
        attn_backend.init_forward_metadata_replay_cuda_graph(
            bs,
            buffers.req_pool_indices[:bs],
            seq_lens_cpu=buffers.seq_lens_cpu[:bs],
        )


def build_replay_fb_view(forward_batch, buffers, bs):
    return SimpleNamespace(seq_lens_cpu=buffers.seq_lens_cpu)
"""


def test_runner_replay_passes_none_without_a_mirror():
    out = apply(replay.ReplayPassesNoStaleMirror, RUNNER)
    assert "seq_lens_cpu=mirror_or_none(forward_batch.seq_lens_cpu, buffers.seq_lens_cpu[:bs])," in out
    assert "SimpleNamespace(seq_lens_cpu=mirror_or_none(forward_batch.seq_lens_cpu, buffers.seq_lens_cpu))" in out
    # Capture builds its batch from a local: untouched.
    assert "return ForwardBatch(seq_lens_cpu=seq_lens_cpu)" in out


def test_runner_upstream_016_shape_is_done():
    src = RUNNER.replace(
        "seq_lens_cpu=buffers.seq_lens_cpu[:bs],",
        "seq_lens_cpu=(\n                None if forward_batch.seq_lens_cpu is None else buffers.seq_lens_cpu[:bs]\n            ),",
    ).replace(
        "SimpleNamespace(seq_lens_cpu=buffers.seq_lens_cpu)",
        "SimpleNamespace(seq_lens_cpu=None if forward_batch.seq_lens_cpu is None else buffers.seq_lens_cpu)",
    )
    assert detect(replay.ReplayPassesNoStaleMirror, src).state is State.DONE
    assert detect(replay.ReplayPassesNoStaleMirror, "def f(forward_batch):\n    return 1\n").state is State.MISSING
