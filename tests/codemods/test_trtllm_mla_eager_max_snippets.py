"""Snippet tests of tests/trees/test_trtllm_mla_eager_max.py (no release read; the quick loop runs them)."""

from __future__ import annotations

import ast

import pytest

from patchkit.codemods import trtllm_mla_spec_v2 as spec
from patchkit.codemods.common.base import State
from patchkit.testing import apply, assert_state, code, detect

CODEMOD = spec.EagerMaxWithoutMirror


def backend(test: str, fallback: str, flag: str = "") -> str:
    return code(f"""
        class TRTLLMMLABackend(FlashInferMLAAttnBackend):
        {flag}
            def init_forward_metadata(self, forward_batch):
                bs = forward_batch.batch_size
                # Get maximum sequence length.
                if {test}:
                    max_seq = forward_batch.seq_lens_cpu.max().item()
                else:
                    max_seq = {fallback}
                seq_lens = forward_batch.seq_lens
        """)


PRISTINE = backend('getattr(forward_batch, "seq_lens_cpu", None) is not None', "forward_batch.seq_lens.max().item()")


def test_the_device_max_becomes_the_static_bound_through_the_shared_helper():
    out = apply(CODEMOD, PRISTINE)
    assert "from sglang.srt._patchkit.backends.mirror_reads import host_max_seq_len\n" in out
    assert (
        "        # Get maximum sequence length.\n"
        "        # Without the CPU mirror, the static bound (sglang 0.5.16): it only sizes\n"
        "        # the block table; seq_lens.max().item() waited for the GPU every eager step.\n"
        '        max_seq = host_max_seq_len(getattr(forward_batch, "seq_lens_cpu", None), self.max_context_len, forward_batch)\n'
        "        seq_lens = forward_batch.seq_lens\n"
    ) in out
    assert item_calls(out) == []


@pytest.mark.parametrize(
    "test, fallback",
    [
        ("forward_batch.seq_lens_cpu is not None", "int(forward_batch.seq_lens.max())"),
        ('getattr(forward_batch, "seq_lens_cpu", None) is not None', "torch.max(forward_batch.seq_lens).item()"),
    ],
)
def test_fork_spellings_of_the_test_and_the_device_max(test, fallback):
    out = apply(CODEMOD, backend(test, fallback))
    assert (
        f"max_seq = host_max_seq_len({test.removesuffix(' is not None')}, self.max_context_len, forward_batch)" in out
    )


def test_upstreams_bound_is_done():
    assert_state(
        CODEMOD, backend("forward_batch.seq_lens_cpu is not None", "self.max_context_len"), State.DONE, "0.5.16"
    )


def test_upstreams_own_opt_out_keeping_the_device_max_is_left_alone():
    """0.5.13 .. 0.5.15: the flag is upstream's (no patchkit helper in the class)."""
    src = backend(
        'getattr(forward_batch, "seq_lens_cpu", None) is not None',
        "forward_batch.seq_lens.max().item()",
        flag="    needs_cpu_seq_lens: bool = False\n",
    )
    assert_state(CODEMOD, src, State.SUPERSEDED, "0.5.13 .. 0.5.15")


def test_an_unknown_fallback_is_a_missing_anchor():
    finding = detect(CODEMOD, backend("forward_batch.seq_lens_cpu is not None", "compute_max(forward_batch)"))
    assert finding.state is State.MISSING and "max_context_len" in finding.detail


def item_calls(source: str, cls: str = "TRTLLMMLABackend", method: str = "init_forward_metadata") -> list[int]:
    """Lines of every ``.item()`` call in ``cls.method``."""
    klass = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == cls)
    fn = next(n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == method)
    return [
        n.lineno
        for n in ast.walk(fn)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "item"
    ]
