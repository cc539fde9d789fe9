"""Patch sets written against patchkit 0.2 import the authoring API from its
old places; they still load (with a DeprecationWarning naming the new place)."""

import importlib
import sys

import pytest


@pytest.mark.parametrize(
    "old, name, new",
    [
        ("patchkit.codemods.base", "MethodCodemod", "patchkit.codemods.common.base"),
        ("patchkit.codemods.base", "Finding", "patchkit.findings"),
        ("patchkit.codemods.primitives", "find_method", "patchkit.codemods.common.primitives"),
        ("patchkit.vendoring", "import_path", "patchkit.layout"),
    ],
)
def test_old_import_paths_still_load(old, name, new):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=new.rsplit(".", 1)[0] if name == "Finding" else new):
        module = importlib.import_module(old)
    assert getattr(module, name) is getattr(importlib.import_module(new), name)
