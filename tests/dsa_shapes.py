"""Shared by the DSA (NSA) tests of both folders (patch dsa-no-mirror): run the eager
page-table width of a backend's ``init_forward_metadata`` on a spec-v2 decode batch
without the CPU mirror, counting the host reads of the device lengths (sglang #33973:
such a read is a wait whose timing differs between DP-attention ranks)."""

from __future__ import annotations

import ast
from types import SimpleNamespace
from typing import Any, Optional

from patchkit.backends import mirror_reads

DEVICE_MAX = 100  # what the fake device lengths report
MAX_CONTEXT_LEN = 163840  # DeepSeek-V3.2's context


class DeviceLens:
    """Device seq_lens whose every host read is counted (a rank-divergent wait on a GPU)."""

    def __init__(self) -> None:
        self.reads = 0

    def max(self):
        self.reads += 1
        return SimpleNamespace(item=lambda: DEVICE_MAX)


def eager_width(source: str, cls: str, bound: Optional[Any]) -> tuple[int, int]:
    """Run the statements of ``cls.init_forward_metadata`` up to the one that sets
    max_seqlen_k, on a spec-v2 decode batch without the mirror: (width, device reads)."""
    fn = next(
        f
        for c in ast.parse(source).body
        if isinstance(c, ast.ClassDef) and c.name == cls
        for f in c.body
        if isinstance(f, ast.FunctionDef) and f.name == "init_forward_metadata"
    )
    body = []  # how draft_token_num is set, asserts of the mirror, and the width itself
    for stmt in fn.body:
        text = ast.unparse(stmt)
        if "draft_token_num =" in text or (isinstance(stmt, ast.Assert) and "seq_lens_cpu" in text):
            body.append(stmt)
        elif "max_seqlen_k =" in text:
            body.append(stmt)
            break
    device = DeviceLens()
    batch = SimpleNamespace(
        seq_lens_cpu=None,
        seq_lens=device,
        seq_lens_host_bound=bound,
        forward_mode=SimpleNamespace(is_target_verify=lambda: False),
    )
    scope = {
        "forward_batch": batch,
        "self": SimpleNamespace(max_context_len=MAX_CONTEXT_LEN, speculative_num_draft_tokens=4),
        "host_max_seq_len": mirror_reads.host_max_seq_len,
        "batch_size": 8,
    }
    exec(compile(ast.Module(body=body, type_ignores=[]), cls, "exec"), scope)
    return scope["max_seqlen_k"], device.reads
