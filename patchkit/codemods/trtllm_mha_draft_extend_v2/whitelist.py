"""Where ``WhitelistTRTLLMHA`` adds TRT-LLM MHA in ``EagleDraftWorker``'s draft-extend
CUDA-graph whitelist: the names it adds, the ``or`` of isinstance checks that holds
the backends (in the whitelist or a fork's local), whether a vendor checks a class
of its own there, and the one-more-term edit used then.

Kept apart from the package's ``__init__`` (the codemods, which the patch
definition names) so that module stays under the house's 400 lines.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.draft_extend_gate import GRAPH_CHECK, graph_check
from patchkit.codemods.common.shared import code_of

MHA_BACKEND = "TRTLLMHAAttnBackend"
MHA_MODULE = "sglang.srt.layers.attention.trtllm_mha_backend"
WHITELIST = GRAPH_CHECK
SUBJECT = "self.draft_extend_attn_backend"

#: 0.5.8.post1 / 0.5.9's inline gate: a term like the vendor's own (CUDA, then the class), on the
#: draft-extend backend the graph runs (as from 0.5.10).
GATE_TERM = f"(\n    _is_cuda\n    and isinstance({SUBJECT}, {MHA_BACKEND})\n)"


def whitelist_site(fn: cst.FunctionDef) -> Optional[tuple[cst.Assign, cst.BaseExpression]]:
    """(assignment, disjunction): the ``or`` holding the isinstance checks of
    the draft-extend backend, in the whitelist assignment or, where a fork
    computes it beforehand into a local, in the first assignment that has it."""
    whitelist = graph_check(fn)
    for assign in [whitelist, *primitives.find_all_of(cst.Assign, fn, m.Assign())]:
        found = primitives.find_isinstance_disjunction(assign.value, SUBJECT) if assign is not None else None
        if assign is not None and found is not None:
            return assign, found
    return None


#: The classes the releases' chain checks (0.5.10 .. 0.5.12.post1): merged into one tuple with MHA's.
RELEASE_CLASSES = frozenset({"TritonAttnBackend", "TRTLLMMLABackend"})
MHA_TERM = f"isinstance({SUBJECT}, {MHA_BACKEND})"
_ISINSTANCE = m.Call(func=m.Name("isinstance"))


def vendor_checks(disjunction: cst.BaseExpression) -> bool:
    """A chain of isinstance checks of the backend in which a vendor checks a
    class of its own in a term of its own (``... or isinstance(b,
    AcmeMLABackend)``): merging the chain into one tuple would rewrite the
    vendor's term, so MHA gets a term of its own instead."""
    checks = [t for t in primitives.or_terms(disjunction) if primitives.isinstance_subject(t) == SUBJECT]
    classes = set()
    for check in checks:
        kinds = primitives.find_all_of(cst.Call, check, _ISINSTANCE)[0].args[1].value
        classes |= {code_of(e.value) for e in kinds.elements} if isinstance(kinds, cst.Tuple) else {code_of(kinds)}
    return len(checks) > 1 and not classes <= RELEASE_CLASSES


def with_or_term(disjunction: cst.BooleanOperation, term: str) -> cst.BooleanOperation:
    """``disjunction or <term>``, laid out as its last ``or``."""
    op = disjunction.operator
    return cst.BooleanOperation(
        left=disjunction.with_changes(lpar=[], rpar=[]),
        operator=cst.Or(op.whitespace_before, op.whitespace_after),
        right=cst.parse_expression(term),
        lpar=disjunction.lpar,
        rpar=disjunction.rpar,
    )


def mentions(node: cst.CSTNode, name: str) -> bool:
    return primitives.contains(node, m.Name(name))


# `from ... import TRTLLMHAAttnBackend` inside the method (a fork's lazy import).
LOCAL_IMPORT = m.ImportFrom(names=[m.ZeroOrMore(), m.ImportAlias(name=m.Name(MHA_BACKEND)), m.ZeroOrMore()])
