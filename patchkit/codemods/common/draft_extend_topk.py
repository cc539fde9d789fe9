"""The spec-v2 draft-extend CUDA-graph runner without top-k for DRAFT_EXTEND_V2.

``EAGLEDraftExtendCudaGraphRunner`` serves V1 (``DRAFT_EXTEND``: its worker
reads ``topk_p`` / ``topk_index`` from the replayed output) and V2
(``DRAFT_EXTEND_V2``: ``EagleDraftWorker`` selects one row per request from
the logits and computes top-k on those rows itself). Two edits take the
top-k out of V2 only, both as ``if self.forward_mode != ForwardMode.DRAFT_EXTEND_V2:``:

* replay (``replay``, 0.5.17 ``execute``): the top-k slices copied into the
  unpadded output (sglang #25002's replay side, trtllm-mha-draft-extend-v2);
* capture (``capture_one_batch_size``, 0.5.14 ``capture_one_shape``): the
  softmax + top-k that ``run_once`` computes into the graph (sglang #31430,
  draft-extend-graph-no-topk). Without the replay edit a V2 replay would read
  output fields the graph no longer sets.

Both patches use these pieces; a site found guarded (by either patch, or by
upstream) is done.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import Finding, MethodCodemod

RUNNER = "EAGLEDraftExtendCudaGraphRunner"
REPLAY_METHODS = ("replay", "execute")  # execute: 0.5.14+
CAPTURE_METHODS = ("capture_one_batch_size", "capture_one_shape")  # capture_one_shape: 0.5.14+
FORWARD_MODE_MODULE = "sglang.srt.model_executor.forward_batch_info"
TOPK_FIELDS = ("topk_p", "topk_index")
V2_GUARD = "self.forward_mode != ForwardMode.DRAFT_EXTEND_V2"

_TOPK_ATTR = m.Attribute(attr=m.Name(TOPK_FIELDS[0]) | m.Name(TOPK_FIELDS[1]))
#: ``out.topk_p = ...`` alone on its line (the replay's copies).
TOPK_COPY = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=_TOPK_ATTR)])])
#: Any assignment to a top-k field, tuple targets included (``ret.topk_p, ret.topk_index = ...``).
TOPK_ASSIGN = m.Assign(
    targets=[
        m.ZeroOrMore(),
        m.AssignTarget(target=m.MatchIfTrue(lambda t: primitives.contains(t, _TOPK_ATTR))),
        m.ZeroOrMore(),
    ]
)
V2_TEST = m.If(
    test=m.MatchIfTrue(
        lambda t: (
            primitives.contains(t, m.Name("DRAFT_EXTEND_V2") | m.Attribute(attr=m.Name("DRAFT_EXTEND_V2")))
            or primitives.contains(t, m.Attribute(attr=m.Name("is_draft_extend_v2")))
        )
    )
)


_NAMES_V2 = m.Name("DRAFT_EXTEND_V2") | m.Attribute(attr=m.Name("DRAFT_EXTEND_V2") | m.Name("is_draft_extend_v2"))
#: Why a runner that never names V2 needs nothing (0.5.4.post3: every batch it builds is DRAFT_EXTEND).
V1_ONLY = f"{RUNNER} captures DRAFT_EXTEND (V1) graphs only here, never DRAFT_EXTEND_V2: no V2 top-k to take out"


_MODE_ARG = m.Arg(keyword=m.Name("forward_mode"))
#: The words a method needs for ``captures_v1_only`` to look at it (``reads.Methods``).
V1_ONLY_WORDS = ("forward_mode", "DRAFT_EXTEND_V2", "is_draft_extend_v2")
_V1_MODE = m.Attribute(value=m.Name("ForwardMode"), attr=m.Name("DRAFT_EXTEND"))


def captures_v1_only(cls: cst.ClassDef) -> bool:
    """The runner has no V2 graph: every batch it builds says
    ``forward_mode=ForwardMode.DRAFT_EXTEND`` and it never names DRAFT_EXTEND_V2."""
    modes = [arg.value for arg in primitives.find_all_of(cst.Arg, cls, _MODE_ARG)]
    return bool(modes) and all(m.matches(v, _V1_MODE) for v in modes) and not primitives.contains(cls, _NAMES_V2)


def is_negative(test: cst.BaseExpression) -> bool:
    """``x != ...DRAFT_EXTEND_V2`` or ``not x.is_draft_extend_v2()``."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return True
    return isinstance(test, cst.Comparison) and any(isinstance(c.operator, cst.NotEqual) for c in test.comparisons)


