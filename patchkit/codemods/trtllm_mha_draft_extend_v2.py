"""sglang #25002: TRT-LLM MHA draft-extend CUDA graph with v2 semantics.

Four structural changes, one codemod each (plus one for the test kit):

* ``speculative/eagle_worker_v2.py`` (``EagleDraftWorker``): the draft-extend
  CUDA-graph whitelist ``supports_cuda_draft_extend_graph`` accepts
  ``TRTLLMHAAttnBackend``. The chained ``isinstance(b, A) or isinstance(b, B)``
  of 0.5.10 - 0.5.12.post1 becomes one ``isinstance(b, (A, B, ...))`` tuple (as
  upstream review asked), and the class is imported beside the other backends.
* ``layers/attention/trtllm_mha_backend.py`` (``TRTLLMHAAttnBackend``): the
  CUDA-graph capture and replay metadata branches match V1 and V2
  (``is_draft_extend(include_v2=True)``); replay fills V2 with a fixed stride
  through ``patchkit.backends.trtllm_mha.fill_draft_extend_v2_cu_seqlens_q``
  and keeps V1's variable-length cumsum path unchanged, in the ``else``.
* ``speculative/eagle_draft_extend_cuda_graph_runner.py``: replay copies the
  top-k slices into the unpadded output only for modes other than
  DRAFT_EXTEND_V2 (the V2 worker recomputes top-k on the rows it selects).
* ``test/kits/attention_unittest/runner_modes/speculative_draft_extend_runner.py``
  (only where a tree ships it): ``_assert_draft_extend_v2_outputs_close``
  compares logits and hidden states only, and the V2 runner cases use it.

Upstream's own shapes count as done: 0.5.13 renamed the MHA methods
(``_build_cuda_graph_metadata`` / ``_apply_cuda_graph_metadata``) and has the
change; 0.5.17 made the whitelist a list, gave V2 its own ``elif
is_draft_extend_v2()`` branches and dropped top-k from the runner output
(``execute``).
"""

from __future__ import annotations

from typing import Optional, Sequence

import libcst as cst
import libcst.matchers as m

from patchkit.codemods import primitives
from patchkit.codemods.base import ClassCodemod, Finding, PatchCodemod
from patchkit.vendoring import import_path

_code = cst.Module(body=[]).code_for_node

# --- eagle_worker_v2.py: the whitelist ------------------------------------------------

MHA_BACKEND = "TRTLLMHAAttnBackend"
MHA_MODULE = "sglang.srt.layers.attention.trtllm_mha_backend"
WHITELIST = "supports_cuda_draft_extend_graph"
SUBJECT = "self.draft_extend_attn_backend"


def _whitelist_assign(fn: cst.FunctionDef) -> Optional[cst.Assign]:
    found = primitives.find_all(fn, m.Assign(targets=[m.AssignTarget(target=m.Name(WHITELIST))]))
    return found[0] if found else None


def _isinstance_check(expr: cst.BaseExpression) -> Optional[cst.BaseExpression]:
    """The isinstance check (or or-chain of them) on the draft-extend backend
    inside the whitelist expression: the expression itself or an operand of
    its ``and`` chain."""
    names = primitives.isinstance_class_names(expr)
    if names is not None and names[0] == SUBJECT:
        return expr
    if isinstance(expr, cst.BooleanOperation) and isinstance(expr.operator, cst.And):
        return _isinstance_check(expr.right) or _isinstance_check(expr.left)
    return None


def _swap(expr: cst.BaseExpression, old: cst.BaseExpression, new: cst.BaseExpression) -> cst.BaseExpression:
    """``expr`` with ``old`` (itself or an operand of its ``and`` chain) replaced."""
    if expr is old:
        return new
    if isinstance(expr, cst.BooleanOperation) and isinstance(expr.operator, cst.And):
        return expr.with_changes(left=_swap(expr.left, old, new), right=_swap(expr.right, old, new))
    return expr


def _mentions(node: cst.CSTNode, name: str) -> bool:
    return primitives.contains(node, m.Name(name))


