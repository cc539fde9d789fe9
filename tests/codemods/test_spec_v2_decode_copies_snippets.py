"""Snippet tests of tests/trees/test_spec_v2_decode_copies.py (no release read; the quick loop runs them)."""

from __future__ import annotations

from unittest import mock

import pytest
from fork_shapes import INIT_NEW_HEAD
from fork_shapes import LOCALS as LOCALS_BODY

from patchkit.codemods.common.base import State
from patchkit.codemods.spec_v2_decode_copies import ExtendLensCopiesPinned as INIT_NEW
from patchkit.codemods.spec_v2_decode_copies import KvLensCopiesWithoutWait as CODEMOD
from patchkit.runtime import host_copies
from patchkit.testing import apply, assert_codemod, assert_state, code, detect

BEFORE = code("""
    import torch


    class EagleDraftInputV2Mixin:
        def prepare_for_decode(self, batch):
            cur_kv_lens_cpu = torch.tensor(cur_kv_lens, dtype=torch.int32, device="cpu")
            nxt_kv_lens_cpu = torch.tensor(nxt_kv_lens, dtype=torch.int32, device="cpu")
            if page_size == 1:
                out_cache_loc = alloc_token_slots(batch.tree_cache, num_needed_tokens)
            else:
                cur_kv_lens = cur_kv_lens_cpu.to(device=batch.device)
                nxt_kv_lens = nxt_kv_lens_cpu.to(device=batch.device)
            assign_req_to_token_pool_func(
                batch.req_pool_indices,
                cur_kv_lens_cpu.to(device=batch.device),
                nxt_kv_lens_cpu.to(device=batch.device),
            )
""")


PIN = ", pin_memory=pin_memory_for(batch.device))"


PINNED = "pin_for=device"


AFTER = (
    BEFORE.replace("import torch\n", "import torch\nfrom sglang.srt._patchkit.runtime import pin_memory_for\n")
    .replace('device="cpu")', 'device="cpu"' + PIN)
    .replace(".to(device=batch.device)", ".to(device=batch.device, non_blocking=True)")
)


UPSTREAM = code("""
    class EagleDraftInputV2Mixin:
        def prepare_for_decode(self, batch):
            cur_kv_lens_cpu = torch.tensor(cur_kv_lens, dtype=torch.int32, device="cpu")
            cur_kv_lens_device = cur_kv_lens_cpu.to(device=batch.device, non_blocking=True)
""")


def test_every_copy_non_blocking_from_a_pinned_tensor():
    assert_codemod(CODEMOD, BEFORE, AFTER)


def test_upstreams_non_blocking_copies_are_done():
    assert_state(CODEMOD, UPSTREAM, State.DONE, "0.5.13")


def test_fork_spellings_positional_device_and_no_device_keyword():
    src = BEFORE.replace('dtype=torch.int32, device="cpu")', "dtype=torch.int32)").replace(
        ".to(device=batch.device)", ".to(batch.device)"
    )
    out = apply(CODEMOD, src)
    assert out.count(".to(batch.device, non_blocking=True)") == 4
    assert out.count("dtype=torch.int32, pin_memory=pin_memory_for(batch.device))") == 2


def test_a_copy_already_non_blocking_is_kept_and_a_device_tensor_is_not_touched():
    src = BEFORE.replace(
        "nxt_kv_lens_cpu.to(device=batch.device),", "nxt_kv_lens_cpu.to(device=batch.device, non_blocking=True),"
    )
    src = src.replace(
        "        nxt_kv_lens_cpu = ", "        x = torch.tensor(y, device=batch.device)\n        nxt_kv_lens_cpu = ", 1
    )
    out = apply(CODEMOD, src)
    assert "x = torch.tensor(y, device=batch.device)\n" in out
    assert out.count("non_blocking=True") == 4 and out.count("pin_memory=") == 2


def test_lengths_kept_on_the_device_are_superseded_and_an_unknown_copy_is_missing():
    """0.5.4, 0.5.5: no host tensor at all; a host tensor copied in a shape
    this change does not know is a missing anchor."""
    src = code("""
        class EagleDraftInputV2Mixin:
            def prepare_for_decode(self, batch):
                new_allocate_lens = batch.seq_lens + self.ALLOC_LEN_PER_DECODE
    """)
    assert_state(CODEMOD, src, State.SUPERSEDED, "on the device")
    other = src.replace(
        "new_allocate_lens = batch", "lens = torch.tensor(x)\n        copy_to(lens)\n        new_allocate_lens = batch"
    )
    finding = detect(CODEMOD, other)
    assert finding.state is State.MISSING and "host tensor" in finding.detail