def confined_blocks(fn: cst.CSTNode) -> set[int]:
    """ids of the blocks a V2 test confines to other modes (the body of
    ``if mode != V2:``, the ``else`` of ``if mode == V2:``)."""
    found = set()
    for g in primitives.find_all_of(cst.If, fn, V2_TEST):
        found.add(id(g.body) if is_negative(g.test) else id(getattr(g.orelse, "body", None)))
    return found - {id(None)}


def unguarded(fn: cst.CSTNode, matcher: m.BaseMatcherNode) -> list[cst.CSTNode]:
    """The ``matcher`` hits of ``fn`` outside any block confined to non-V2 modes."""
    confined = confined_blocks(fn)
    inside = {
        id(hit)
        for block in primitives.find_all(fn, m.IndentedBlock())
        if id(block) in confined
        for hit in primitives.find_all(block, matcher)
    }
    return [hit for hit in primitives.find_all(fn, matcher) if id(hit) not in inside]


def guard_for_v1(stmts: Sequence[primitives.Statement], why: str = "") -> cst.If:
    """``stmts`` under ``if self.forward_mode != ForwardMode.DRAFT_EXTEND_V2:``
    (``primitives.guard_statements``; ``why``: the comment above it)."""
    return primitives.guard_statements(stmts, V2_GUARD, why)


# -- replay: the top-k copies into the unpadded output -------------------------------------


def copy_run(block: cst.IndentedBlock) -> Optional[tuple[int, int]]:
    """[first, last] indices of the top-k copies in ``block``'s body, when they
    are one run (else moving them under one guard would move code between)."""
    hits = [i for i, s in enumerate(block.body) if m.matches(s, TOPK_COPY)]
    if hits and hits == list(range(hits[0], hits[-1] + 1)):
        return hits[0], hits[-1]
    return None


def copy_block(fn: cst.FunctionDef) -> Optional[cst.IndentedBlock]:
    """The block holding the top-k copies as one uninterrupted run of its
    statements: the body of ``if unpadding_bs is not None:`` in these trees,
    the method body or another block in a fork's."""
    confined = confined_blocks(fn)
    return next(
        (
            b
            for b in primitives.find_all_of(cst.IndentedBlock, fn, m.IndentedBlock())
            if id(b) not in confined and copy_run(b)
        ),
        None,
    )


def guard_copies(fn: cst.FunctionDef) -> cst.FunctionDef:
    block = copy_block(fn)
    run = None if block is None else copy_run(block)
    assert block is not None and run is not None  # detect found the run
    first, last = run
    return primitives.replace_block_statements(fn, block, first, last + 1, guard_for_v1)


class ReplaySkipsTopkForV2(MethodCodemod):
    """Replay copies top-k slices into the output only for modes other than V2."""

    CLASS = RUNNER
    METHOD = REPLAY_METHODS[0]
    RENAMED = REPLAY_METHODS[1:]
    METHODS_READ, WORDS_READ = (), V1_ONLY_WORDS

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        if captures_v1_only(cls):
            return Finding.superseded(self.anchor, V1_ONLY)
        return super().detect_in_class(cls)

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        anchor = self.anchor_of(fn)
        copies = unguarded(fn, TOPK_COPY)
        if not copies:
            return Finding.done(anchor)
        if copy_block(fn) is None:
            return self.missing_in(
                fn,
                "the top-k copies into the output are not one run of statements in one block",
                "them as one run, to guard it for non-V2 modes",
                copies[0],
            )
        return Finding.todo(anchor, "copies top-k slices into the DRAFT_EXTEND_V2 output")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        self.require_import(FORWARD_MODE_MODULE, "ForwardMode")
        return guard_copies(fn)


