"""sglang #31364, the runners' half: CUDA-graph replay hands the attention
backend ``seq_lens_cpu=None``, not the pinned replay buffer, when the batch has
no CPU mirror.

The verify and draft-extend CUDA-graph runners keep a pinned ``seq_lens_cpu``
buffer, refresh it only when the batch brings a mirror, and handed it to the
backend every time: with needs-cpu-seq-lens skipping the mirror, that is a
tensor of an earlier batch's lengths. No backend of the first five patches
reads it at replay (Triton, TRT-LLM MLA); FA3 and TRT-LLM MHA size their page
tables from it, which is where upstream saw NaN logits. Upstream fixed it in
0.5.16 (``None if forward_batch.seq_lens_cpu is None else buffers.seq_lens_cpu[:bs]``).

Sites: ``CudaGraphRunner.replay_prepare`` (0.5.10 .. 0.5.12.post1) /
``build_replay_fb_view`` (0.5.13 ``model_executor/cuda_graph_runner.py``,
0.5.14 and 0.5.15 ``model_executor/runner/decode_cuda_graph_runner.py``) and
``EAGLEDraftExtendCudaGraphRunner.replay`` (every release). The multi-layer
EAGLE worker does not list its attention backends, so needs-cpu-seq-lens keeps
its mirror: its runner is left alone.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import Finding, PatchCodemod
from patchkit.codemods.common.primitives import attr, call
from patchkit.codemods.common.reads import EVERY, MODULE_HOOKS, Methods, Reads, reads_only
from patchkit.codemods.common.shared import MIRROR_READS, code_of, none_comparison

#: ``seq_lens_cpu=<buffers>.seq_lens_cpu`` or ``...seq_lens_cpu[:bs]``: the pinned replay
#: buffer, whatever holds it (``buffers``, ``self``, ``self.graph_buffers``), never the batch's own mirror.
BUFFER = m.Attribute(value=~m.Name("forward_batch"), attr=m.Name("seq_lens_cpu"))
PINNED = BUFFER | m.Subscript(value=BUFFER)
MIRROR_OF_BATCH = attr("seq_lens_cpu", m.Name("forward_batch"))
KWARG = m.Arg(keyword=m.Name("seq_lens_cpu"))
RAW_KWARG = m.Arg(keyword=m.Name("seq_lens_cpu"), value=PINNED)
OURS = call("mirror_or_none")
#: upstream (0.5.16+): `None if forward_batch.seq_lens_cpu is None else buffers.seq_lens_cpu[:bs]`
UPSTREAM = m.IfExp(test=none_comparison(MIRROR_OF_BATCH, m.Is()), body=m.Name("None"))
#: a fork's own: any conditional on the batch's mirror being None, either way round.
MIRROR_TESTED = m.IfExp(test=none_comparison(MIRROR_OF_BATCH, m.Is() | m.IsNot()))
FIXED_KWARG = m.Arg(keyword=m.Name("seq_lens_cpu"), value=OURS | UPSTREAM)
#: 0.5.6 .. 0.5.9: `seq_lens_cpu = buffers.populate_from_forward_batch(forward_batch=..., ...)`, the
#: tree's own helper (DecodeInputBuffers) that returns None when the batch has no mirror.
TREE_HELPER = m.Call(func=m.Attribute(attr=m.Name("populate_from_forward_batch")))


def _local_values(fn: cst.FunctionDef, name: str) -> list[cst.BaseExpression]:
    """The values local ``name`` is assigned in ``fn`` (plain assignments)."""
    return [
        a.value for a in primitives.find_all_of(cst.Assign, fn, m.Assign(targets=[m.AssignTarget(target=m.Name(name))]))
    ]


def _verdict(fn: cst.FunctionDef, value: cst.BaseExpression) -> str:
    """What ``seq_lens_cpu=<value>`` hands the backend at replay: "raw" (the
    pinned buffer, directly or through locals assigned only it), "ours",
    "upstream", "tree" (the fork tests the batch's mirror itself: a
    conditional, or a local also assigned None), or "" (something else: the
    batch's mirror, a capture's own tensor...)."""
    if m.matches(value, OURS):
        return "ours"
    if m.matches(value, UPSTREAM):
        return "upstream"
    if m.matches(value, MIRROR_TESTED) or m.matches(value, TREE_HELPER):
        return "tree"
    if m.matches(value, PINNED):
        return "raw"
    if isinstance(value, cst.Name):
        values = _local_values(fn, value.value)
        kinds = {_verdict(fn, v) if not isinstance(v, cst.Name) else "" for v in values}
        if values and kinds == {"raw"}:
            return "raw"
        if "raw" in kinds and (
            kinds & {"ours", "upstream", "tree"} or any(m.matches(v, m.Name("None")) for v in values)
        ):
            return "tree"
        if kinds & {"ours", "upstream", "tree"}:
            return "tree" if "tree" in kinds else kinds.pop()
    return ""


class ReplayPassesNoStaleMirror(PatchCodemod):
    """In every function of the file that takes a ``forward_batch``, the
    ``seq_lens_cpu=`` handed to the attention backend at replay is None when
    the batch brought no mirror (the pinned buffer then holds an earlier
    batch's lengths: #31364's NaN logits on FA3's topk > 1 verify).

    Found by meaning: the keyword's value is the pinned buffer (whatever
    holds it), directly or through a local assigned only that. A fork that
    already tests the batch's mirror there (a conditional, or a local set to
    None without it) made the change itself: done, with a note."""

    DESCRIPTION = "CUDA-graph replay hands the backend seq_lens_cpu=None, not the stale pinned buffer, when the batch has no CPU mirror"
    REQUIRED_TEXT = ("seq_lens_cpu",)

    @classmethod
    def reads(cls) -> Optional[Reads]:
        # The functions and methods that name the keyword.
        own = reads_only(cls, MODULE_HOOKS, PatchCodemod, ReplayPassesNoStaleMirror)
        return {EVERY: Methods(words=frozenset({"seq_lens_cpu"}))} if own else None

    @staticmethod
    def _functions(module: cst.Module) -> list[cst.FunctionDef]:
        """Top-level functions and methods of top-level classes with a
        ``forward_batch`` parameter."""
        found = []
        for stmt in module.body:
            candidates = (
                [stmt]
                if isinstance(stmt, cst.FunctionDef)
                else list(primitives.methods(stmt))
                if isinstance(stmt, cst.ClassDef)
                else []
            )
            found += [fn for fn in candidates if "forward_batch" in {p.name.value for p in fn.params.params}]
        return found

    def _sites(self, fn: cst.FunctionDef) -> list[tuple[cst.Arg, str]]:
        return [(arg, _verdict(fn, arg.value)) for arg in primitives.find_all_of(cst.Arg, fn, KWARG)]

    def detect(self, module: cst.Module) -> Finding:
        self.detect_module(module)
        anchor = "seq_lens_cpu= at CUDA-graph replay"
        sites = [site for fn in self._functions(module) for site in self._sites(fn)]
        raw = [arg for arg, kind in sites if kind == "raw"]
        if raw:
            return self.located(
                Finding.todo(anchor, f"{len(raw)} replay call(s) hand over the pinned buffer unconditionally"), raw[0]
            )
        tree = [arg for arg, kind in sites if kind == "tree"]
        if tree:
            return Finding.done(
                anchor,
                f"this tree already hands the backend None without the batch's mirror at {self.where(tree[0])}; patchkit leaves it as it is",
                by_tree=True,
            )
        if any(kind in ("ours", "upstream") for _, kind in sites):
            return Finding.done(anchor)
        return Finding.missing(anchor, "no replay call hands the backend a pinned seq_lens_cpu buffer")

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        def edit(fn: cst.FunctionDef) -> cst.FunctionDef:
            raw = {id(arg) for arg, kind in self._sites(fn) if kind == "raw"}

            def fix(arg: cst.Arg, _) -> cst.Arg:
                value = primitives.parse_expression(f"mirror_or_none(forward_batch.seq_lens_cpu, {code_of(arg.value)})")
                return arg.with_changes(value=value)

            return primitives.replace_expressions(fn, m.MatchIfTrue(lambda node: id(node) in raw), fix)

        for fn in self._functions(tree):
            if not any(kind == "raw" for _, kind in self._sites(fn)):
                continue
            owner = next(
                (c for c in tree.body if isinstance(c, cst.ClassDef) and any(x is fn for x in primitives.methods(c))),
                None,
            )
            if owner is None:
                tree = primitives.replace_function(tree, fn.name.value, edit)
            else:

                def edit_owner(c: cst.ClassDef, name: str = fn.name.value) -> cst.ClassDef:
                    return primitives.replace_method(c, name, edit)

                tree = primitives.replace_class(tree, owner.name.value, edit_owner)
        self.require_import(MIRROR_READS, "mirror_or_none")
        return tree
