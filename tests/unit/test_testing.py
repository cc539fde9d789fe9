"""patchkit.testing, the shipped helpers: before/after pairs (functions and
CodemodTest), a set's codemods without sys.path edits, no pytest import.
check_release runs in examples/acme-patches/tests on a real release."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from patchkit import testing
from patchkit.testing import CodemodTest, State, assert_codemod, assert_state, set_codemod

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "acme-patches"
GUARD = set_codemod(EXAMPLE / "acme_patches", "torch_native:GuardDecodeReshape")
BEFORE = """
    class TorchNativeAttnBackend:
        def forward_decode(self, q, layer):
            q = q.reshape(-1, layer.tp_q_head_num * layer.qk_head_dim)
            return q
    """
AFTER = """
    from sglang.srt._patchkit.acme_runtime import decode_q_needs_reshape
    class TorchNativeAttnBackend:
        def forward_decode(self, q, layer):
            if decode_q_needs_reshape(q):
                q = q.reshape(-1, layer.tp_q_head_num * layer.qk_head_dim)
            return q
    """


class TestGuardDecodeReshape(CodemodTest):
    TRANSFORM = GUARD
    EXAMPLES = [(BEFORE, AFTER)]
    LEFT_ALONE = [(AFTER, State.DONE), ("class TorchNativeAttnBackend:\n    pass\n", State.MISSING)]

    def test_assert_methods(self):
        self.assertCodemod(BEFORE, AFTER)
        self.assertState(BEFORE, State.TODO)


def test_functions_fail_with_assertion_errors():
    assert_codemod(GUARD, BEFORE, AFTER)
    with pytest.raises(AssertionError):
        assert_codemod(GUARD, BEFORE, BEFORE)
    with pytest.raises(AssertionError):
        assert_state(GUARD, BEFORE, State.DONE)
    assert GUARD.name().startswith(f"{(EXAMPLE / 'acme_patches').resolve()}:torch_native.GuardDecodeReshape@")


def test_the_api_is_stable_and_imports_no_pytest():
    assert all(hasattr(testing, name) for name in testing.__all__)
    assert {"assert_codemod", "assert_state", "CodemodTest", "check_release", "set_codemod"} <= set(testing.__all__)
    run = subprocess.run(
        [sys.executable, "-c", "import sys, patchkit.testing; print('pytest' in sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert run.stdout.strip() == "False"


def test_patchkits_own_tests_use_patchkit_testing_only():
    """The legacy ``tests/codemod_testing.py`` re-export is gone (issue 56): one way to test a codemod."""
    tests = Path(__file__).resolve().parents[1]
    assert not (tests / "codemod_testing.py").exists()
    users = [
        p.name for p in tests.rglob("*.py") if p != Path(__file__).resolve() and "codemod_testing" in p.read_text()
    ]
    assert users == []


def test_the_example_uses_patchkit_testing_only():
    text = (EXAMPLE / "tests" / "test_acme_patches.py").read_text()
    assert "from patchkit.testing import" in text
    assert "codemod_testing" not in text and "sys.path" not in text
