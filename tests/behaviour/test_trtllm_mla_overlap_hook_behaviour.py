"""trtllm-mla-overlap-hook, run: under SGLANG_ENABLE_OVERLAP_PLAN_STREAM=1 the
spec-v2 worker calls the target backend's
``update_verify_buffers_to_fill_after_draft`` after every draft. On a pristine
0.5.12.post1 (and 0.5.9) TRTLLMMLABackend that raises NotImplementedError (neither it nor
its FlashInfer MLA parent overrides the base class); patched, it returns and
touches nothing."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

pytestmark = pytest.mark.behaviour

pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("transformers")

from patchkit.cli import main  # noqa: E402
from patchkit.fetch import copy_tree  # noqa: E402

VERSIONS = ["0.5.12.post1", "0.5.9"]  # 0.5.9: a release before 0.5.10 (issue 43)
MODULE = "sglang.srt.layers.attention.trtllm_mla_backend"


def backend_class(tmp_path_factory, load_sglang, patched: bool, version: str):
    package = copy_tree(version, tmp_path_factory.mktemp("patched" if patched else "pristine"), "package")
    if patched:
        result = CliRunner().invoke(main, ["apply", str(package), "trtllm-mla-overlap-hook"], catch_exceptions=False)
        assert result.exit_code == 0, result.output
    load_sglang(package)
    module = importlib.import_module(MODULE)
    assert module.__file__.startswith(str(package))
    return module.TRTLLMMLABackend


def call_hook(cls):
    """The worker's call, on an instance whose state the hook must not need."""
    backend = cls.__new__(cls)
    spec_info = SimpleNamespace(custom_mask=object(), positions=object())
    return backend.update_verify_buffers_to_fill_after_draft(spec_info, 8), vars(backend), spec_info


@pytest.mark.parametrize("version", VERSIONS)
def test_pristine_raises_under_the_overlap_plan_stream(tmp_path_factory, load_sglang, version):
    cls = backend_class(tmp_path_factory, load_sglang, patched=False, version=version)
    with pytest.raises(NotImplementedError):
        call_hook(cls)


@pytest.mark.parametrize("version", VERSIONS)
def test_patched_is_a_no_op(tmp_path_factory, load_sglang, version):
    cls = backend_class(tmp_path_factory, load_sglang, patched=True, version=version)
    returned, state, spec_info = call_hook(cls)
    assert returned is None and state == {}
    assert set(vars(spec_info)) == {"custom_mask", "positions"}
    assert (
        cls.update_verify_buffers_to_fill_after_draft.__qualname__
        == "TRTLLMMLABackend.update_verify_buffers_to_fill_after_draft"
    )