def test_pin_memory_for_pins_only_cuda_with_a_driver():
    assert host_copies.pin_memory_for("cpu") is False
    with mock.patch("torch.cuda.is_available", return_value=True):
        assert host_copies.pin_memory_for("cuda") is True
        assert host_copies.pin_memory_for("cuda:1") is True
        assert host_copies.pin_memory_for("cpu") is False
    with mock.patch("torch.cuda.is_available", return_value=False):
        assert host_copies.pin_memory_for("cuda") is False


INIT_BEFORE = code("""
    import torch


    class ForwardBatch:
        @classmethod
        def init_new(cls, batch, model_runner):
            ret = cls(forward_mode=batch.forward_mode)
            device = model_runner.device
            if enable_num_token_non_padded():
                ret.num_token_non_padded = torch.tensor(num_tokens, dtype=torch.int32).to(
                    device, non_blocking=True
                )
            positions = torch.tensor([1, 2], dtype=torch.int32).to(device, non_blocking=True)
            if ret.forward_mode.is_decode():
                pass
            else:
                ret.extend_seq_lens = torch.tensor(
                    batch.extend_seq_lens, dtype=torch.int32
                ).to(device, non_blocking=True)
                ret.extend_prefix_lens = torch.tensor(
                    batch.extend_prefix_lens, dtype=torch.int32
                ).to(device, non_blocking=True)
            return ret
""")


INIT_AFTER = (
    INIT_BEFORE.replace("import torch\n", "import torch\nfrom sglang.srt._patchkit.runtime import pinned_tensor\n")
    .replace(
        "= torch.tensor(num_tokens, dtype=torch.int32).to(\n",
        "= pinned_tensor(num_tokens, dtype=torch.int32, pin_for=device).to(\n",
    )
    .replace("lens = torch.tensor(\n", "lens = pinned_tensor(\n")
    .replace("lens, dtype=torch.int32\n", "lens, dtype=torch.int32, pin_for=device\n")
)


def test_init_new_pins_the_extend_lengths_in_the_calls_layout():
    """Each per-step list copied to the device is built pinned; a copy of
    another list (dLLM positions, not per step) is left as it was."""
    assert INIT_AFTER.count(PINNED) == 3
    assert_codemod(INIT_NEW, INIT_BEFORE, INIT_AFTER)


def test_init_new_needs_cpu_seq_lens_as_tensor_form_is_pinned_too():
    """needs-cpu-seq-lens makes the extend lengths ``torch.as_tensor(...)``
    (device lengths pass): the same helper, which keeps a tensor as it is."""
    guarded = INIT_BEFORE.replace("lens = torch.tensor(\n", "lens = torch.as_tensor(\n")
    assert apply(INIT_NEW, guarded) == INIT_AFTER


def test_init_new_upstreams_pinned_copies_are_done():
    """0.5.19+: ``pin_memory=is_pin_memory_available(device)``, or a name holding it."""
    upstream = INIT_BEFORE.replace(
        "dtype=torch.int32).to(\n", "dtype=torch.int32, pin_memory=is_pin_memory_available(device)).to(\n"
    ).replace("lens, dtype=torch.int32\n", "lens, dtype=torch.int32, pin_memory=pin_memory\n")
    assert_state(INIT_NEW, upstream, State.DONE, "0.5.19")


def test_init_new_a_forks_blocking_copy_becomes_non_blocking_and_no_extend_copy_is_missing():
    head, tail = INIT_BEFORE.rsplit(").to(device, non_blocking=True)", 1)  # the prefix lengths' copy
    fork = head + ").to(device)" + tail
    assert apply(INIT_NEW, fork) == INIT_AFTER
    gone = INIT_BEFORE.replace("ret.extend_seq_lens = ", "extend_seq_lens = ")
    finding = detect(INIT_NEW, gone)
    assert finding.state is State.MISSING and "extend lengths" in finding.detail


