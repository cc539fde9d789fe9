"""What the parts of patch dsa-no-mirror share: the class names (NSA's up to
0.5.12.post1, DSA's from 0.5.13) and the shim-aware base (0.5.13+ keeps
``nsa_backend.py`` and ``nsa/*.py`` as re-exports of the renamed modules), both
in ``common.dsa`` (patch dsa-draft-extend-graph uses them too), and the
mirror's reads."""

from __future__ import annotations

import libcst.matchers as m

from patchkit.codemods.common.dsa import (  # noqa: F401 - the package's modules import them from here
    DSA,
    DSA_MULTI,
    DSA_PRECOMPUTE,
    NSA,
    NSA_MULTI,
    NSA_PRECOMPUTE,
    ShimAware,
)
from patchkit.codemods.common.primitives import attr
from patchkit.codemods.common.shared import none_comparison
from patchkit.layout import import_path

INDEXER = "Indexer"
DSA_HELPERS = import_path("backends.dsa")

MIRROR = attr("seq_lens_cpu", m.Name("forward_batch"))
ASSERTS_MIRROR = m.SimpleStatementLine(body=[m.Assert(test=none_comparison(MIRROR, m.IsNot()))])
