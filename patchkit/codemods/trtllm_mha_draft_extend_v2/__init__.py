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
  DRAFT_EXTEND_V2 (the V2 worker recomputes top-k on the rows it selects);
  ``common.draft_extend_topk``, shared with draft-extend-graph-no-topk.
* ``test/kits/attention_unittest/runner_modes/speculative_draft_extend_runner.py``
  (only where a tree ships it): ``_assert_draft_extend_v2_outputs_close``
  compares logits and hidden states only, and the V2 runner cases use it.

0.5.8.post1 and 0.5.9 list the backends inline, in the ``if`` that captures the graph: one more
``or`` term there. 0.5.4 .. 0.5.7 replay no CUDA draft-extend graph on spec v2: not applicable
(``common.draft_extend_gate``). Upstream's own shapes count as done: 0.5.13 renamed the MHA methods (``_build_cuda_graph_metadata``
/ ``_apply_cuda_graph_metadata``) and has the change; 0.5.17 made the whitelist a list, gave V2
its own ``elif is_draft_extend_v2()`` branches and dropped top-k from the runner output (``execute``).
"""

from __future__ import annotations

from typing import ClassVar, Optional

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import Finding, MethodCodemod, PatchCodemod
from patchkit.codemods.common.draft_extend_gate import (
    DraftExtendGraphCheck,
    graph_check,
    the_gate,
    with_gate_term,
)
from patchkit.codemods.common.draft_extend_topk import ReplaySkipsTopkForV2
from patchkit.codemods.common.shared import code_of
from patchkit.codemods.trtllm_mha_draft_extend_v2.branches import (
    HELPER,
    IS_DRAFT_EXTEND,
    IS_DRAFT_EXTEND_ANY,
    IS_DRAFT_EXTEND_V1_ONLY,
    IS_DRAFT_EXTEND_V2,
    branches,
    draft_extend_branch,
    draft_extend_method,
    has_v2_split,
    testing,
    v1_run,
    with_include_v2,
)
from patchkit.codemods.trtllm_mha_draft_extend_v2.whitelist import (
    GATE_TERM,
    LOCAL_IMPORT,
    MHA_BACKEND,
    MHA_MODULE,
    MHA_TERM,
    SUBJECT,
    WHITELIST,
    mentions,
    vendor_checks,
    whitelist_site,
    with_or_term,
)
from patchkit.layout import import_path

# --- eagle_worker_v2.py: the whitelist ------------------------------------------------


class WhitelistTRTLLMHA(DraftExtendGraphCheck):
    DESCRIPTION = (
        f"EagleDraftWorker: the draft-extend CUDA-graph whitelist ({WHITELIST}) accepts {MHA_BACKEND}, "
        "written as one isinstance(backend, (...)) tuple; import it beside the other backends"
    )

    TOP_LEVEL_ONLY: ClassVar[bool] = True  # its module hooks (PatchCodemod.reads)
    METHODS_READ = ()  # transform_class reads the method alone

    def detect(self, module: cst.Module) -> Finding:
        self._imported = primitives.imports_name(module, MHA_MODULE, MHA_BACKEND)
        return super().detect(module)

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        anchor = self.anchor_of(fn)
        if mentions(fn, MHA_BACKEND):
            # Ours and 0.5.13's tuple; 0.5.17's list of supported backend types.
            if self._imported or primitives.contains(fn, LOCAL_IMPORT):
                return Finding.done(anchor)
            return Finding.todo(anchor, f"{MHA_BACKEND} is whitelisted but not imported")
        if graph_check(fn) is None:
            return self.inline_todo(fn, f"{MHA_BACKEND} is not in the draft-extend capture gate")
        if whitelist_site(fn) is None:
            assign = graph_check(fn)
            assert assign is not None  # tested above
            return self.missing_in(
                fn,
                f"`{WHITELIST} = {code_of(assign.value)}` has no `or` of isinstance({SUBJECT}, ...) checks",
                f"one (or a single isinstance({SUBJECT}, (...)) check) to add {MHA_BACKEND} to",
                assign,
            )
        return Finding.todo(anchor, f"{MHA_BACKEND} is not whitelisted")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        if mentions(fn, MHA_BACKEND):
            return fn
        if graph_check(fn) is None:  # 0.5.8.post1 / 0.5.9: one more term of the capture gate's `or`
            return primitives.replace_statements(fn, the_gate(fn), lambda gate: with_gate_term(gate, GATE_TERM))
        site = whitelist_site(fn)
        assert site is not None  # detect found it
        assign, disjunction = site
        if vendor_checks(disjunction):  # the vendor's own isinstance terms stay as written: one more term
            # several isinstance terms: an `or`
            new_value = primitives.replace_node(
                assign.value, disjunction, with_or_term(cst.ensure_type(disjunction, cst.BooleanOperation), MHA_TERM)
            )
        else:
            new_value = primitives.add_isinstance_classes(
                assign.value, SUBJECT, [MHA_BACKEND], after="TRTLLMMLABackend"
            )
        return primitives.replace_statements(
            fn,
            primitives.line(primitives.is_node(assign)),
            lambda stmt: stmt.with_changes(body=[stmt.body[0].with_changes(value=new_value)]),
        )

    def transform_class(self, cls: cst.ClassDef) -> cst.ClassDef:
        cls = super().transform_class(cls)
        method = self.find_method(cls)
        assert method is not None  # super().transform_class found it
        if not primitives.contains(method, LOCAL_IMPORT):  # a fork's lazy import serves
            self.require_import(MHA_MODULE, MHA_BACKEND, among_siblings=True)
        return cls


# --- trtllm_mha_backend.py: capture and replay metadata ------------------------------

CAPTURE_METHODS = ("init_forward_metadata_capture_cuda_graph", "_build_cuda_graph_metadata")
REPLAY_METHODS = ("init_forward_metadata_replay_cuda_graph", "_apply_cuda_graph_metadata")
HELPER_MODULE = import_path("backends.trtllm_mha")


class _DraftExtendMetadataMethod(MethodCodemod):
    """A TRT-LLM MHA CUDA-graph metadata method, under its 0.5.10 - 0.5.12
    name or its 0.5.13 one; where a fork keeps both, the one with the
    draft-extend branch."""

    CLASS = "TRTLLMHAAttnBackend"
    METHODS_READ = ()  # find_method reads METHOD and RENAMED alone

    def find_method(self, cls: cst.ClassDef) -> Optional[cst.FunctionDef]:
        return draft_extend_method(cls, (self.METHOD, *self.RENAMED))


class CaptureIncludesDraftExtendV2(_DraftExtendMetadataMethod):
    DESCRIPTION = (
        "TRTLLMHAAttnBackend CUDA-graph capture metadata: the draft-extend branch matches V1 and V2 "
        "(is_draft_extend(include_v2=True))"
    )
    METHOD, RENAMED = CAPTURE_METHODS[0], CAPTURE_METHODS[1:]

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        anchor = self.anchor_of(fn)
        if branches(fn, IS_DRAFT_EXTEND_ANY | IS_DRAFT_EXTEND_V2):
            return Finding.done(anchor)
        if branches(fn, IS_DRAFT_EXTEND_V1_ONLY):
            return Finding.todo(anchor, "draft-extend branch matches V1 only")
        return self.missing_in(fn, "no draft-extend branch", "an `if forward_mode.is_draft_extend():` branch")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        return primitives.replace_statements(fn, testing(IS_DRAFT_EXTEND_V1_ONLY), with_include_v2)


class ReplayDraftExtendV2Stride(_DraftExtendMetadataMethod):
    DESCRIPTION = (
        "TRTLLMHAAttnBackend CUDA-graph replay metadata: the draft-extend branch matches V1 and V2; "
        "DRAFT_EXTEND_V2 uses spec_info.num_tokens_per_req as a fixed stride for cu_seqlens_q / "
        f"max_seq_len_q ({HELPER_MODULE}.{HELPER}); V1 keeps its cumsum path"
    )
    METHOD, RENAMED = REPLAY_METHODS[0], REPLAY_METHODS[1:]

    TOP_LEVEL_ONLY: ClassVar[bool] = True  # its module hooks (PatchCodemod.reads)

    def detect(self, module: cst.Module) -> Finding:
        self._helper_imported = primitives.imports_name(module, HELPER_MODULE, HELPER)
        return super().detect(module)

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        anchor = self.anchor_of(fn)
        v1_only = branches(fn, IS_DRAFT_EXTEND_V1_ONLY)
        both = branches(fn, IS_DRAFT_EXTEND_ANY)
        if not v1_only and not both:
            if branches(fn, IS_DRAFT_EXTEND_V2):
                return Finding.done(anchor, "V2 has its own branch (upstream 0.5.17+ shape)")
            return self.missing_in(fn, "no draft-extend branch", "an `if forward_mode.is_draft_extend():` branch")
        branch = (v1_only + both)[0]
        if not v1_only and has_v2_split(branch):
            if primitives.contains(branch.body, m.Call(func=m.Name(HELPER))) and not self._helper_imported:
                return Finding.todo(anchor, f"{HELPER} is called but not imported")
            return Finding.done(anchor)
        if not has_v2_split(branch):
            params = [p.name.value for p in fn.params.params]
            if not {"bs", "spec_info"} <= set(params):
                return self.missing_in(fn, f"parameters ({', '.join(params)})", "parameters `bs` and `spec_info`")
            if v1_run(branch) is None:
                return self.missing_in(
                    fn,
                    "the draft-extend branch fills cu_seqlens_q in no single run of statements",
                    "one run of statements filling cu_seqlens_q from num_accept_tokens, to keep as the V1 path",
                    branch,
                )
        return Finding.todo(anchor, "draft-extend replay has no DRAFT_EXTEND_V2 fixed-stride path")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        def edit_branch(if_: cst.If) -> cst.If:
            if not has_v2_split(if_):
                found = v1_run(if_)
                assert found is not None  # detect found it
                first, last = found
                body = primitives.block_statements(if_.body)
                run = body[first : last + 1]
                test = primitives.find_all_of(cst.Call, if_.test, IS_DRAFT_EXTEND)[0]
                receiver = code_of(cst.ensure_type(test.func, cst.Attribute).value)  # <receiver>.is_draft_extend()
                metadata = next(
                    code_of(a.value)
                    for a in primitives.find_all_of(
                        cst.Attribute, cst.IndentedBlock(body=run), m.Attribute(attr=m.Name("cu_seqlens_q"))
                    )
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
            if primitives.contains(if_.test, IS_DRAFT_EXTEND_V1_ONLY):
                if_ = with_include_v2(if_)
            return if_

        branch = draft_extend_branch(fn)
        assert branch is not None  # detect found it
        if not has_v2_split(branch) or branches(fn, IS_DRAFT_EXTEND_V1_ONLY):
            fn = primitives.replace_statements(fn, testing(IS_DRAFT_EXTEND), edit_branch)
        return fn

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        self.require_import(HELPER_MODULE, HELPER, among_siblings=True)
        return super().transform_module_impl(tree)


# --- eagle_draft_extend_cuda_graph_runner.py: no top-k for V2 -------------------------


class RunnerReplaySkipsTopkForV2(ReplaySkipsTopkForV2):
    DESCRIPTION = (
        "EAGLEDraftExtendCudaGraphRunner.replay: for DRAFT_EXTEND_V2 the unpadded output carries logits and "
        "hidden states only; top-k slices are copied for the other modes"
    )


# --- the attention test kit ------------------------------------------------------------

V1_ASSERT = "_assert_draft_extend_outputs_close"
V2_ASSERT = "_assert_draft_extend_v2_outputs_close"
ADAPTER = "EagleDraftExtendCudaGraphRunnerAdapter"

V2_ASSERT_SOURCE = f"""
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
"""

_ADAPTER_CALL = m.Call(func=m.Name(ADAPTER))
_USES_V2_ASSERT = m.Call(
    func=m.Name(ADAPTER),
    args=[m.ZeroOrMore(), m.Arg(keyword=m.Name("assert_outputs_close"), value=m.Name(V2_ASSERT)), m.ZeroOrMore()],
)


def _v2_cases(module: cst.Module) -> list[cst.FunctionDef]:
    return [
        s
        for s in module.body
        if isinstance(s, cst.FunctionDef)
        and "draft_extend_v2" in s.name.value
        and primitives.contains(s, _ADAPTER_CALL)
    ]


class TestKitV2OutputsClose(PatchCodemod):
    DESCRIPTION = (
        f"attention test kit: {V2_ASSERT} compares logits and hidden states only; "
        "the DRAFT_EXTEND_V2 runner cases use it"
    )
    REQUIRED_TEXT = ("_assert_draft_extend",)  # either assertion helper
    READS_WHOLE = "the kit's runner cases are found by what they call (_v2_cases): any top-level function may be one"

    def detect(self, module: cst.Module) -> Finding:
        self.detect_module(module)
        anchor = V2_ASSERT
        v1, v2 = primitives.find_function(module, V1_ASSERT), primitives.find_function(module, V2_ASSERT)
        if v1 is None and v2 is None:
            return Finding.missing(V1_ASSERT, "function not defined")
        unhooked = [
            f.name.value
            for f in _v2_cases(module)
            if len(primitives.find_all(f, _ADAPTER_CALL)) != len(primitives.find_all(f, _USES_V2_ASSERT))
        ]
        if v2 is None:
            return self.located(Finding.todo(anchor, "function not defined"), v1)  # where it goes
        if unhooked:
            return self.located(Finding.todo(anchor, f"not used by {', '.join(unhooked)}"), v2)
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
