"""Vendor forks VI (issue 69), the shapes on snippets: a fork's own pinned copy of
the extend lengths carried by needs-cpu-seq-lens, the postcondition that keeps
the device lengths away from host-only code, and the ``--skip`` advice."""

from __future__ import annotations

import pytest
from fork_shapes import INIT_NEW_HEAD, OWN_PINS

from patchkit import registry
from patchkit.checks.device_lens import host_only_uses
from patchkit.codemods.common.base import State
from patchkit.codemods.needs_cpu_seq_lens_guards import GuardDraftTreeMask, GuardInitNewExtendLens
from patchkit.errors import PatchkitError
from patchkit.testing import assert_codemod, code, detect

PINNED_BY_THE_FORK = (
    INIT_NEW_HEAD
    + "            assert isinstance(batch.extend_seq_lens, list)\n"
    + OWN_PINS
    + "            ret.extend_seq_lens_cpu = batch.extend_seq_lens\n        return ret\n"
)
CARRIED = (
    PINNED_BY_THE_FORK.replace(
        "import torch\n",
        "import torch\nfrom sglang.srt._patchkit.runtime import host_list_or_none, pinned_tensor\n",
    )
    .replace("isinstance(batch.extend_seq_lens, list)", "isinstance(batch.extend_seq_lens, (list, torch.Tensor))")
    .replace(
        "torch.tensor(batch.extend_seq_lens, dtype=torch.int32)\n                .pin_memory()\n",
        "pinned_tensor(batch.extend_seq_lens, dtype=torch.int32, pin_for=device)\n",
    )
    .replace(
        "torch.tensor(batch.extend_prefix_lens, dtype=torch.int32)\n                .pin_memory()\n",
        "pinned_tensor(batch.extend_prefix_lens, dtype=torch.int32, pin_for=device)\n",
    )
    .replace("_cpu = batch.extend_seq_lens", "_cpu = host_list_or_none(batch.extend_seq_lens)")
)


def test_a_forks_own_pinned_copy_becomes_pinned_tensor_which_keeps_device_lengths():
    """Shape 1: ``torch.as_tensor(...).pin_memory()`` would raise on the GPU-only draft
    extend's device lengths; ``pinned_tensor`` pins a host list, as the fork did, and
    keeps a device tensor where it is."""
    assert CARRIED.count("pinned_tensor(") == 2 and ".pin_memory()" not in CARRIED
    assert_codemod(GuardInitNewExtendLens, PINNED_BY_THE_FORK, CARRIED)
    assert not list(host_only_uses(CARRIED.encode()))


def _uses(src: str) -> list[tuple[int, str, str]]:
    return [(u.line, u.value, u.use) for u in host_only_uses(code(src).encode())]


# What needs-cpu-seq-lens would write on three fork shapes no guard of it fits.
def test_the_postcondition_names_a_pin_of_the_lengths_as_tensor_at_its_line():
    """Shape 1 as the patch wrote it before issue 69: as_tensor keeps the device
    lengths, and the fork's .pin_memory() of them raises."""
    assert _uses("""
        class ForwardBatch:
            def init_new(cls, batch, device):
                ret.extend_prefix_lens = (
                    torch.as_tensor(batch.extend_prefix_lens, dtype=torch.int32)
                    .pin_memory()
                    .to(device, non_blocking=True)
                )
    """) == [(4, "torch.as_tensor(batch.extend_prefix_lens, dtype=torch.int32)", "`.pin_memory()`")]


def test_the_postcondition_follows_a_local_to_numpy_and_tolist():
    """A ROCm fork: the host tensors built into locals, its positions computed with numpy."""
    assert _uses("""
        class ForwardBatch:
            def init_new(cls, batch, device):
                assert isinstance(batch.extend_seq_lens, (list, torch.Tensor))
                _seq_cpu = torch.as_tensor(batch.extend_seq_lens, dtype=torch.int32)
                ret.extend_seq_lens = _seq_cpu.to(device, non_blocking=True)
                starts = np.cumsum(_seq_cpu.numpy())
                host = _seq_cpu.cpu().numpy()
                ends = _seq_cpu[:4].tolist()
    """) == [(6, "_seq_cpu", "`.numpy()`"), (8, "_seq_cpu[:4]", "`.tolist()`")]


