"""Codemods of acme-torch-native-spec-v2, written with patchkit's primitives."""

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import AddMethodCodemod, Finding, MethodCodemod
from patchkit.layout import import_path

BACKEND = "TorchNativeAttnBackend"
HOOK = "update_verify_buffers_to_fill_after_draft"
HELPER = "decode_q_needs_reshape"  # in acme_runtime.py, this set's runtime module
# `q = q.reshape(...)`, the statement to guard, matched by shape, not by line.
RESHAPE = m.SimpleStatementLine(
    body=[
        m.Assign(targets=[m.AssignTarget(m.Name("q"))], value=m.Call(func=m.Attribute(m.Name("q"), m.Name("reshape"))))
    ]
)


class AddVerifyBuffersHook(AddMethodCodemod):
    DESCRIPTION = f"{BACKEND}.{HOOK}: a no-op override (the base class raises NotImplementedError)"
    CLASS = BACKEND
    METHOD = HOOK
    AFTER = ("init_forward_metadata",)
    SOURCE = f"""
def {HOOK}(self, spec_info, cuda_graph_bs):
    # Verify metadata does not depend on the draft tokens: nothing to refill.
    pass
"""


class GuardDecodeReshape(MethodCodemod):
    DESCRIPTION = f"{BACKEND}.forward_decode: q = q.reshape(...) runs only if {HELPER}(q)"
    CLASS = BACKEND
    METHOD = "forward_decode"

    def detect_in_method(self, fn: cst.FunctionDef) -> Finding:
        if primitives.contains(fn, m.If(body=m.IndentedBlock(body=[RESHAPE]))):
            return Finding.done(self.anchor)  # guarded, by us or by hand
        if any(m.matches(stmt, RESHAPE) for stmt in fn.body.body):
            return Finding.todo(self.anchor, "q = q.reshape(...) runs on every call")
        return self.missing_in(fn, "no top-level q = q.reshape(...)", "it, to guard it")

    def transform_method(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        self.require_import(import_path("acme_runtime"), HELPER)
        return primitives.replace_statements(fn, RESHAPE, lambda stmt: primitives.guard_statement(stmt, f"{HELPER}(q)"))
