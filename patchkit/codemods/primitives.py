"""Moved to ``patchkit.codemods.common.primitives``: patch sets written
before the move (earlier 0.2.0 builds) import the edit primitives from here, and still can."""

import warnings

from patchkit.codemods.common.primitives import *  # noqa: F401,F403

warnings.warn(
    "patchkit.codemods.primitives moved to patchkit.codemods.common.primitives", DeprecationWarning, stacklevel=2
)