def test_the_postcondition_names_iteration_and_len_of_the_lengths_but_not_a_list_branch():
    assert _uses("""
        class ForwardBatch:
            def init_new(cls, batch, device):
                ret.extend_seq_lens = torch.as_tensor(batch.extend_seq_lens).to(device)
                total = sum(batch.extend_seq_lens)
                for n in batch.extend_prefix_lens:
                    pass
                lens = [n + 1 for n in ret.extend_seq_lens]
                count = len(batch.extend_seq_lens)
    """) == [
        (4, "batch.extend_seq_lens", "`sum(...)`"),
        (5, "batch.extend_prefix_lens", "iteration (`for ... in`)"),
        (8, "batch.extend_seq_lens", "`len(...)`"),
    ]
    # Under the fork's own list test (what the refusal suggests), or in a function the patch
    # did not open to device lengths: nothing to say.
    assert (
        _uses("""
        def init_new(cls, batch, device):
            ret.extend_seq_lens = torch.as_tensor(batch.extend_seq_lens).to(device)
            if isinstance(batch.extend_seq_lens, list):
                total = sum(batch.extend_seq_lens)
    """)
        == []
    )
    assert (
        _uses("""
        def compute_positions(batch):
            return sum(batch.extend_seq_lens), [n for n in batch.extend_prefix_lens]
    """)
        == []
    )


def test_the_postconditions_answer_is_kept_by_the_files_bytes_in_the_transform_cache(tmp_path, monkeypatch):
    """A warm apply does not parse a changed file again for this check (nor
    the parent, where a worker wrote it: the head start): the first use is a
    fact of the file's bytes, the same answer read back; other bytes are asked afresh."""
    from patchkit.checks import device_lens

    monkeypatch.setenv("PATCHKIT_TRANSFORM_CACHE", str(tmp_path / "cache"))
    rel = "srt/model_executor/forward_batch_info.py"
    bad = code("""
        class ForwardBatch:
            def init_new(cls, batch, device):
                ret.extend_seq_lens = torch.as_tensor(batch.extend_seq_lens).to(device)
                count = len(batch.extend_seq_lens)
    """).encode()
    device_lens.DeviceLensStayOnDevice().head_start(None).after(rel, b"", bad)  # as a worker does
    assert list((tmp_path / "cache").rglob("*")), "the answer was kept"
    with monkeypatch.context() as m:
        m.setattr(device_lens, "host_only_uses", lambda *a: pytest.fail("parsed again"))
        use = device_lens.host_only_use_in(rel, bad)
        assert use is not None and (use.line, use.use) == (4, "`len(...)`")
        assert device_lens.host_only_use_in("srt/a.py", b"x = 1\n") is None  # names no lengths: not parsed
    assert device_lens.host_only_use_in(rel, bad.replace(b"count = len(", b"count = (")) is None


# --- item 4: --skip advice that works the first time ------------------------------------


def test_skip_advice_names_every_dependent_and_cascades():
    deps = registry.dependents("needs-cpu-seq-lens")
    assert len(deps) >= 5 and "replay-no-stale-mirror" in deps
    advice = registry.skip_advice("needs-cpu-seq-lens")
    assert advice.startswith("`--skip needs-cpu-seq-lens --cascade`")
    assert all(d in advice for d in deps)
    assert (
        registry.skip_advice("verify-wait-on-stream")
        == "`--skip verify-wait-on-stream` (the other patches still apply)"
    )


