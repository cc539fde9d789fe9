"""spec-v2-decode-copies, run: the patched ``ForwardBatch.init_new`` of
0.5.12.post1, imported on CPU, for a draft extend (DRAFT_EXTEND_V2, the
lists spec v2 hands it every decode step). Where pinning is available (the
runtime's answer replaced: a CPU-only torch cannot pin) the extend lengths
are built as pinned host tensors before their non_blocking copy, and the
batch gets the same lengths, positions and start offsets as without."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from forward_batch_inputs import draft_extend, runner

pytestmark = pytest.mark.behaviour

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("transformers")

from patchkit.cli import main  # noqa: E402
from patchkit.fetch import copy_tree  # noqa: E402

PID = "spec-v2-decode-copies"
VERSION = "0.5.12.post1"


@pytest.fixture(scope="module")
def forward_batch_info(tmp_path_factory, load_sglang):
    package = copy_tree(VERSION, tmp_path_factory.mktemp("copies"), "package")
    result = CliRunner().invoke(main, ["apply", str(package), PID], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    load_sglang(package)
    from sglang.srt.model_executor import forward_batch_info

    assert forward_batch_info.__file__.startswith(str(package))
    return forward_batch_info


@pytest.fixture
def pinned(monkeypatch, forward_batch_info):
    """The lists ``torch.tensor`` was asked to build pinned (built without: CPU torch cannot pin)."""
    asked: list[list] = []
    real = torch.tensor

    def tensor(data, *args, pin_memory=False, **kwargs):
        if pin_memory:
            asked.append(data)
        return real(data, *args, **kwargs)

    monkeypatch.setattr(torch, "tensor", tensor)
    monkeypatch.setattr(forward_batch_info, "enable_num_token_non_padded", lambda *args: False)
    return asked


def test_extend_lengths_pinned_where_pinning_is_available_same_values(forward_batch_info, pinned, monkeypatch):
    plain = forward_batch_info.ForwardBatch.init_new(draft_extend(forward_batch_info), runner())
    assert pinned == []  # the CPU device: pageable, as before

    import sglang.srt._patchkit.runtime.host_copies as runtime_copies

    monkeypatch.setattr(runtime_copies, "pin_memory_for", lambda device: True)
    batch = forward_batch_info.ForwardBatch.init_new(draft_extend(forward_batch_info), runner())

    assert pinned == [[4, 4, 4], [7, 12, 4]]  # extend_seq_lens, extend_prefix_lens
    for name in ("extend_seq_lens", "extend_prefix_lens", "positions", "extend_start_loc"):
        assert torch.equal(getattr(batch, name), getattr(plain, name)), name
    assert batch.extend_seq_lens.dtype == torch.int32
    assert batch.positions.tolist() == [*range(7, 11), *range(12, 16), *range(4, 8)]
