"""Text of fork shapes used by more than one test folder (issue 69), written onto
real releases and into snippets: ``ForwardBatch.init_new``'s extend-length
copies as 0.5.7 .. 0.5.12.post1 write them and as forks do (their own pins;
locals), and a fork's ``maybe_wait_verify_done``."""

from __future__ import annotations

FORWARD_BATCH = "srt/model_executor/forward_batch_info.py"

#: A snippet's ``ForwardBatch.init_new`` up to its extend branch, whose body (12 spaces in) follows.
INIT_NEW_HEAD = """import torch


class ForwardBatch:
    @classmethod
    def init_new(cls, batch, model_runner):
        ret = cls(forward_mode=batch.forward_mode)
        device = model_runner.device
        if not ret.forward_mode.is_decode():
"""
RELEASE_COPIES = """            ret.extend_seq_lens = torch.tensor(
                batch.extend_seq_lens, dtype=torch.int32
            ).to(device, non_blocking=True)
            ret.extend_prefix_lens = torch.tensor(
                batch.extend_prefix_lens, dtype=torch.int32
            ).to(device, non_blocking=True)
"""
#: Shape 1 (0.5.7, 0.5.12.post1 forks): the fork pins its own copies.
OWN_PINS = """            ret.extend_seq_lens = (
                torch.tensor(batch.extend_seq_lens, dtype=torch.int32)
                .pin_memory()
                .to(device, non_blocking=True)
            )
            ret.extend_prefix_lens = (
                torch.tensor(batch.extend_prefix_lens, dtype=torch.int32)
                .pin_memory()
                .to(device, non_blocking=True)
            )
"""
#: A 0.5.10 ROCm fork: the host tensors built into locals first, which its positions read.
LOCALS = """            # ROCm computes the positions from the host tensors.
            _seq_cpu = torch.tensor(batch.extend_seq_lens, dtype=torch.int32)
            _prefix_cpu = torch.tensor(batch.extend_prefix_lens, dtype=torch.int32)
            ret.extend_seq_lens = _seq_cpu.to(device, non_blocking=True)
            ret.extend_prefix_lens = _prefix_cpu.to(device, non_blocking=True)
            ret.extend_prefix_lens_host = torch.as_strided(_prefix_cpu, _prefix_cpu.shape, (1,))
"""
#: A fork between 0.5.11 and 0.5.12: ``maybe_wait_verify_done``'s event in a local, an early
#: return, and the host wait in the else branch of its own stream wait behind a flag.
BRANCHED_WAIT = """        verify_done = getattr(draft_input, "verify_done", None)
        if verify_done is None:
            return
        if envs.SGLANG_ENABLE_OVERLAP_PLAN_STREAM.get():
            torch.get_device_module(self.device).current_stream().wait_event(verify_done)
        else:
            verify_done.synchronize()
"""


def draft_in_a_wrapper(text: str) -> str:
    """``EagleDraftWorker.draft`` of 0.5.12's eagle_worker_v2.py with its tree-mask build moved
    into a decorator of the same class, ``@draft_wrapper`` (a 0.5.12 fork)."""
    start = text.index("    def draft(self, model_worker_batch: ModelWorkerBatch):\n")
    build = text.index("        # Build tree mask\n", start)
    end = text.index("\n    def ", build) + 1
    wrapped = "".join("    " + line if line.strip() else line for line in text[build:end].splitlines(True))
    wrapper = (
        "    @staticmethod\n"
        "    def draft_wrapper(draft_func):\n"
        "        def wrapper(self, model_worker_batch):\n"
        "            drafted = draft_func(self, model_worker_batch)\n"
        "            if not isinstance(drafted, tuple):\n"
        "                return drafted  # the idle input\n"
        "            draft_input, parent_list, top_scores_index, draft_tokens = drafted\n"
        f"{wrapped.rstrip()}\n\n"
        "        return wrapper\n\n"
        "    @draft_wrapper\n"
    )
    drafted = "        return draft_input, parent_list, top_scores_index, draft_tokens\n\n"
    return text[:start] + wrapper + text[start:build] + drafted + text[end:]
