"""Moved: where patched code imports its helpers from is
``patchkit.layout.import_path`` (the runtime folder itself:
``patchkit.state.vendoring``). Patch sets written before the move (earlier 0.2.0 builds) import
``import_path`` from here, and still can."""

import warnings

from patchkit.layout import IMPORT_ROOT, import_path

__all__ = ["IMPORT_ROOT", "import_path"]

warnings.warn("patchkit.vendoring.import_path moved to patchkit.layout.import_path", DeprecationWarning, stacklevel=2)
