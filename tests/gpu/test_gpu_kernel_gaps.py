"""gpu_e2e/kernel_gaps.py: a name the image's sgl_kernel lacks imports, and raises when called."""

import types

import pytest

from gpu_e2e import kernel_gaps, syncs


def test_a_missing_name_imports_and_raises_naming_itself_when_called():
    module = types.ModuleType("sgl_kernel")
    module.__version__ = "0.4.2.post2"
    module.present = lambda: "here"
    kernel_gaps.fill(module)
    assert module.present() == "here"
    missing = module.awq_marlin_moe_repack  # what `from sgl_kernel import X` does
    assert missing.__name__ == "awq_marlin_moe_repack"
    assert "awq_marlin_moe_repack" in syncs._notes["kernel_gaps"]
    with pytest.raises(kernel_gaps.KernelGap, match="awq_marlin_moe_repack is not in sglang-kernel 0.4.2.post2"):
        missing(1, 2)
    assert syncs._notes["kernel_gaps_called"] == ["awq_marlin_moe_repack"]
    with pytest.raises(AttributeError):
        module.__wrapped__  # noqa: B018 - dunder lookups (inspect, copy) still miss


def test_only_0_5_9_runs_with_the_gaps_filled():
    from gpu_e2e import wheels

    assert {r for r, env in wheels.RELEASE_ENV.items() if kernel_gaps.ENV in env} == {"0.5.9"}


def test_a_submodule_not_yet_imported_is_imported_not_stood_in_for(tmp_path, monkeypatch):
    pkg = tmp_path / "fakekernel"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "ops.py").write_text("LOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    module = importlib.import_module("fakekernel")
    kernel_gaps.fill(module)
    from fakekernel import ops  # noqa: E402  what sgl_kernel.flash_attn does for FA3's library

    assert ops.LOADED is True
    assert callable(module.not_there)


def test_a_run_records_the_stand_ins_its_processes_met():
    dumps = [
        {"notes": {"kernel_gaps": ["awq_dequantize", "awq_marlin_repack"]}},
        {"notes": {"kernel_gaps": ["awq_marlin_repack"], "kernel_gaps_called": ["awq_dequantize"]}},
        {"notes": {}},
        {},
    ]
    assert kernel_gaps.met(dumps) == {"asked": ["awq_dequantize", "awq_marlin_repack"], "called": ["awq_dequantize"]}
    assert kernel_gaps.met([]) == {"asked": [], "called": []}
