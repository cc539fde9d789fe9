"""The postcondition of acme-torch-native-spec-v2 (its TOML's
``postconditions``): once the base class reshapes q only when needed, no
subclass in the file still reshapes it on every call. apply checks it on the
file as it would be written; when it fails, the patch is not applied (one
line, exit 1) and the other patches are."""

import ast

from patchkit.postconditions import Postcondition, Proposed, Violation

FILE = "srt/layers/attention/torch_native_backend.py"
BASE = "TorchNativeAttnBackend"


class SubclassesGuardReshape(Postcondition):
    def check(self, proposed: Proposed) -> Violation | None:
        source = proposed.written(FILE)
        for cls in ast.parse(source).body if source is not None else ():
            if not isinstance(cls, ast.ClassDef) or BASE not in {getattr(b, "id", None) for b in cls.bases}:
                continue
            for fn in cls.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "forward_decode":
                    for stmt in fn.body:  # a reshape at the top of the body runs on every call
                        if ast.unparse(stmt).startswith("q = q.reshape("):
                            line = proposed.line_on_disk(FILE, stmt.lineno)
                            return Violation(
                                proposed.owner,
                                (
                                    f"refused: {FILE}:{line}: {cls.name}.forward_decode reshapes q on every call: "
                                    f"guard it with `if decode_q_needs_reshape(q):` as {proposed.owner} does in "
                                    f"{BASE}, or `--skip {proposed.owner}` (the other patches still apply)"
                                ),
                            )
        return None