# `from ... import TRTLLMHAAttnBackend` inside the method (a fork's lazy import).
_LOCAL_IMPORT = m.ImportFrom(names=[m.ZeroOrMore(), m.ImportAlias(name=m.Name(MHA_BACKEND)), m.ZeroOrMore()])


class WhitelistTRTLLMHA(PatchCodemod):
    DESCRIPTION = (
        f"EagleDraftWorker: the draft-extend CUDA-graph whitelist ({WHITELIST}) accepts {MHA_BACKEND}, "
        "written as one isinstance(backend, (...)) tuple; import it beside the other backends"
    )
    CLASS = "EagleDraftWorker"
    REQUIRED_TEXT = (CLASS, WHITELIST)

    def _method(self, cls: cst.ClassDef) -> Optional[cst.FunctionDef]:
        # 0.5.10 - 0.5.13: init_cuda_graphs; 0.5.17+: _capture_cuda_graphs.
        return next((f for f in primitives.methods(cls) if _whitelist_assign(f) is not None), None)

    def detect(self, module: cst.Module) -> Finding:
        cls = primitives.find_class(module, self.CLASS)
        if cls is None:
            return Finding.missing(self.CLASS, f"class {self.CLASS} not found")
        fn = self._method(cls)
        if fn is None:
            return Finding.missing(f"{self.CLASS}.{WHITELIST}", f"no method assigns {WHITELIST}")
        anchor = f"{self.CLASS}.{fn.name.value}: {WHITELIST}"
        imported = primitives.imports_name(module, MHA_MODULE, MHA_BACKEND) or primitives.contains(fn, _LOCAL_IMPORT)
        if _mentions(fn, MHA_BACKEND):
            # Ours and 0.5.13's tuple; 0.5.17's list of supported backend types.
            if imported:
                return Finding.done(anchor)
            return Finding.todo(anchor, f"{MHA_BACKEND} is whitelisted but not imported")
        if _isinstance_check(_whitelist_assign(fn).value) is None:
            return Finding.missing(anchor, f"not an isinstance check on {SUBJECT}")
        return Finding.todo(anchor, f"{MHA_BACKEND} is not whitelisted")

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        def edit_method(fn: cst.FunctionDef) -> cst.FunctionDef:
            if _mentions(fn, MHA_BACKEND):
                return fn
            assign = _whitelist_assign(fn)
            check = _isinstance_check(assign.value)
            new_check = primitives.isinstance_tuple(check, add=[MHA_BACKEND], after="TRTLLMMLABackend")
            new_value = _swap(assign.value, check, new_check)
            return primitives.replace_statements(
                fn,
                m.SimpleStatementLine(body=[m.MatchIfTrue(lambda small: small is assign)]),
                lambda line: line.with_changes(body=[line.body[0].with_changes(value=new_value)]),
            )

        def edit_class(cls: cst.ClassDef) -> cst.ClassDef:
            return primitives.replace_method(cls, self._method(cls).name.value, edit_method)

        tree = primitives.replace_class(tree, self.CLASS, edit_class)
        cls = primitives.find_class(tree, self.CLASS)
        fn = self._method(cls)
        if not primitives.contains(fn, _LOCAL_IMPORT):
            tree = primitives.add_import_sorted(tree, MHA_MODULE, MHA_BACKEND)
        return tree


# --- trtllm_mha_backend.py: capture and replay metadata ------------------------------

CAPTURE_METHODS = ("init_forward_metadata_capture_cuda_graph", "_build_cuda_graph_metadata")
REPLAY_METHODS = ("init_forward_metadata_replay_cuda_graph", "_apply_cuda_graph_metadata")
HELPER_MODULE = import_path("backends.trtllm_mha")
HELPER = "fill_draft_extend_v2_cu_seqlens_q"

_IS_DRAFT_EXTEND = m.Call(func=m.Attribute(attr=m.Name("is_draft_extend")))
_IS_DRAFT_EXTEND_V1_ONLY = m.Call(func=m.Attribute(attr=m.Name("is_draft_extend")), args=[])
_INCLUDE_V2 = m.Arg(keyword=m.Name("include_v2"), value=m.Name("True"))
_IS_DRAFT_EXTEND_ANY = m.Call(
    func=m.Attribute(attr=m.Name("is_draft_extend")), args=[m.ZeroOrMore(), _INCLUDE_V2, m.ZeroOrMore()]
)
_IS_DRAFT_EXTEND_V2 = m.Call(func=m.Attribute(attr=m.Name("is_draft_extend_v2")), args=[])


