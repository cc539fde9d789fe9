"""Patch dsa-no-mirror: target verify's per-request query lengths filled on the
device, not copied from a host list.

The verify branch of ``init_forward_metadata`` (eager) and of the CUDA-graph
replay (``init_forward_metadata_replay_cuda_graph``, ``_apply_cuda_graph_metadata``
from 0.5.13) hands ``seqlens_expand_triton`` the query lengths as
``torch.tensor(extend_seq_lens_cpu, dtype=torch.int32, device=...)`` with
``extend_seq_lens_cpu = [self.speculative_num_draft_tokens] * bs``: a copy from
pageable host memory, which the host waits for, once per decode step (the one
host wait left in a patched tree by torch's sync debug, DeepSeek-V3.2 MTP on an
H200). The values are one number repeated: ``torch.full((bs,), D, dtype=...,
device=...)`` makes them on the device (``common.host_copies.filled_on_device``).
0.5.15 writes that in the replay; the eager branch still copies through 0.5.23
(past upstream). The host list stays where something else reads it
(``forward_batch.extend_seq_lens_cpu = extend_seq_lens_cpu``).

0.5.7 .. 0.5.9 build these lengths on the host another way, which ``expand.py``
turns into ``seqlens_expand`` with a fixed width (no tensor from a host list):
nothing for these codemods there. A verify branch whose tensor is built from a
list patchkit cannot follow to ``[W] * n`` is left as it is, and said so.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import host_copies, primitives
from patchkit.codemods.common.base import Finding, MethodCodemod
from patchkit.codemods.common.primitives import attr
from patchkit.codemods.common.shared import code_of
from patchkit.codemods.dsa_no_mirror.common import DSA, NSA, ShimAware

#: ``elif forward_mode.is_target_verify():`` (either spelling of the mode), a branch of its own.
VERIFY = m.If(test=m.Call(func=attr("is_target_verify"), args=[]))
#: The comment patchkit writes above the line it fills on the device: how detect tells its own.
MARK = "# The verify query lengths, one value per request, filled on the device:"
_COMMENT = (
    MARK,
    "# a host list made a GPU tensor is a copy from pageable memory that the host",
    "# waits for, each decode step (as sglang 0.5.15's replay; patchkit dsa-no-mirror).",
)


def _branches(fn: cst.FunctionDef) -> list[cst.If]:
    return primitives.find_all_of(cst.If, fn, VERIFY)


def _lines(fn: cst.FunctionDef) -> list[tuple[cst.If, cst.SimpleStatementLine]]:
    """The statement lines of the verify branches (each once, with its innermost branch)."""
    found: dict[int, tuple[cst.If, cst.SimpleStatementLine]] = {}
    for branch in _branches(fn):
        for line in primitives.find_all_of(cst.SimpleStatementLine, branch.body, m.SimpleStatementLine()):
            found[id(line)] = (branch, line)
    return list(found.values())


def _copies(fn: cst.FunctionDef) -> list[tuple[cst.SimpleStatementLine, cst.Call, Optional[host_copies.Filled]]]:
    """Each tensor the verify branches build on the device from host data, with its
    line and its fill on the device (None: a list not followed)."""
    return [
        (line, call, host_copies.filled_on_device(fn, call, (branch.body,)))
        for branch, line in _lines(fn)
        for call in primitives.find_all_of(cst.Call, line, host_copies.TENSOR)
        if host_copies.built_on_device(call) is not None
    ]


def _marked(line: cst.SimpleStatementLine) -> bool:
    return any(e.comment is not None and e.comment.value.startswith(MARK) for e in line.leading_lines)


class NsaVerifyLengthsOnDevice(ShimAware, MethodCodemod):
    DESCRIPTION = (
        f"{NSA}.init_forward_metadata, target verify: the query lengths [D] * bs filled on the device "
        "(torch.full), not torch.tensor(<host list>, device=...), a blocking copy each step (past upstream)"
    )
    CLASS = NSA
    METHOD = "init_forward_metadata"
    # A fork's copy of the verify branch: its torch.tensor of the repeated list, and the list
    # where nothing else reads it, become the fill.
    REPLACES_VENDOR = (
        (r"torch\.tensor|dtype=|device=|\]\s*\*|\*\s*\[", "the fork's verify lengths are filled on the device"),
    )

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        anchor = self.anchor_of(fn)
        if not _branches(fn):
            return Finding.superseded(anchor, "no `elif ...forward_mode.is_target_verify():` branch of its own here")
        copies = _copies(fn)
        todo = [call for _, call, filled in copies if filled is not None]
        if todo:
            return self.located(
                Finding.todo(
                    anchor, f"{len(todo)} verify tensor(s) copied from a host list [W] * n (a blocking copy each step)"
                ),
                todo[0],
            )
        lines = _lines(fn)
        if any(_marked(line) and primitives.contains(line, host_copies.FULL) for _, line in lines):
            return Finding.done(anchor)
        if copies:
            _, call, _ = copies[0]
            return Finding.superseded(
                anchor,
                f"left as it is: the verify branch builds `{code_of(call.args[0].value)}` on the device from host "
                "data patchkit cannot follow to a repeated list `[W] * n`",
            )
        if any(primitives.contains(line, host_copies.FULL) for _, line in lines):
            return Finding.superseded(anchor, "the verify lengths are filled on the device here (torch.full, 0.5.15+)")
        return Finding.superseded(anchor, "the verify branch builds no tensor from a host list here")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        dead: list[str] = []
        for _ in range(8):  # one copy a round: the nodes found are the current tree's
            found = next(((line, call, f) for line, call, f in _copies(fn) if f is not None), None)
            if found is None:
                break
            line, call, filled = found
            new = primitives.replace_node(line, call, filled.call)
            if not _marked(line):
                comments = [cst.EmptyLine(comment=cst.Comment(text)) for text in _COMMENT]
                new = new.with_changes(leading_lines=[*line.leading_lines, *comments])
            fn = primitives.replace_node(fn, line, new)
            dead.extend(filled.locals)
        for name in dead:  # a local only the copy read goes (the rest, e.g. forward_batch's, stays)
            if len(primitives.find_all(fn, m.Name(name))) == 1:
                fn = primitives.remove_statements(fn, primitives.line(primitives.assigns_name(name)))
        return fn


class DsaVerifyLengthsOnDevice(NsaVerifyLengthsOnDevice):
    DESCRIPTION = NsaVerifyLengthsOnDevice.DESCRIPTION.replace(NSA, DSA)
    CLASS = DSA


class NsaReplayVerifyLengthsOnDevice(NsaVerifyLengthsOnDevice):
    DESCRIPTION = (
        f"{NSA}.init_forward_metadata_replay_cuda_graph, target verify: the query lengths filled on the device "
        "(torch.full, as 0.5.15), not torch.tensor(<host list>, device=...), a blocking copy each replay"
    )
    METHOD = "init_forward_metadata_replay_cuda_graph"
    RENAMED = ("_apply_cuda_graph_metadata",)  # 0.5.13+


class DsaReplayVerifyLengthsOnDevice(NsaReplayVerifyLengthsOnDevice):
    DESCRIPTION = NsaReplayVerifyLengthsOnDevice.DESCRIPTION.replace(NSA, DSA)
    CLASS = DSA
