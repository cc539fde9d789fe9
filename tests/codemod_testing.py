"""The codemod test helpers moved to ``patchkit.testing`` (shipped with
patchkit, documented in docs/writing-a-patch.md). This re-export keeps
``from codemod_testing import ...`` working in patchkit's own tests; new
tests import ``patchkit.testing``."""

from patchkit.testing import *  # noqa: F401,F403
from patchkit.testing import __all__  # noqa: F401
