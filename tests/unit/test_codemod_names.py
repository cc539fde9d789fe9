"""A codemod's name is the one its patch's reference gives it. The detection cache keys
findings by that name: a class named otherwise (defined in a package's module, re-exported by
the package) had its findings stored under one name and looked up under the other, so
`status` after `apply` parsed again (dsa-no-mirror's tables.py)."""

from __future__ import annotations

from patchkit import registry
from patchkit.registry.definitions import codemod_name, load_codemod


def test_every_builtin_codemod_is_named_as_its_reference_names_it():
    refs = {ref for patch in registry.all_patches() for target in patch.targets for ref in target.refs}
    assert refs
    for ref in refs:
        if isinstance(ref, str):
            assert load_codemod(ref).name() == codemod_name(ref), ref


def test_a_class_defined_in_a_packages_module_is_named_by_the_package():
    from patchkit.codemods.dsa_no_mirror import NsaReplayWithoutMirror
    from patchkit.codemods.dsa_no_mirror.tables import _WidthGuards

    assert NsaReplayWithoutMirror.__module__.endswith(".tables")
    assert NsaReplayWithoutMirror.name() == "dsa_no_mirror.NsaReplayWithoutMirror"
    assert _WidthGuards.name() == "tables._WidthGuards"  # not re-exported: its own module's name
