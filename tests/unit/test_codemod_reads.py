"""A codemod says what it reads of its file (issue 56, "the speed machinery behind one
door"): the partial parse takes what it declares, and a codemod that reads the whole
module declares that too, with its reason (``READS_WHOLE``). Forgetting both used to
turn the partial parse off in silence; here it fails, naming the codemod. That each
declaration is right is tests/trees/test_transform_partial.py's proof on every known release."""

from __future__ import annotations

from patchkit import registry
from patchkit.codemods.common.base import PatchCodemod


def _builtin_codemods() -> dict[str, type]:
    out = {}
    for patch in registry.load().patches:
        for target in patch.targets:
            for ref in target.codemods:
                cls = registry.load_codemod(ref)
                out[cls.name()] = cls
    return out


def test_every_codemod_declares_what_it_reads_or_why_it_reads_all():
    silent = sorted(name for name, cls in _builtin_codemods().items() if cls.reads() is None and not cls.READS_WHOLE)
    assert silent == [], "declare reads() (or METHODS_READ), or READS_WHOLE with the reason"


def test_a_whole_read_declared_is_a_whole_read():
    stale = sorted(name for name, cls in _builtin_codemods().items() if cls.READS_WHOLE and cls.reads() is not None)
    assert stale == []


def test_an_undeclared_codemod_is_caught():
    class Forgot(PatchCodemod):
        def detect(self, module):
            raise NotImplementedError

    assert Forgot.reads() is None and Forgot.READS_WHOLE is None
