"""Codemods of acme-torch-native-spec-v2, written with patchkit's primitives."""

import libcst as cst
import libcst.matchers as m

from patchkit.codemods import primitives
from patchkit.codemods.base import AddMethodCodemod, ClassCodemod, Finding

BACKEND = "TorchNativeAttnBackend"
HOOK = "update_verify_buffers_to_fill_after_draft"
GUARD = "q.dim() != 2"
# `q = q.reshape(...)`, the statement to guard, matched by shape, not by line.
RESHAPE = m.SimpleStatementLine(body=[m.Assign(
    targets=[m.AssignTarget(m.Name("q"))], value=m.Call(func=m.Attribute(m.Name("q"), m.Name("reshape")))
)])


class AddVerifyBuffersHook(AddMethodCodemod):
    DESCRIPTION = f"{BACKEND}.{HOOK}: a no-op override (the base class raises NotImplementedError)"
    CLASS = BACKEND
    METHOD = HOOK
    AFTER = ("init_forward_metadata",)
    SOURCE = f'''
def {HOOK}(self, spec_info, cuda_graph_bs):
    # Verify metadata does not depend on the draft tokens: nothing to refill.
    pass
'''


class GuardDecodeReshape(ClassCodemod):
    DESCRIPTION = f"{BACKEND}.forward_decode: q = q.reshape(...) runs only if {GUARD}"
    CLASS = BACKEND

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        anchor = f"{BACKEND}.forward_decode: q = q.reshape(...)"
        fn = primitives.find_method(cls, "forward_decode")
        if fn is None:
            return Finding.missing(anchor, "method not found")
        if primitives.contains(fn, m.If(body=m.IndentedBlock(body=[RESHAPE]))):
            return Finding.done(anchor)
        if any(m.matches(stmt, RESHAPE) for stmt in fn.body.body):
            return Finding.todo(anchor, f"not guarded by `if {GUARD}:`")
        return Finding.missing(anchor, "statement not found")

    def transform_class(self, cls: cst.ClassDef) -> cst.ClassDef:
        return primitives.replace_method(cls, "forward_decode", lambda fn: primitives.replace_statements(
            fn, RESHAPE, lambda stmt: primitives.guard_statement(stmt, GUARD)))