def _branches(fn: cst.FunctionDef, test: m.BaseMatcherNode) -> list[cst.If]:
    return list(primitives.find_all(fn, m.If(test=test)))


def _draft_extend_method(cls: cst.ClassDef, names: Sequence[str]) -> Optional[cst.FunctionDef]:
    """The first of ``names`` that has a draft-extend branch (a fork may keep
    the old name as a thin wrapper around the new one)."""
    found = [f for f in (primitives.find_method(cls, n) for n in names) if f is not None]
    for fn in found:
        if _branches(fn, _IS_DRAFT_EXTEND | _IS_DRAFT_EXTEND_V2):
            return fn
    return found[0] if found else None


def _with_include_v2(if_: cst.If) -> cst.If:
    call = if_.test
    arg = cst.Arg(
        keyword=cst.Name("include_v2"),
        value=cst.Name("True"),
        equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
    )
    return if_.with_changes(test=call.with_changes(args=[arg]))


class CaptureIncludesDraftExtendV2(ClassCodemod):
    DESCRIPTION = (
        "TRTLLMHAAttnBackend CUDA-graph capture metadata: the draft-extend branch matches V1 and V2 "
        "(is_draft_extend(include_v2=True))"
    )
    CLASS = "TRTLLMHAAttnBackend"

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        fn = _draft_extend_method(cls, CAPTURE_METHODS)
        if fn is None:
            return Finding.missing(f"{self.CLASS}.{CAPTURE_METHODS[0]}", f"none of {', '.join(CAPTURE_METHODS)} is defined")
        anchor = f"{self.CLASS}.{fn.name.value}"
        if _branches(fn, _IS_DRAFT_EXTEND_ANY | _IS_DRAFT_EXTEND_V2):
            return Finding.done(anchor)
        if _branches(fn, _IS_DRAFT_EXTEND_V1_ONLY):
            return Finding.todo(anchor, "draft-extend branch matches V1 only")
        return Finding.missing(anchor, "no `if forward_mode.is_draft_extend()` branch")

    def transform_class(self, cls: cst.ClassDef) -> cst.ClassDef:
        fn = _draft_extend_method(cls, CAPTURE_METHODS)
        return primitives.replace_method(
            cls,
            fn.name.value,
            lambda f: primitives.replace_statements(f, m.If(test=_IS_DRAFT_EXTEND_V1_ONLY), _with_include_v2),
        )


# The per-request accepted-token counts V1 reads, by release: 0.5.10 -
# 0.5.10.post1 `accept_length`, 0.5.11 `num_accepted_tokens`, 0.5.12+
# `num_accept_tokens` (each with a `_cpu` host list).
ACCEPT_FIELDS = ("num_accept_tokens", "num_accepted_tokens", "accept_length")
_V1_QUERY_ATTRS = {*ACCEPT_FIELDS, *(f"{f}_cpu" for f in ACCEPT_FIELDS), "max_seq_len_q", "cu_seqlens_q"}


def _touches_v1_query_lens(stmt: cst.BaseStatement) -> bool:
    """A statement of V1's variable-length query path: it reads the accepted
    counts (or their CPU mirror) or writes ``max_seq_len_q`` / ``cu_seqlens_q``."""
    return primitives.contains(stmt, m.Attribute(attr=m.Name(value=m.MatchIfTrue(lambda v: v in _V1_QUERY_ATTRS))))


def _v1_run(branch: cst.If) -> Optional[tuple[int, int]]:
    """[first, last] indices of the V1 query-length statements in the branch
    body, when they are one uninterrupted run (anything else between them
    would silently change V2 if moved into the V1 ``else``)."""
    body = list(branch.body.body)
    hits = [i for i, s in enumerate(body) if _touches_v1_query_lens(s)]
    if not hits or hits != list(range(hits[0], hits[-1] + 1)):
        return None
    if not any(primitives.contains(body[i], m.Attribute(attr=m.Name("cu_seqlens_q"))) for i in hits):
        return None
    return hits[0], hits[-1]


