"""Moved to ``patchkit.codemods.common.base``: patch sets written before
the move (earlier 0.2.0 builds) import the codemod contract from here, and still can."""

import warnings

from patchkit.codemods.common.base import *  # noqa: F401,F403
from patchkit.codemods.common.base import Finding, State  # noqa: F401 - not in the star: imported names

warnings.warn("patchkit.codemods.base moved to patchkit.codemods.common.base", DeprecationWarning, stacklevel=2)
