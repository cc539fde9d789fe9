"""min-new-tokens-no-sync, run: the patched penalizer's _apply (imported on
CPU; 0.5.12.post1, and releases before 0.5.10: issue 43) gives exactly the
logits the pristine masked add gives, -inf stop tokens, bf16 and float32
logits, requests past their minimum included."""

from __future__ import annotations

import importlib

import pytest
from click.testing import CliRunner

pytestmark = pytest.mark.behaviour

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("transformers")

from patchkit.cli import main  # noqa: E402
from patchkit.fetch import copy_tree  # noqa: E402

VERSIONS = ["0.5.12.post1", "0.5.9", "0.5.4.post3"]
MODULE = "sglang.srt.sampling.penaltylib.min_new_tokens"


@pytest.fixture(scope="module", params=VERSIONS)
def penalizer_class(request, tmp_path_factory, load_sglang):
    package = copy_tree(request.param, tmp_path_factory.mktemp("mnt"), "package")
    result = CliRunner().invoke(main, ["apply", str(package), "min-new-tokens-no-sync"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    load_sglang(package)
    module = importlib.import_module(MODULE)
    assert module.__file__.startswith(str(package))
    return module.BatchedMinNewTokensPenalizer


def pristine_apply(state, logits):
    """The releases' _apply, as it reads there (0.5.4.post3 … 0.5.12.post1 alike)."""
    mask = (state.len_output_tokens < state.min_new_tokens).expand_as(logits)
    logits[mask] += state.stop_token_penalties[mask]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_same_logits_as_the_masked_add(penalizer_class, dtype):
    gen = torch.Generator().manual_seed(0)
    bs, vocab = 5, 128256
    penalizer = penalizer_class.__new__(penalizer_class)
    penalizer.len_output_tokens = torch.tensor([[0], [3], [7], [1], [9]], dtype=torch.int32)
    penalizer.min_new_tokens = torch.tensor([[4], [3], [8], [0], [20]], dtype=torch.int32)
    penalties = torch.zeros((bs, vocab), dtype=torch.float32)
    penalties[:, [2, 128001, 128009]] = float("-inf")
    penalizer.stop_token_penalties = penalties
    logits = torch.randn((bs, vocab), generator=gen).to(dtype)
    expected = logits.clone()
    pristine_apply(penalizer, expected)
    penalizer._apply(logits)
    assert torch.equal(logits, expected)
    assert torch.isinf(logits[0, 2]) and not torch.isinf(logits[1, 2]) and not torch.isnan(logits).any()
