"""Patch dsa-no-mirror on 0.5.7 .. 0.5.9: the verify and draft-extend lengths
expanded on the device, as 0.5.10 does.

0.5.7 .. 0.5.9's ``init_forward_metadata`` and CUDA-graph replay build the
per-token lengths of target verify and the draft extend on the host, from the
mirror (``forward_batch.seq_lens_cpu.tolist()``, ``seq_lens_cpu.tolist()``):
without the mirror that is a crash, with it a host loop of ``torch.arange``
launches. 0.5.10 replaced each with ``seqlens_expand_triton`` on the device
lengths; these codemods write that call on backends.dsa ``seqlens_expand``
(the same expansion in torch ops: the Triton kernel is not in these trees),
following each host list to the device tensor it was read from
(``common.host_expansion``). The kv lengths' host list that only the
expansion read (``seqlens_int32_cpu``) goes. The capture (start-up, outside
the graph; 0.5.10 .. 0.5.12.post1 keep it too) and the prefill branch are
left as they are.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import Finding, MethodCodemod
from patchkit.codemods.common.host_expansion import EXPAND, device_form, host_expansions, spec_branches
from patchkit.codemods.dsa_no_mirror.common import DSA, DSA_HELPERS, NSA, ShimAware

_OURS = m.Call(func=m.Name(EXPAND))


def _calls_expand(node: cst.CSTNode) -> bool:
    """Upstream's kernel (``seqlens_expand_triton``, 0.5.10+) or a fused metadata kernel (0.5.15+)."""
    return primitives.contains(
        node,
        m.Call(func=m.Name() | m.Attribute())
        & m.MatchIfTrue(lambda c: "seqlens_expand" in _name(c) or "draft_extend_metadata" in _name(c)),
    )


def _name(call: cst.Call) -> str:
    func = call.func
    return func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(func, cst.Attribute) else ""


class NsaEagerExpandsOnDevice(ShimAware, MethodCodemod):
    DESCRIPTION = (
        f"{NSA}.init_forward_metadata: the verify and draft-extend lengths expanded on the device "
        "(seqlens_expand, as 0.5.10's seqlens_expand_triton), not on the host from seq_lens_cpu.tolist() "
        "(0.5.7 .. 0.5.9)"
    )
    CLASS = NSA
    METHOD = "init_forward_metadata"
    # A fork's copy of the host expansion (a renamed backend): it becomes the device call.
    REPLACES_VENDOR = (
        (r"seq_lens_cpu|tolist|torch\.cat|arange|zip", "the fork's host expansion of the lengths runs on the device"),
    )

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        anchor = self.anchor_of(fn)
        found = host_expansions(fn)
        for branch, call in found:
            if device_form(fn, branch, call) is None:  # the release gate says not applicable first
                return self.missing_in(
                    fn,
                    "a host expansion of the lengths whose lists are not `X_cpu`, `X.tolist()`, "
                    "`[A + kv for kv in X.tolist()]` or `[W] * n`",
                    "those lists to follow them to device tensors",
                    call,
                )
        if found:
            return Finding.todo(anchor, f"{len(found)} verify / draft-extend expansion(s) on the host from the mirror")
        if any(primitives.contains(b.body, _OURS) for b in spec_branches(fn)):
            return Finding.done(anchor)
        if any(_calls_expand(b.body) for b in spec_branches(fn)):
            return Finding.superseded(anchor, "the lengths are expanded on the device here (0.5.10+)")
        return Finding.superseded(anchor, "no host expansion of the verify / draft-extend lengths here")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        dead: set[str] = set()
        for branch, call in host_expansions(fn):
            form = device_form(fn, branch, call)
            assert form is not None  # detect checked every one
            dead.update(form.dead)
            fn = primitives.replace_node(fn, call, primitives.parse_expression(form.call))
        for name in sorted(dead):
            fn = primitives.remove_statements(fn, primitives.line(primitives.assigns_name(name)))
        self.require_import(DSA_HELPERS, EXPAND)
        return fn


class DsaEagerExpandsOnDevice(NsaEagerExpandsOnDevice):
    DESCRIPTION = NsaEagerExpandsOnDevice.DESCRIPTION.replace(NSA, DSA)
    CLASS = DSA


class NsaReplayExpandsOnDevice(NsaEagerExpandsOnDevice):
    DESCRIPTION = (
        f"{NSA}.init_forward_metadata_replay_cuda_graph: the verify and draft-extend lengths expanded on the "
        "device (seqlens_expand), not on the host from seq_lens_cpu.tolist() (0.5.7 .. 0.5.9)"
    )
    METHOD = "init_forward_metadata_replay_cuda_graph"
    RENAMED = ("_apply_cuda_graph_metadata",)  # 0.5.13+


class DsaReplayExpandsOnDevice(NsaReplayExpandsOnDevice):
    DESCRIPTION = NsaReplayExpandsOnDevice.DESCRIPTION.replace(NSA, DSA)
    CLASS = DSA