# -- capture: the softmax + top-k computed into the graph ------------------------------------


def _assigned_names(stmt: cst.SimpleStatementLine) -> Optional[set[str]]:
    """Names a line of plain assignments binds, when every target is a name."""
    names: set[str] = set()
    for small in stmt.body:
        if not isinstance(small, cst.Assign) or not all(isinstance(t.target, cst.Name) for t in small.targets):
            return None
        names.update(t.target.value for t in small.targets if isinstance(t.target, cst.Name))
    return names


def _computes_topk_only(stmt: cst.CSTNode) -> bool:
    """A statement that only computes top-k: assignments to top-k fields or to
    local names (``probs = torch.softmax(...)``), or an ``if`` (the 0.5.13
    ``topk == 1`` argmax fast path) whose every branch only does that."""
    if isinstance(stmt, cst.SimpleStatementLine):
        return all(
            isinstance(s, cst.Assign)
            and all(isinstance(t.target, cst.Name) or primitives.contains(t.target, _TOPK_ATTR) for t in s.targets)
            for s in stmt.body
        )
    if isinstance(stmt, cst.If):
        branches = [stmt.body.body]
        orelse = stmt.orelse
        while orelse is not None:
            if isinstance(orelse, cst.If):
                branches.append(orelse.body.body)
                orelse = orelse.orelse
            else:
                branches.append(orelse.body.body)
                orelse = None
        return all(_computes_topk_only(s) for branch in branches for s in branch)
    return False


def topk_run(block: cst.IndentedBlock, wanted: int) -> Optional[tuple[int, int]]:
    """[first, last] of the statements of ``block`` that compute top-k, when
    they are one run holding all ``wanted`` top-k assignments and only
    compute top-k; the locals they bind right before (``probs``) included
    when nothing after the run reads them."""
    body = primitives.block_statements(block)
    hits = [i for i, s in enumerate(body) if primitives.find_all(s, TOPK_ASSIGN)]
    if not hits or sum(len(primitives.find_all(body[i], TOPK_ASSIGN)) for i in hits) != wanted:
        return None
    first, last = hits[0], hits[-1]

    def reads(stmts, names) -> bool:
        return any(primitives.contains(s, m.Name(n)) for s in stmts for n in names)

    # Locals bound right before, read by the run and not after it (``probs``;
    # not ``ret``, the forward's output the function returns).
    while first > 0 and isinstance(previous := body[first - 1], cst.SimpleStatementLine):
        names = _assigned_names(previous)
        if not names or not reads(body[first : last + 1], names) or reads(body[last + 1 :], names):
            break
        first -= 1
    if not all(_computes_topk_only(s) for s in body[first : last + 1]):
        return None
    bound = {
        n for s in body[first : last + 1] if isinstance(s, cst.SimpleStatementLine) for n in (_assigned_names(s) or ())
    }
    if reads(body[last + 1 :], bound):
        return None  # a local of the run is read later: guarding it would leave that read unbound for V2
    return first, last


def topk_block(fn: cst.FunctionDef) -> Optional[tuple[cst.IndentedBlock, int, int]]:
    """The block (``run_once``'s body in these trees) whose run of statements
    computes every unguarded top-k of ``fn``, and that run."""
    wanted = len(unguarded(fn, TOPK_ASSIGN))
    confined = confined_blocks(fn)
    for block in primitives.find_all_of(cst.IndentedBlock, fn, m.IndentedBlock()):
        if id(block) not in confined and (run := topk_run(block, wanted)):
            return block, run[0], run[1]
    return None


def guard_topk(fn: cst.FunctionDef, why: str) -> cst.FunctionDef:
    found = topk_block(fn)
    assert found is not None  # detect found the run
    block, first, last = found
    return primitives.replace_block_statements(fn, block, first, last + 1, lambda run: guard_for_v1(run, why))
