"""sglang #29413 + #30378: DeepSeek sparse attention's spec-v2 draft extend in a
CUDA graph, replayed at a fixed query width, its padded rows clamped.

0.5.10 .. 0.5.12.post1's spec-v2 worker captures the draft-extend graph only for
Triton and TRT-LLM MLA, so the NSA backend's draft extend runs eagerly every
step. Its replay could not be captured as it stood: the one draft-extend branch
(v1 and v2 alike) reads ``spec_info.num_accept_tokens[:bs].tolist()`` and
repeats the page table by those counts, a host read and data-dependent shapes,
while the spec-v2 draft extend runs every request at ``speculative_num_draft_tokens``
(its capture already is that width). Three codemods per class name (``Nsa*`` on
``NativeSparseAttnBackend``, ``Dsa*`` on ``DeepseekSparseAttnBackend``), one on
the worker:

* ``*DraftExtendGraphGate``: where dsa-no-mirror (which this patch builds on)
  is not applicable, neither is this (``common.dsa.SpecV2Gate``).
* ``*CapturesDraftExtendAtFixedWidth``: checked, not changed: the capture's
  draft-extend branch holds ``bs * speculative_num_draft_tokens`` rows.
* ``*DraftExtendReplayAtFixedWidth``: a ``DRAFT_EXTEND_V2`` branch before the
  shared one (upstream's shape from 0.5.14, fixed by #29413 in 0.5.15): the
  width of the draft tokens per request, lengths filled on the device, the
  page-table width from ``graph_max_len`` (dsa-no-mirror's), and the expanded
  lengths clamped at 0 (#30378: padded rows carry the fill length 1, below the
  width, and ``seq_len - width + j + 1`` went negative). The v1 branch is left
  as it is. Its local names and metadata fields are the old branch's.
* ``GraphCheckAdmitsDsa`` (``worker.py``): after the worker's graph check, or
  as one more term of the inline capture gate (0.5.8 .. 0.5.9), the backend is
  let in on CUDA (``backends.dsa_graph.is_dsa_backend``: either class name,
  either module, nothing imported), without an FR-Spec token map.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import Finding, MethodCodemod
from patchkit.codemods.common.dsa import DSA, NSA, ShimAware, SpecV2Gate
from patchkit.codemods.common.host_expansion import EXPAND, HOST_EXPANSION
from patchkit.codemods.common.primitives import attr
from patchkit.codemods.common.primitives.search import NodeMatcher
from patchkit.codemods.common.shared import code_of
from patchkit.codemods.dsa_draft_extend_graph.worker import ID, LET_DSA_IN, LET_DSA_IN_GATE, GraphCheckAdmitsDsa
from patchkit.layout import import_path

__all__ = [
    "DsaCapturesDraftExtendAtFixedWidth",
    "DsaDraftExtendGraphGate",
    "DsaDraftExtendReplayAtFixedWidth",
    "GraphCheckAdmitsDsa",
    "LET_DSA_IN",
    "LET_DSA_IN_GATE",
    "NsaCapturesDraftExtendAtFixedWidth",
    "NsaDraftExtendGraphGate",
    "NsaDraftExtendReplayAtFixedWidth",
]
_V2 = m.Call(func=attr("is_draft_extend_v2"))
_SHARED = m.Call(func=attr("is_draft_extend"), args=[m.Arg(keyword=m.Name("include_v2"), value=m.Name("True"))])
_WIDTH = attr("speculative_num_draft_tokens", m.Name("self"))
_WRITES = m.Call(func=attr("copy_")) | m.Call(func=m.MatchIfTrue(lambda f: "draft_extend_metadata" in code_of(f)))
_FUSED = m.Call(func=m.MatchIfTrue(lambda f: "draft_extend_metadata" in code_of(f)))  # 0.5.15+: clamps in-kernel
_EXPAND = m.Call(func=m.MatchIfTrue(lambda f: code_of(f).rpartition(".")[2].startswith("seqlens_expand")))
_ACCEPTED = attr("num_accept_tokens|num_correct_drafts|accept_length")
_TO_HOST = m.Call(func=attr("tolist|item|cpu|numpy"))
_COMPUTE = m.Call(func=m.MatchIfTrue(lambda f: code_of(f).rpartition(".")[2].endswith("_seqlens")))
_CLAMP = m.Call(func=attr("clamp|clamp_|clamp_min|clamp_min_|maximum"))


class NsaDraftExtendGraphGate(SpecV2Gate):
    DESCRIPTION = f"{NSA}: spec v2's draft extend runs here as dsa-no-mirror carries it (0.5.10+)"
    CLASS = NSA
    PREFIX = "builds on dsa-no-mirror, not applicable here: "


class DsaDraftExtendGraphGate(NsaDraftExtendGraphGate):
    DESCRIPTION = NsaDraftExtendGraphGate.DESCRIPTION.replace(NSA, DSA)
    CLASS = DSA


def _branches(fn: cst.FunctionDef, test: m.BaseMatcherNode) -> list[cst.If]:
    """The ``if``/``elif`` branches of ``fn`` whose test holds ``test`` and whose body writes metadata."""
    return [
        b
        for b in primitives.find_all_of(cst.If, fn, m.If())
        if primitives.contains(b.test, test) and primitives.contains(b.body, _WRITES)
    ]


class NsaCapturesDraftExtendAtFixedWidth(ShimAware, MethodCodemod):
    DESCRIPTION = (
        f"{NSA}: the draft-extend CUDA-graph capture holds bs * speculative_num_draft_tokens rows "
        "(checked, not changed)"
    )
    CLASS = NSA
    METHOD = "init_forward_metadata_capture_cuda_graph"
    RENAMED = ("_build_forward_metadata_cuda_graph",)  # 0.5.13+

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        rows = m.BinaryOperation(operator=m.Multiply(), left=_WIDTH) | m.BinaryOperation(
            operator=m.Multiply(), right=_WIDTH
        )
        for branch in primitives.find_all_of(cst.If, fn, m.If()):
            if primitives.contains(branch.test, _V2 | _SHARED) and primitives.contains(branch.body, rows):
                return Finding.superseded(self.anchor_of(fn), "captured at bs * speculative_num_draft_tokens rows")
        return self.missing_in(
            fn,
            "no draft-extend capture branch sized `bs * self.speculative_num_draft_tokens`",
            "the captured draft-extend metadata at that fixed width to replay it there",
        )


class DsaCapturesDraftExtendAtFixedWidth(NsaCapturesDraftExtendAtFixedWidth):
    DESCRIPTION = NsaCapturesDraftExtendAtFixedWidth.DESCRIPTION.replace(NSA, DSA)
    CLASS = DSA


# -- the replay -----------------------------------------------------------------------------------


def _host_read(body: cst.BaseSuite) -> Optional[cst.CSTNode]:
    """A read of the accepted counts, or a host read of a device value (a receiver
    that is not a ``*_cpu`` mirror), in ``body``."""
    for node in primitives.find_all(body, _ACCEPTED | _TO_HOST):
        if isinstance(node, cst.Call) and "cpu" in code_of(cst.ensure_type(node.func, cst.Attribute).value):
            continue
        return node
    return None


def _clamp_receiver(c: cst.Call) -> Optional[cst.BaseExpression]:
    """``X`` of ``X.clamp(min=0)``, ``X.clamp_(0)``, ``X.clamp_min(0)``, ``torch.clamp(X, min=0)`` (None: not one)."""
    func = code_of(c.func)
    if func.startswith("torch.") and c.args:
        receiver, rest = c.args[0].value, c.args[1:]
    elif isinstance(c.func, cst.Attribute):
        receiver, rest = c.func.value, c.args
    else:
        return None
    if any(code_of(a.value) == "0" and (a.keyword is None or a.keyword.value == "min") for a in rest):
        return receiver
    return None


def _unclamped(body: cst.BaseSuite) -> Optional[cst.Call]:
    """The expansion call of ``body`` whose result is not clamped at 0 (None: clamped, fused or none)."""
    if primitives.contains(body, _FUSED):
        return None
    receivers = [r for c in primitives.find_all_of(cst.Call, body, _CLAMP) if (r := _clamp_receiver(c)) is not None]
    clamped_names = {r.value for r in receivers if isinstance(r, cst.Name)}
    for call in primitives.find_all_of(cst.Call, body, _EXPAND):
        if any(r is call or primitives.contains(r, primitives.is_node(call)) for r in receivers):
            continue
        owner = _assigned_from(body, primitives.is_node(call))
        if owner is not None and owner in clamped_names:
            continue  # `x = expand(...)` then `x.clamp_(min=0)` (or `x = x.clamp(min=0)`)
        return call
    return None


def _assigned_from(body: cst.BaseSuite, value: NodeMatcher) -> Optional[str]:
    """The name ``body`` assigns a value holding ``value`` to (first one)."""
    for a in primitives.find_all_of(cst.Assign, body, m.Assign(targets=[m.AssignTarget(target=m.Name())])):
        if primitives.contains(a.value, value):
            return cst.ensure_type(a.targets[0].target, cst.Name).value
    return None


def _field_copied(body: cst.BaseSuite, local: str) -> Optional[str]:
    """``metadata.X`` of ``metadata.X[...].copy_(local)`` in ``body``."""
    for c in primitives.find_all_of(cst.Call, body, m.Call(func=attr("copy_"), args=[m.Arg(m.Name(local))])):
        target = cst.ensure_type(c.func, cst.Attribute).value
        while isinstance(target, cst.Subscript):
            target = target.value
        return code_of(target)
    return None


_BRANCH = """
if {mode}.is_draft_extend_v2():
    # patchkit {id} (sglang #29413, #30378): spec v2's
    # draft extend runs every request at the fixed width of the draft tokens,
    # as target verify does, so the replay reads no accepted counts from the
    # device and writes the captured shapes. Padded rows carry the graph's fill
    # length (1), below that width: their expanded lengths are clamped at 0
    # instead of going negative.
    max_seqlen_k = int(
        graph_max_len(seq_lens_cpu, 0, {table}, self.req_to_token)
    )
    cache_seqlens = seq_lens.to(torch.int32)
    {meta}.cache_seqlens_int32.copy_(cache_seqlens)
    {meta}.cu_seqlens_k[1:].copy_(
        torch.cumsum(cache_seqlens, dim=0, dtype=torch.int32)
    )
    {pages} = self.req_to_token[req_pool_indices, :max_seqlen_k]
    {pages} = torch.repeat_interleave(
        {pages}, repeats=self.speculative_num_draft_tokens, dim=0
    )
    {table}[:, :max_seqlen_k].copy_({pages})
    extend_seq_lens = torch.full(
        (bs,),
        self.speculative_num_draft_tokens,
        dtype=torch.int32,
        device=self.device,
    )
    {expanded} = {expand}(
        extend_seq_lens,
        cache_seqlens,
        bs * self.speculative_num_draft_tokens,
        self.speculative_num_draft_tokens,
    ).clamp_(min=0)
    {expanded_field}.copy_({expanded})
    {topk} = {compute}({expanded}, {topk_arg})
    {topk_field}.copy_({topk})
