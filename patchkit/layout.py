"""Where patchkit's own files live inside a patched sglang tree.

A leaf (it imports nothing of patchkit): the codemods name the module their
helpers are imported from with ``import_path``, and ``patchkit.state.vendoring``
writes the folder there, so both read the place from here and neither imports
the other.
"""

FOLDER = "srt/_patchkit"  # relative to the sglang package folder
IMPORT_ROOT = "sglang.srt._patchkit"


def import_path(module: str) -> str:
    """Where patched code imports a runtime module from: ``runtime`` ->
    ``sglang.srt._patchkit.runtime``. Every codemod names its helpers' module
    through this, so the import path is decided in one place."""
    return f"{IMPORT_ROOT}.{module}"