def _draft_extend_branch(fn: cst.FunctionDef) -> Optional[cst.If]:
    found = _branches(fn, _IS_DRAFT_EXTEND)
    return found[0] if found else None


def _has_v2_split(branch: cst.If) -> bool:
    return bool(primitives.find_all(branch.body, m.If(test=_IS_DRAFT_EXTEND_V2))) or primitives.contains(
        branch.body, m.Call(func=m.Name(HELPER))
    )


class ReplayDraftExtendV2Stride(ClassCodemod):
    DESCRIPTION = (
        "TRTLLMHAAttnBackend CUDA-graph replay metadata: the draft-extend branch matches V1 and V2; "
        "DRAFT_EXTEND_V2 uses spec_info.num_tokens_per_req as a fixed stride for cu_seqlens_q / "
        f"max_seq_len_q ({HELPER_MODULE}.{HELPER}); V1 keeps its cumsum path"
    )
    CLASS = "TRTLLMHAAttnBackend"

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        fn = _draft_extend_method(cls, REPLAY_METHODS)
        if fn is None:
            return Finding.missing(f"{self.CLASS}.{REPLAY_METHODS[0]}", f"none of {', '.join(REPLAY_METHODS)} is defined")
        anchor = f"{self.CLASS}.{fn.name.value}"
        v1_only = _branches(fn, _IS_DRAFT_EXTEND_V1_ONLY)
        both = _branches(fn, _IS_DRAFT_EXTEND_ANY)
        if not v1_only and not both:
            if _branches(fn, _IS_DRAFT_EXTEND_V2):
                return Finding.done(anchor, "V2 has its own branch (upstream 0.5.17+ shape)")
            return Finding.missing(anchor, "no `if forward_mode.is_draft_extend()` branch")
        branch = (v1_only + both)[0]
        if not v1_only and _has_v2_split(branch):
            if primitives.contains(branch.body, m.Call(func=m.Name(HELPER))) and not self._helper_imported:
                return Finding.todo(anchor, f"{HELPER} is called but not imported")
            return Finding.done(anchor)
        if not _has_v2_split(branch):
            params = {p.name.value for p in fn.params.params}
            if not {"bs", "spec_info"} <= params:
                return Finding.missing(anchor, "expected parameters `bs` and `spec_info`")
            if _v1_run(branch) is None:
                return Finding.missing(
                    anchor, "draft-extend branch: no single run of statements filling cu_seqlens_q from num_accept_tokens"
                )
        return Finding.todo(anchor, "draft-extend replay has no DRAFT_EXTEND_V2 fixed-stride path")

    def detect(self, module: cst.Module) -> Finding:
        self._helper_imported = primitives.imports_name(module, HELPER_MODULE, HELPER)
        return super().detect(module)

    def transform_class(self, cls: cst.ClassDef) -> cst.ClassDef:
        fn = _draft_extend_method(cls, REPLAY_METHODS)

        def edit_branch(if_: cst.If) -> cst.If:
            if not _has_v2_split(if_):
                first, last = _v1_run(if_)
                body = list(if_.body.body)
                run = body[first : last + 1]
                receiver = _code(if_.test.func.value)
                metadata = next(
                    _code(a.value) for a in primitives.find_all(cst.IndentedBlock(body=run), m.Attribute(attr=m.Name("cu_seqlens_q")))
                )
                body[first : last + 1] = [
                    primitives.branch_statements(
                        run,
                        f"{receiver}.is_draft_extend_v2()",
                        f"""
                        # DRAFT_EXTEND_V2: every request has spec_info.num_tokens_per_req
                        # query tokens (a fixed stride); filled in place, no host sync.
                        {HELPER}({metadata}, spec_info, bs)
                        """,
                    )
                ]
                if_ = if_.with_changes(body=if_.body.with_changes(body=body))
            if m.matches(if_.test, _IS_DRAFT_EXTEND_V1_ONLY):
                if_ = _with_include_v2(if_)
            return if_

        if not _has_v2_split(_draft_extend_branch(fn)) or primitives.find_all(fn, m.If(test=_IS_DRAFT_EXTEND_V1_ONLY)):
            fn = primitives.replace_statements(fn, m.If(test=_IS_DRAFT_EXTEND), edit_branch)
        return primitives.replace_method(cls, fn.name.value, lambda _old: fn)

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        tree = super().transform_module_impl(tree)
        # Placed after the module's last top-level import (libcst's
        # AddImportsVisitor would put it right under `from __future__`, above
        # the module's docstring-like string in these files).
        return primitives.add_import_sorted(tree, HELPER_MODULE, HELPER)


