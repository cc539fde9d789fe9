"""What the parts of patch dsa-no-mirror share: the class names (NSA's up to
0.5.12.post1, DSA's from 0.5.13) and the shim-aware base (0.5.13+ keeps
``nsa_backend.py`` and ``nsa/*.py`` as re-exports of the renamed modules)."""

from __future__ import annotations

from typing import ClassVar

import libcst as cst
import libcst.matchers as m

from patchkit.codemods.common import primitives
from patchkit.codemods.common.base import Finding, PatchCodemod, State
from patchkit.codemods.common.primitives import attr
from patchkit.codemods.common.shared import code_of, none_comparison
from patchkit.layout import import_path

NSA, DSA = "NativeSparseAttnBackend", "DeepseekSparseAttnBackend"
NSA_MULTI, DSA_MULTI = "NativeSparseAttnMultiStepBackend", "DeepseekSparseAttnMultiStepBackend"
NSA_PRECOMPUTE, DSA_PRECOMPUTE = (
    "NativeSparseAttnBackendMTPPrecomputeMixin",
    "DeepseekSparseAttnBackendMTPPrecomputeMixin",
)
INDEXER = "Indexer"
DSA_HELPERS = import_path("backends.dsa")

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


MIRROR = attr("seq_lens_cpu", m.Name("forward_batch"))
ASSERTS_MIRROR = m.SimpleStatementLine(body=[m.Assert(test=none_comparison(MIRROR, m.IsNot()))])