"""


class NsaDraftExtendReplayAtFixedWidth(ShimAware, MethodCodemod):
    DESCRIPTION = (
        f"{NSA}.init_forward_metadata_replay_cuda_graph: a DRAFT_EXTEND_V2 branch at the fixed width "
        "speculative_num_draft_tokens (no .tolist() of the accepted counts, no repeat by them; sglang #29413), "
        "expanded lengths of padded rows clamped at 0 (sglang #30378)"
    )
    CLASS = NSA
    METHOD = "init_forward_metadata_replay_cuda_graph"
    RENAMED = ("_apply_cuda_graph_metadata",)  # 0.5.13+
    PARAMS = ("bs", "req_pool_indices", "seq_lens", "seq_lens_cpu")
    # A fork's own DRAFT_EXTEND_V2 branch at the accepted counts (0.5.14's shape) gets the fixed-width body.
    REPLACES_VENDOR = (
        (
            r"num_accept_tokens|tolist|extend_seq_lens|repeat_interleave|shape|sum",
            "the fork's DRAFT_EXTEND_V2 replay at the accepted counts runs at the fixed width",
        ),
    )

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        anchor = self.anchor_of(fn)
        branch, own = self._branch(fn)
        if branch is None:
            return self.missing_in(
                fn,
                "no draft-extend replay branch (`elif forward_mode.is_draft_extend(include_v2=True):`)",
                "the replay of spec v2's draft extend to give it a fixed width",
            )
        read = _host_read(branch.body)
        if read is not None:  # the shared branch (0.5.10 .. 0.5.13) or a DRAFT_EXTEND_V2 one at the counts (0.5.14)
            return self._cannot(fn, branch) or Finding.todo(
                anchor, f"the draft-extend replay reads the accepted counts (`{code_of(read)}`)"
            )
        if _unclamped(branch.body) is not None:
            return Finding.todo(anchor, "padded rows' expanded lengths go negative (sglang #30378)")
        if own:  # ours, upstream's (0.5.15+), or a fork's of that shape
            return Finding.done(anchor)
        return self.vendors_own(anchor, "replays the draft extend at a fixed width", branch)

    @staticmethod
    def _branch(fn: cst.FunctionDef) -> tuple[Optional[cst.If], bool]:
        """The branch spec v2's draft extend replays through, and whether it is its own."""
        own = _branches(fn, _V2)
        if own:
            return own[0], True
        shared = _branches(fn, _SHARED)
        return (shared[0] if shared else None), False

    def _cannot(self, fn: cst.FunctionDef, branch: cst.If) -> Optional[Finding]:
        """Why the fixed-width branch cannot be written beside ``branch`` (None: it can)."""
        last = primitives.block_statements(branch.body)[-1]
        if m.matches(last, m.SimpleStatementLine(body=[m.Return() | m.Raise()])):
            return self.missing_in(
                fn,
                "the draft-extend replay branch returns before the method's shared tail",
                "it to fall through to that tail (cumulative lengths, real page table) beside a DRAFT_EXTEND_V2 branch",
                last,
            )
        params = {p.name.value for p in fn.params.params}
        lacking = [p for p in self.PARAMS if p not in params]
        if lacking:
            return self.missing_in(fn, f"the replay takes no `{lacking[0]}`", "the replay's own arguments")
        if None in self._names(branch).values():
            return self.missing_in(
                fn,
                "the draft-extend branch writes no `metadata.<field>.copy_(...)` of its expanded and top-k lengths",
                "those writes to give the fixed-width branch the same fields",
                branch,
            )
        return None

    def _names(self, branch: cst.If) -> dict[str, Optional[str]]:
        """What the fixed-width branch takes from the old one: locals, fields and calls."""
        body = branch.body
        expand = next(iter(primitives.find_all_of(cst.Call, body, _EXPAND)), None)
        # 0.5.7 .. 0.5.9, as pristine: the host expansion dsa-no-mirror makes backends.dsa's (applied first)
        host = next(iter(primitives.find_all_of(cst.Call, body, HOST_EXPANSION)), None)
        compute = next(iter(primitives.find_all_of(cst.Call, body, _COMPUTE)), None)
        made = expand if expand is not None else host
        expanded = _assigned_from(body, primitives.is_node(made)) if made is not None else None
        topk = _assigned_from(body, primitives.is_node(compute)) if compute is not None else None
        pages = _assigned_from(body, m.Subscript(value=attr("req_to_token", m.Name("self"))))
        table = _field_copied(body, pages) if pages else None
        test = primitives.find_all_of(cst.Call, branch.test, _V2 | _SHARED)[0]
        return {
            "mode": code_of(cst.ensure_type(test.func, cst.Attribute).value),
            "expand": code_of(expand.func) if expand is not None else EXPAND if host is not None else None,
            "compute": code_of(compute.func) if compute is not None else None,
            "topk_arg": code_of(compute.args[1].value) if compute is not None and len(compute.args) > 1 else None,
            "expanded": expanded,
            "topk": topk,
            "pages": pages,
            "table": table,
            "meta": table.partition(".")[0] if table else None,
            "expanded_field": _field_copied(body, expanded) if expanded else None,
            "topk_field": _field_copied(body, topk) if topk else None,
        }

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        branch, own = self._branch(fn)
        assert branch is not None  # detect found it
        if _host_read(branch.body) is None:  # only the clamp is missing
            call = cst.ensure_type(_unclamped(branch.body), cst.Call)
            return primitives.replace_node(fn, call, primitives.parse_expression(f"({code_of(call)}).clamp_(min=0)"))
        names = self._names(branch)
        new = cst.ensure_type(primitives.parse_statements_with_comments(_BRANCH.format(id=ID, **names))[0], cst.If)
        self.require_import(import_path("backends.dsa"), "graph_max_len")
        if names["expand"] == EXPAND:
            self.require_import(import_path("backends.dsa"), EXPAND)
        if own:  # its body at the counts becomes the fixed width
            return primitives.replace_node(fn, branch.body, new.body)
        orelse = branch.with_changes(leading_lines=())
        return primitives.replace_node(fn, branch, new.with_changes(leading_lines=branch.leading_lines, orelse=orelse))


class DsaDraftExtendReplayAtFixedWidth(NsaDraftExtendReplayAtFixedWidth):
    DESCRIPTION = NsaDraftExtendReplayAtFixedWidth.DESCRIPTION.replace(NSA, DSA)
    CLASS = DSA