# --- eagle_draft_extend_cuda_graph_runner.py: no top-k for V2 -------------------------

TOPK_FIELDS = ("topk_p", "topk_index")
_TOPK_ASSIGN = m.SimpleStatementLine(
    body=[m.Assign(targets=[m.AssignTarget(target=m.Attribute(attr=m.Name(TOPK_FIELDS[0]) | m.Name(TOPK_FIELDS[1])))])]
)
_V2_TEST = m.If(
    test=m.MatchIfTrue(
        lambda t: primitives.contains(t, m.Name("DRAFT_EXTEND_V2") | m.Attribute(attr=m.Name("DRAFT_EXTEND_V2")))
        or primitives.contains(t, m.Attribute(attr=m.Name("is_draft_extend_v2")))
    )
)
V2_GUARD = "self.forward_mode != ForwardMode.DRAFT_EXTEND_V2"


def _is_negative(test: cst.BaseExpression) -> bool:
    """``x != ...DRAFT_EXTEND_V2`` or ``not x.is_draft_extend_v2()``."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return True
    return isinstance(test, cst.Comparison) and any(isinstance(c.operator, cst.NotEqual) for c in test.comparisons)


def _unguarded_topk(fn: cst.FunctionDef) -> int:
    """Top-k copies into the output not confined to non-V2 modes (inside
    ``if mode != V2:``, or the ``else`` of ``if mode == V2:``)."""
    total = len(primitives.find_all(fn, _TOPK_ASSIGN))
    guarded = 0
    for g in primitives.find_all(fn, _V2_TEST):
        if _is_negative(g.test):
            guarded += len(primitives.find_all(g.body, _TOPK_ASSIGN))
        elif g.orelse is not None:
            guarded += len(primitives.find_all(g.orelse, _TOPK_ASSIGN))
    return total - guarded


class RunnerReplaySkipsTopkForV2(ClassCodemod):
    DESCRIPTION = (
        "EAGLEDraftExtendCudaGraphRunner.replay: for DRAFT_EXTEND_V2 the unpadded output carries logits and "
        "hidden states only; top-k slices are copied for the other modes"
    )
    CLASS = "EAGLEDraftExtendCudaGraphRunner"
    METHODS = ("replay", "execute")  # 0.5.17 renamed replay -> execute

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        fn = primitives.find_first_method(cls, self.METHODS)
        if fn is None:
            return Finding.missing(f"{self.CLASS}.replay", "method not defined")
        anchor = f"{self.CLASS}.{fn.name.value}"
        if _unguarded_topk(fn) == 0:
            return Finding.done(anchor)
        if self._topk_block(fn) is None:
            return Finding.missing(anchor, "top-k copies into the output are not one run of statements")
        return Finding.todo(anchor, "copies top-k slices into the DRAFT_EXTEND_V2 output")

    @staticmethod
    def _topk_block(fn: cst.FunctionDef) -> Optional[m.BaseMatcherNode]:
        """A matcher for the ``if`` whose body holds the top-k copies as one
        uninterrupted run (``if unpadding_bs is not None:`` in these trees)."""
        for if_ in primitives.find_all(fn, m.If()):
            body = list(if_.body.body)
            hits = [i for i, s in enumerate(body) if m.matches(s, _TOPK_ASSIGN)]
            if hits and hits == list(range(hits[0], hits[-1] + 1)) and not m.matches(if_, _V2_TEST):
                return m.If(test=m.MatchIfTrue(lambda test, target=if_.test: test is target))
        return None

    def transform_class(self, cls: cst.ClassDef) -> cst.ClassDef:
        fn = primitives.find_first_method(cls, self.METHODS)
        block = self._topk_block(fn)

        def edit(if_: cst.If) -> cst.If:
            body = list(if_.body.body)
            hits = [i for i, s in enumerate(body) if m.matches(s, _TOPK_ASSIGN)]
            if not hits:
                return if_
            body[hits[0] : hits[-1] + 1] = [primitives.guard_statements(body[hits[0] : hits[-1] + 1], V2_GUARD)]
            return if_.with_changes(body=if_.body.with_changes(body=body))

        self.require_import("sglang.srt.model_executor.forward_batch_info", "ForwardMode")
        return primitives.replace_method(cls, fn.name.value, lambda f: primitives.replace_statements(f, block, edit))


# --- the attention test kit ------------------------------------------------------------

V1_ASSERT = "_assert_draft_extend_outputs_close"
V2_ASSERT = "_assert_draft_extend_v2_outputs_close"
ADAPTER = "EagleDraftExtendCudaGraphRunnerAdapter"

V2_ASSERT_SOURCE = f'''
def {V2_ASSERT}(actual, expected, settings) -> None:
    # The DRAFT_EXTEND_V2 graph runner returns full-row next_token_logits and
    # hidden_states only; the selected-row top-k is computed by the V2 worker
    # after replay (sglang #25002), so there is no topk_p / topk_index to compare.
    torch.testing.assert_close(
        actual.next_token_logits,
        expected.next_token_logits,
        atol=settings.atol,
        rtol=settings.rtol,
    )
    torch.testing.assert_close(
        actual.hidden_states,
        expected.hidden_states,
        atol=settings.atol,
        rtol=settings.rtol,
    )
'''

_ADAPTER_CALL = m.Call(func=m.Name(ADAPTER))
_USES_V2_ASSERT = m.Call(
    func=m.Name(ADAPTER), args=[m.ZeroOrMore(), m.Arg(keyword=m.Name("assert_outputs_close"), value=m.Name(V2_ASSERT)), m.ZeroOrMore()]
)


def _v2_cases(module: cst.Module) -> list[cst.FunctionDef]:
    return [
        s
        for s in module.body
        if isinstance(s, cst.FunctionDef) and "draft_extend_v2" in s.name.value and primitives.contains(s, _ADAPTER_CALL)
    ]


class TestKitV2OutputsClose(PatchCodemod):
    DESCRIPTION = (
        f"attention test kit: {V2_ASSERT} compares logits and hidden states only; "
        "the DRAFT_EXTEND_V2 runner cases use it"
    )
    REQUIRED_TEXT = ("_assert_draft_extend",)  # either assertion helper

    def detect(self, module: cst.Module) -> Finding:
        anchor = V2_ASSERT
        if primitives.find_function(module, V1_ASSERT) is None and primitives.find_function(module, V2_ASSERT) is None:
            return Finding.missing(V1_ASSERT, "function not defined")
        unhooked = [
            f.name.value
            for f in _v2_cases(module)
            if len(primitives.find_all(f, _ADAPTER_CALL)) != len(primitives.find_all(f, _USES_V2_ASSERT))
        ]
        if primitives.find_function(module, V2_ASSERT) is None:
            return Finding.todo(anchor, "function not defined")
        if unhooked:
            return Finding.todo(anchor, f"not used by {', '.join(unhooked)}")
        return Finding.done(anchor)

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        if primitives.find_function(tree, V2_ASSERT) is None:
            tree = primitives.add_function(tree, V2_ASSERT_SOURCE, after=V1_ASSERT)
        for case in _v2_cases(tree):
            tree = primitives.replace_function(
                tree,
                case.name.value,
                lambda f: primitives.replace_expressions(
                    f,
                    _ADAPTER_CALL,
                    lambda node, _found: primitives.set_keyword_argument(node, "assert_outputs_close", V2_ASSERT),
                ),
            )
        return tree
