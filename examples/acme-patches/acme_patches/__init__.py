"""Acme's own sglang patches: a patchkit patch set (the ``*.toml`` here and
the codemod modules they name). Installed, the ``patchkit.patches`` entry
point in pyproject.toml makes patchkit load it next to its own."""
