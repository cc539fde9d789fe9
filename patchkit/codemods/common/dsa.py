"""What the DeepSeek sparse attention patches (dsa-no-mirror, dsa-draft-extend-graph)
share: the class names (NSA's up to 0.5.12.post1, DSA's from 0.5.13), the
shim-aware base (0.5.13+ keeps ``nsa_backend.py`` and ``nsa/*.py`` as re-exports
of the renamed modules) and the release gate both patches open with (where spec
v2's draft extend runs on the backend as dsa-no-mirror carries it)."""

from __future__ import annotations

from typing import ClassVar

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import ClassCheck, Finding, PatchCodemod, State
from patchkit.codemods.common.host_expansion import device_form, host_expansions
from patchkit.codemods.common.primitives import attr
from patchkit.codemods.common.shared import code_of

NSA, DSA = "NativeSparseAttnBackend", "DeepseekSparseAttnBackend"
NSA_MULTI, DSA_MULTI = "NativeSparseAttnMultiStepBackend", "DeepseekSparseAttnMultiStepBackend"
NSA_PRECOMPUTE, DSA_PRECOMPUTE = (
    "NativeSparseAttnBackendMTPPrecomputeMixin",
    "DeepseekSparseAttnBackendMTPPrecomputeMixin",
)

_STAR_FROM_DSA = m.ImportFrom(
    module=m.MatchIfTrue(lambda mod: mod is not None and ".dsa" in code_of(mod)), names=m.ImportStar()
)


class ShimAware(PatchCodemod):
    """A class missing from a module that re-exports the renamed ``dsa``
    module (0.5.13+'s ``nsa_backend.py`` and ``nsa/*.py``) is not fork drift:
    the code lives in the ``dsa`` file, which the patch's other target edits."""

    TOP_LEVEL_ONLY = True  # the override reads the module's imports only
    CLASS: ClassVar[str]

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.REQUIRED_TEXT = ()  # a shim lacks the class name: detect says why

    def detect(self, module: cst.Module) -> Finding:
        finding = super().detect(module)
        if finding.state is State.MISSING and primitives.find_class(module, self.CLASS) is None:
            if any(m.matches(s, m.SimpleStatementLine(body=[_STAR_FROM_DSA])) for s in module.body):
                return Finding.superseded(
                    self.CLASS, "this module re-exports the renamed dsa module (0.5.13+), whose target has the change"
                )
        return finding


# -- the release gate ----------------------------------------------------------------------------

_V2_DRAFT_EXTEND = m.Call(func=attr("is_draft_extend"), args=[m.Arg(keyword=m.Name("include_v2"))]) | m.Call(
    func=attr("is_draft_extend_v2")
)
_EXPANDING_METHODS = ("init_forward_metadata", "init_forward_metadata_replay_cuda_graph", "_apply_cuda_graph_metadata")


class SpecV2Gate(ShimAware, ClassCheck):
    """Where spec v2's draft extend runs on the sparse-attention backend in the
    shape dsa-no-mirror carries: 0.5.7 .. 0.5.23 (and forks of them; 0.5.13 /
    0.5.14's renamed backend too: their GPU-only draft extend hands over
    ``extend_seq_lens_cpu``, the rest the patch takes from the device lengths
    and host bounds). Elsewhere the patch is moot (not applicable, with why):
    0.5.4.post3 .. 0.5.6.post2 call ``is_draft_extend()`` without ``include_v2``
    (sglang #15307 came with 0.5.7); a fork of 0.5.7 .. 0.5.9 whose host
    expansion of the verify / draft-extend lengths (``common.host_expansion``)
    has lists patchkit cannot follow to the device.
    ``PREFIX`` opens each moot reason (a patch built on dsa-no-mirror says so)."""

    CLASS: ClassVar[str]
    PREFIX: ClassVar[str] = ""
    # the methods that name these: init_forward_metadata's branches and the replay's (their host
    # expansions, 0.5.7 .. 0.5.9), 0.5.13's replay
    METHODS_READ, WORDS_READ = (), ("is_draft_extend", "torch.cat", "_apply_cuda_graph_metadata")

    def detect_in_class(self, cls: cst.ClassDef) -> Finding:
        anchor = f"{self.CLASS}.init_forward_metadata"
        fn = primitives.find_method(cls, "init_forward_metadata")
        if fn is None:
            return Finding.missing(anchor, f"{self.where(cls)}: class {self.CLASS} defines no init_forward_metadata")
        why = self._moot(cls, fn)
        if why:
            return Finding.superseded(anchor, self.PREFIX + why, moots_patch=True)
        return Finding.superseded(anchor, "the backend runs spec v2's draft extend")

    def _moot(self, cls: cst.ClassDef, fn: cst.FunctionDef) -> str:
        if not primitives.contains(fn, _V2_DRAFT_EXTEND):
            return "no spec-v2 draft extend here (is_draft_extend() without include_v2): spec v2 runs on NSA from 0.5.7"
        for method in _EXPANDING_METHODS:
            found = primitives.find_method(cls, method)
            if found is None:
                continue
            for branch, call in host_expansions(found):
                if device_form(found, branch, call) is None:
                    return (
                        f"{method} expands the verify / draft-extend lengths on the host (`torch.cat` of "
                        "`torch.arange` over `zip(...)`) from lists patchkit cannot follow to device tensors; not "
                        "carried: 0.5.10 expands them on the device (seqlens_expand_triton)"
                    )
        return ""
