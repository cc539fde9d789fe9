"""The spec-v2 worker's draft-extend CUDA-graph check, which TRT-LLM MHA
(trtllm-mha-draft-extend-v2), FA3 (fa3-draft-extend-graph) and DSA (dsa-draft-extend-graph) each add their
backend to: ``supports_cuda_draft_extend_graph`` from 0.5.10, inline in the
``if`` that captures the graph before (0.5.4 .. 0.5.9)."""

from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import Finding, MethodCodemod
from patchkit.codemods.common.shared import code_of

# -- the spec-v2 worker's draft-extend CUDA-graph check (TRT-LLM MHA, FA3) ---------------------

GRAPH_CHECK = "supports_cuda_draft_extend_graph"
#: Who a patch lets in: no FR-Spec token map (EAGLE3 ignores one; its d2t draft vocab is sized):
#: the draft-extend graph runner of these releases sizes its logits buffer for the full vocab.
NO_TOKEN_MAP = "(self.speculative_algorithm.is_eagle3() or self.hot_token_id is None)"
_DRAFT_EXTEND_RUNNER = m.Attribute(value=m.Name("self"), attr=m.Name("cuda_graph_runner_for_draft_extend"))
_SETS_DRAFT_EXTEND_RUNNER = m.Assign(targets=[m.AssignTarget(target=_DRAFT_EXTEND_RUNNER)])
_ISINSTANCE = m.Call(func=m.Name("isinstance"))


def graph_check(fn: cst.FunctionDef) -> Optional[cst.Assign]:
    """The assignment of the draft-extend graph check in ``fn``, if any."""
    found = primitives.find_all_of(cst.Assign, fn, primitives.assigns_name(GRAPH_CHECK))
    return found[0] if found else None


def capture_gate(fn: cst.FunctionDef) -> Optional[cst.If]:
    """0.5.4 .. 0.5.9 have no named check: the ``if`` that captures the
    draft-extend graph (its body sets ``self.cuda_graph_runner_for_draft_extend``)
    holds it inline in its test."""
    found = [
        g for g in primitives.find_all_of(cst.If, fn, m.If()) if primitives.contains(g.body, _SETS_DRAFT_EXTEND_RUNNER)
    ]
    return found[-1] if found else None  # the innermost


def the_gate(fn: cst.FunctionDef) -> m.If:
    """Matches ``capture_gate(fn)`` itself (for ``primitives.replace_statements``)."""
    gate = capture_gate(fn)
    assert gate is not None  # detect found it
    return m.If(test=primitives.is_node(gate.test))


def gate_disjunction(gate: cst.If) -> Optional[cst.BooleanOperation]:
    """The widest ``or`` of the gate's test that lists backends by isinstance
    (0.5.8.post1 / 0.5.9: ``_is_npu or (_is_cuda and isinstance(...)) or ...``)."""
    ors = primitives.find_all_of(cst.BooleanOperation, gate.test, m.BooleanOperation(operator=m.Or()))
    return next((o for o in ors if primitives.contains(o, _ISINSTANCE)), None)


def with_gate_term(gate: cst.If, term: str) -> cst.If:
    """``gate`` whose backend ``or`` gains ``or <term>`` as its last term, laid
    out as the vendor's last one (``term``: source; a parenthesised one may
    span lines, indented by four past the ``or``)."""
    ors = gate_disjunction(gate)
    assert ors is not None  # detect found it
    op = ors.operator
    indent = (
        op.whitespace_before.last_line.value if isinstance(op.whitespace_before, cst.ParenthesizedWhitespace) else ""
    )
    expr = cst.parse_expression(term.replace("\n", "\n" + indent))
    grown = cst.BooleanOperation(
        left=ors.with_changes(lpar=[], rpar=[]),
        operator=cst.Or(op.whitespace_before, op.whitespace_after),
        right=expr,
        lpar=ors.lpar,
        rpar=ors.rpar,
    )
    return gate.with_changes(test=gate.test.deep_replace(ors, grown))


def admit(fn: cst.FunctionDef, after_check: str, before_gate: str, flag: str) -> cst.FunctionDef:
    """``fn`` letting one more backend into the draft-extend graph: ``after_check`` (source)
    right after the graph check, or, where the release writes the check inline in the capture
    ``if`` (0.5.8.post1 / 0.5.9), ``before_gate`` before it and ``or <flag>`` in its gate."""
    check = graph_check(fn)
    if check is None:
        return primitives.replace_statements(
            fn,
            the_gate(fn),
            lambda gate: cst.FlattenSentinel(
                [*primitives.parse_statements_with_comments(before_gate), with_gate_term(gate, flag)]
            ),
        )
    return primitives.replace_statements(
        fn,
        primitives.line(primitives.is_node(check)),
        lambda stmt: cst.FlattenSentinel([stmt, *primitives.parse_statements_with_comments(after_check)]),
    )