def test_select_names_every_blocked_dependent_at_once_and_cascade_leaves_them_out():
    with pytest.raises(PatchkitError) as refused:
        registry.select([], ["needs-cpu-seq-lens"])
    message = str(refused.value)
    assert all(d in message for d in registry.dependents("needs-cpu-seq-lens"))
    assert "`--skip needs-cpu-seq-lens --cascade`" in message and "\n" not in message
    left = {p.id for p in registry.select([], ["needs-cpu-seq-lens"], cascade=True)}
    assert not left & {"needs-cpu-seq-lens", *registry.dependents("needs-cpu-seq-lens")}
    assert "verify-wait-on-stream" in left


# --- item 2: the tree-mask read one decorator away ----------------------------------------

DECORATED = code("""
    class EagleDraftWorker(BaseDraftWorker):
        @staticmethod
        def draft_wrapper(draft_func):
            def wrapper(self, model_worker_batch):
                draft_input = draft_func(self, model_worker_batch)
                tree_mask_buf, position_buf = (
                    self.target_worker.model_runner.attn_backend.get_verify_buffers_to_fill_after_draft()
                )
                (tree_mask, position, draft_tokens) = build_tree_kernel_efficient(
                    draft_input.bonus_tokens,
                    model_worker_batch.seq_lens,
                    model_worker_batch.seq_lens_sum,
                    self.topk,
                    tree_mask_buf,
                    position_buf,
                )
                return EagleVerifyInput(draft_token=draft_tokens, seq_lens_sum=None, seq_lens_cpu=None)

            return wrapper

        @draft_wrapper
        def draft(self, model_worker_batch: ModelWorkerBatch):
            return self.draft_forward(model_worker_batch)
""")


def test_the_tree_mask_read_in_a_decorator_of_the_same_class_is_guarded_there():
    after = "from sglang.srt._patchkit.runtime import tree_mask_seq_lens_sum\n" + DECORATED.replace(
        "                model_worker_batch.seq_lens_sum,\n",
        "                tree_mask_seq_lens_sum(model_worker_batch.seq_lens_sum, tree_mask_buf, "
        "model_worker_batch.seq_lens, self.target_worker.model_runner.attn_backend, model_worker_batch),\n",
    )
    assert_codemod(GuardDraftTreeMask, DECORATED, after)


def test_a_read_in_the_decorator_no_guard_fits_is_refused_at_its_line_naming_the_method():
    odd = DECORATED.replace(
        "            (tree_mask, position, draft_tokens) = build_tree_kernel_efficient(",
        "            budget = model_worker_batch.seq_lens_sum * 2\n"
        "            (tree_mask, position, draft_tokens) = acme_tree_kernel(",
    )
    finding = detect(GuardDraftTreeMask, odd, "srt/speculative/eagle_worker_v2.py")
    assert finding.state is State.MISSING
    assert finding.detail.startswith("srt/speculative/eagle_worker_v2.py:9: ")  # the read's line, not the def's
    assert "reached from EagleDraftWorker.draft through its decorator @draft_wrapper" in finding.detail


def test_a_decorator_the_module_defines_is_followed_too():
    at_top = code("""
        def draft_wrapper(draft_func):
            def wrapper(self, model_worker_batch):
                draft_input = draft_func(self, model_worker_batch)
                tree_mask_buf, position_buf = self.attn_backend.get_verify_buffers_to_fill_after_draft()
                return build_tree_kernel_efficient(model_worker_batch.seq_lens_sum, tree_mask_buf)

            return wrapper


        class EagleDraftWorker(BaseDraftWorker):
            @draft_wrapper
            def draft(self, model_worker_batch: ModelWorkerBatch):
                return self.draft_forward(model_worker_batch)
    """)
    after = "from sglang.srt._patchkit.runtime import tree_mask_seq_lens_sum\n" + at_top.replace(
        "build_tree_kernel_efficient(model_worker_batch.seq_lens_sum, tree_mask_buf)",
        "build_tree_kernel_efficient(tree_mask_seq_lens_sum(model_worker_batch.seq_lens_sum, tree_mask_buf, "
        "model_worker_batch.seq_lens, self.attn_backend, model_worker_batch), tree_mask_buf)",
    )
    assert_codemod(GuardDraftTreeMask, at_top, after)
