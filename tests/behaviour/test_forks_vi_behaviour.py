"""Vendor forks VI (issue 69), run: a 0.5.12.post1 fork that pins its own copies
of the extend lengths (``torch.tensor(LIST, ...).pin_memory().to(device,
non_blocking=True)``), patched with every patch, imported on CPU, and its
``ForwardBatch.init_new`` run for a draft extend with the mirror absent: the
GPU-only draft extend hands the lengths over as device tensors.

torch pins dense CPU tensors only, and a CPU-only torch pins nothing; so the
test marks the tensors that stand for device lengths, and ``pin_memory``
raises for them as CUDA's would (and records the host tensors it pins). The
tree patchkit wrote before issue 69 (``torch.as_tensor(...).pin_memory()``)
raises here, at run time, as it did on the GPU."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from fork_shapes import FORWARD_BATCH, OWN_PINS, RELEASE_COPIES
from forward_batch_inputs import draft_extend, runner
from support import edit_file

pytestmark = pytest.mark.behaviour

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("transformers")

from patchkit.cli import main  # noqa: E402
from patchkit.fetch import copy_tree  # noqa: E402

VERSION = "0.5.12.post1"


@pytest.fixture(scope="module")
def forward_batch_info(tmp_path_factory, load_sglang):
    package = copy_tree(VERSION, tmp_path_factory.mktemp("own-pins"), "package")
    edit_file(package, FORWARD_BATCH, RELEASE_COPIES, OWN_PINS)
    result = CliRunner().invoke(main, ["apply", str(package)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    load_sglang(package)
    from sglang.srt.model_executor import forward_batch_info

    assert forward_batch_info.__file__.startswith(str(package))
    return forward_batch_info


def on_device(values: list[int]):
    """A tensor standing for device lengths (the GPU-only draft extend's)."""
    tensor = torch.tensor(values, dtype=torch.int32)
    tensor.stands_for_device = True
    return tensor


@pytest.fixture
def pins(monkeypatch, forward_batch_info):
    """The host tensors pinned; pinning one that stands for a device tensor raises, as CUDA's."""
    pinned: list[list[int]] = []

    def pin_memory(self, *args, **kwargs):
        if getattr(self, "stands_for_device", False):
            raise RuntimeError("cannot pin 'torch.cuda.IntTensor' only dense CPU tensors can be pinned")
        pinned.append(self.tolist())
        return self

    real_tensor = torch.tensor

    def tensor(data, *args, pin_memory=False, **kwargs):
        built = real_tensor(data, *args, **kwargs)
        return built.pin_memory() if pin_memory else built

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    monkeypatch.setattr(torch, "tensor", tensor)
    monkeypatch.setattr(forward_batch_info, "enable_num_token_non_padded", lambda *args: False)
    import sglang.srt._patchkit.runtime.host_copies as runtime_copies

    monkeypatch.setattr(runtime_copies, "pin_memory_for", lambda device: True)  # as on a GPU
    return pinned


def test_the_forks_pinned_copy_runs_with_device_lengths_and_still_pins_host_lists(forward_batch_info, pins):
    module = forward_batch_info
    with_mirror = module.ForwardBatch.init_new(draft_extend(module, [4, 4, 4], [7, 12, 4]), runner())
    assert pins == [[4, 4, 4], [7, 12, 4]]  # host lists pinned, as the fork pinned them
    pins.clear()
    without = module.ForwardBatch.init_new(
        draft_extend(module, on_device([4, 4, 4]), on_device([7, 12, 4])), runner()
    )  # raised before issue 69: `.pin_memory()` of the device lengths
    assert pins == []
    assert without.extend_seq_lens_cpu is None and without.extend_prefix_lens_cpu is None
    for name in ("extend_seq_lens", "extend_prefix_lens", "positions", "extend_start_loc"):
        assert torch.equal(getattr(without, name), getattr(with_mirror, name)), name


def test_the_tree_written_before_issue_69_raises_here(forward_batch_info, pins):
    """The check's own sanity: the shape patchkit wrote before (as_tensor, then the fork's pin) raises."""
    lens = on_device([4, 4, 4])
    with pytest.raises(RuntimeError, match="only dense CPU tensors can be pinned"):
        torch.as_tensor(lens, dtype=torch.int32).pin_memory()