class DraftExtendGraphCheck(MethodCodemod):
    """A change to ``EagleDraftWorker``'s draft-extend CUDA-graph check, in
    whichever method assigns it (0.5.17 renamed ``init_cuda_graphs`` to
    ``_capture_cuda_graphs``), or inline in the ``if`` that captures the
    graph (0.5.4 .. 0.5.9). Where that ``if`` shows that no CUDA backend's
    draft extend is replayed from a graph, the patch is moot (not applicable,
    with why): 0.5.4 captures one for every backend but never replays it,
    0.5.5 .. 0.5.7 capture it on NPU only."""

    CLASS = "EagleDraftWorker"
    METHOD = "init_cuda_graphs"
    REQUIRED_TEXT = (CLASS,)
    # find_method: the method assigning the check, or the gate's; _moot: every mention of the runner.
    METHODS_READ, WORDS_READ = (), (GRAPH_CHECK, "cuda_graph_runner_for_draft_extend")

    @property
    def anchor(self) -> str:
        return f"{self.CLASS}.{GRAPH_CHECK}"

    def anchor_of(self, fn: cst.FunctionDef) -> str:
        what = GRAPH_CHECK if graph_check(fn) is not None else "the draft-extend capture gate"
        return f"{self.CLASS}.{fn.name.value}: {what}"

    def find_method(self, cls: cst.ClassDef) -> Optional[cst.FunctionDef]:
        named = next((f for f in primitives.methods(cls) if graph_check(f) is not None), None)
        return named or next((f for f in primitives.methods(cls) if capture_gate(f) is not None), None)

    def line_node(self, fn: cst.FunctionDef) -> cst.CSTNode:
        return graph_check(fn) or capture_gate(fn) or fn  # what anchor_of names (find_method found one of the two)

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        fn = self.find_method(cls)
        if fn is not None and graph_check(fn) is None and (gate := capture_gate(fn)) is not None:
            why = self._moot(cls, gate)
            if why:
                return Finding.superseded(self.anchor_of(fn), why, moots_patch=True)
        return super().detect_in_class(cls)

    def _moot(self, cls: cst.ClassDef, gate: cst.If) -> str:
        """Why no backend can join a draft-extend CUDA graph here ("" if one can)."""
        reads = primitives.find_all(cls, _DRAFT_EXTEND_RUNNER)
        sets = primitives.find_all(cls, _SETS_DRAFT_EXTEND_RUNNER)
        if len(reads) == len(sets):  # every mention is an assignment
            return (
                f"{self.CLASS} never replays its draft-extend CUDA graph here (nothing reads "
                "self.cuda_graph_runner_for_draft_extend): the spec-v2 draft extend runs eagerly on every backend"
            )
        if primitives.contains(gate.test, m.Name("_is_npu")) and not primitives.contains(gate.test, _ISINSTANCE):
            return (
                f"the spec-v2 draft extend is captured on NPU only here (`if {code_of(gate.test)}:`): "
                "no CUDA draft-extend graph for a backend to join"
            )
        return ""

    def inline_todo(self, fn: cst.FunctionDef, todo: str) -> Finding:
        """An inline gate: ``todo``, or missing when it lists no backends in an ``or``."""
        gate = capture_gate(fn)
        assert gate is not None  # find_method found it
        if gate_disjunction(gate) is None:
            return self.missing_in(
                fn,
                f"the draft-extend capture gate `if {code_of(gate.test)}:` lists no backends "
                "in an `or` of isinstance checks",
                "one to add a backend to",
                gate,
            )
        return Finding.todo(self.anchor_of(fn), todo)

    def detect_absent(self, cls: cst.ClassDef) -> Finding:
        return Finding.missing(
            self.anchor,
            f"{self.where(cls)}: no method of {self.CLASS} assigns {GRAPH_CHECK} or captures the draft-extend graph",
        )


class AdmitsOnCudaWithoutTokenMap(DraftExtendGraphCheck):
    """A graph check that admits its backend (``ADMITTED``) on CUDA only and without an
    FR-Spec token map (``NO_TOKEN_MAP``): what it writes reads the module's ``_is_cuda``
    and the class's ``hot_token_id`` and ``speculative_algorithm`` (FA3, DSA)."""

    ADMITTED = ""  # the backend, as the refusal lines name it
    TOP_LEVEL_ONLY = True  # detect reads a module flag (a top-level assignment)
    METHODS_READ, WORDS_READ = (), ("hot_token_id", "speculative_algorithm")  # detect_in_class

    def detect(self, module: cst.Module) -> Finding:
        self._has_is_cuda = primitives.contains(module, primitives.assigns_name("_is_cuda"))
        return super().detect(module)

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        self._sets_hot_token_id = primitives.contains(cls, primitives.assigns_attr("hot_token_id"))
        self._sets_algorithm = primitives.contains(cls, primitives.assigns_attr("speculative_algorithm"))
        return super().detect_in_class(cls)

    def admission_missing(self, fn: cst.FunctionDef) -> Optional[Finding]:
        """Missing (with what to add) where the module or class lacks what the
        admission reads; None where it has all of it."""
        if not self._has_is_cuda:
            return self.missing_in(
                fn, "this module defines no `_is_cuda`", f"the module's CUDA flag to admit {self.ADMITTED} on CUDA only"
            )
        if not self._sets_hot_token_id:
            return self.missing_in(
                fn, f"{self.CLASS} never sets self.hot_token_id", "it to keep speculative token maps eager"
            )
        if not self._sets_algorithm:
            return self.missing_in(
                fn, f"{self.CLASS} never sets self.speculative_algorithm", "it to tell EAGLE3 drafts from token maps"
            )
        return None