# Issue 69: forks that copy the extend lengths their own way.
OWN_PINS = INIT_BEFORE.replace(
    "lens, dtype=torch.int32\n            ).to(device, non_blocking=True)",
    "lens, dtype=torch.int32\n            ).pin_memory().to(device, non_blocking=True)",
)


def test_init_new_a_fork_that_pins_the_extend_lengths_itself_is_superseded_else_the_rest_is_pinned():
    """A 0.5.7 / 0.5.12.post1 fork: ``torch.tensor(LIST, ...).pin_memory().to(device, non_blocking=True)``
    for both lists. Its own pins are the change done its way; another per-step copy it left
    pageable (the EP count) is still pinned, and the fork's pins are kept."""
    assert OWN_PINS.count(".pin_memory()") == 2
    only_lens = OWN_PINS.replace(
        "        if enable_num_token_non_padded():\n"
        "            ret.num_token_non_padded = torch.tensor(num_tokens, dtype=torch.int32).to(\n"
        "                device, non_blocking=True\n"
        "            )\n",
        "",
    )
    finding = assert_state(INIT_NEW, only_lens, State.SUPERSEDED, "pins the extend lengths")
    assert finding.by_tree and "at line 13" in finding.detail  # the prefix lengths' pinned copy
    after = apply(INIT_NEW, OWN_PINS)
    assert after.count(".pin_memory().to(device, non_blocking=True)") == 2
    assert "pinned_tensor(num_tokens, dtype=torch.int32, pin_for=device)" in after


LOCALS = INIT_NEW_HEAD + LOCALS_BODY + "        return ret\n"


def test_init_new_a_fork_that_builds_the_host_tensors_in_locals_pins_them_there():
    """A 0.5.10 fork (ROCm): the host tensors built into locals first, which its positions read."""
    after = (
        LOCALS.replace("import torch\n", "import torch\nfrom sglang.srt._patchkit.runtime import pinned_tensor\n")
        .replace("= torch.tensor(batch.", "= pinned_tensor(batch.")
        .replace("dtype=torch.int32)\n", "dtype=torch.int32, pin_for=device)\n")
    )
    assert after.count(PINNED) == 2
    assert_codemod(INIT_NEW, LOCALS, after)
    blocking = LOCALS.replace("_seq_cpu.to(device, non_blocking=True)", "_seq_cpu.to(device)")
    assert apply(INIT_NEW, blocking) == after


def test_pinned_tensor_keeps_a_tensor_and_pins_a_list_where_pinning_is_available():
    torch = pytest.importorskip("torch")
    on_device = torch.tensor([3, 4])
    assert host_copies.pinned_tensor(on_device, dtype=torch.int64, pin_for="cuda") is on_device
    built = host_copies.pinned_tensor([3, 4], dtype=torch.int32, pin_for="cpu")
    assert built.dtype == torch.int32 and built.tolist() == [3, 4] and not built.is_pinned()
    with mock.patch.object(host_copies, "pin_memory_for", return_value=True), mock.patch("torch.tensor") as tensor:
        host_copies.pinned_tensor([3, 4], dtype=torch.int32, pin_for="cuda")
    tensor.assert_called_once_with([3, 4], pin_memory=True, dtype=torch.int32)


def test_the_moved_function_upstreams_copies_are_done_a_forks_blocking_ones_are_carried():
    """0.5.15+: upstream moved the method to eagle_utils.eagle_prepare_for_decode."""
    from patchkit.codemods.spec_v2_decode_copies import MovedKvLensCopiesWithoutWait as MOVED

    upstream = code("""
        def eagle_prepare_for_decode(batch):
            cur_kv_lens_cpu = torch.tensor(cur_kv_lens, dtype=torch.int32, device="cpu")
            cur_kv_lens_device = cur_kv_lens_cpu.to(device=batch.device, non_blocking=True)
    """)
    assert_state(MOVED, upstream, State.DONE, "0.5.13+")
    fork = upstream.replace(", non_blocking=True", "")
    out = apply(MOVED, fork)
    assert "cur_kv_lens_cpu.to(device=batch.device, non_blocking=True)" in out and PIN in out
    assert_state(MOVED, "def other():\n    pass\n", State.SUPERSEDED, "eagle_info_v2.py")
