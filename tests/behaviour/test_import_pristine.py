"""The CPU environment imports real sglang modules: pristine 0.5.12.post1 in
this process, other releases each in a subprocess of their own."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.behaviour

pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("transformers")

from patchkit.fetch import fetch_tree  # noqa: E402

PRIMARY = "0.5.12.post1"

#: module -> classes that must exist in it (the edit sites of the patches).
EXPECTED: dict[str, list[str]] = {
    "sglang.srt.layers.attention.base_attn_backend": ["AttentionBackend"],
    "sglang.srt.layers.attention.triton_backend": ["TritonAttnBackend", "TritonMultiStepDraftBackend"],
    "sglang.srt.layers.attention.trtllm_mha_backend": ["TRTLLMHAAttnBackend"],
    "sglang.srt.layers.attention.trtllm_mla_backend": ["TRTLLMMLABackend", "TRTLLMMLAMultiStepDraftBackend"],
    "sglang.srt.speculative.eagle_info_v2": [],
    "sglang.srt.speculative.eagle_worker_v2": [],
    "sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner": [],
    "sglang.srt.managers.schedule_batch": ["ScheduleBatch"],
    "sglang.srt.model_executor.forward_batch_info": ["ForwardBatch", "ForwardMode"],
    "sglang.srt.observability.scheduler_metrics_mixin": ["SchedulerMetricsMixin"],
    "sglang.srt.managers.scheduler": ["Scheduler"],
}

#: Modules a release does not have (moved or folded away upstream).
ABSENT = {"0.5.13": {"sglang.srt.observability.scheduler_metrics_mixin"}}

# 0.5.10.post1 imports too (checked once); left out to save ~15 s of CPU per run.
OTHER_TREES = ["0.5.10", "0.5.11", "0.5.12", "0.5.13"]


@pytest.fixture(scope="module")
def pristine(load_sglang):
    return load_sglang(fetch_tree(PRIMARY))


@pytest.mark.parametrize("module", sorted(EXPECTED))
def test_pristine_module_imports(pristine, module):
    mod = importlib.import_module(module)
    assert Path(mod.__file__).resolve().is_relative_to(Path(pristine.__file__).resolve().parent)
    for name in EXPECTED[module]:
        assert isinstance(getattr(mod, name, None), type), f"{module}.{name}"


def test_stand_ins_are_installed_and_refuse_calls(pristine, cpu_env):
    import torchvision
    from sglang_cpu_env import STAND_IN_MARKER, StandInCalledError
    from transformers.utils import is_torchvision_available

    for name in ("torchvision", "sgl_kernel"):
        if name in cpu_env:  # a real package would not be listed
            assert importlib.util.find_spec(name) is not None
    if "torchvision" in cpu_env:
        assert getattr(torchvision, STAND_IN_MARKER)
        assert is_torchvision_available()  # transformers sees a module with a spec
        from torchvision.io import decode_jpeg

        with pytest.raises(StandInCalledError, match="decode_jpeg"):
            decode_jpeg(b"")


# Runs in a fresh interpreter: imports EXPECTED's modules from one tree, prints JSON.
_CHILD = r"""
import importlib, json, sys
sys.path.insert(0, sys.argv[1])
from sglang_cpu_env import import_sglang_tree, install_import_stubs
install_import_stubs(sys.argv[3])
import_sglang_tree(sys.argv[2])
expected = json.loads(sys.argv[4])
report = {}
for module, classes in expected.items():
    try:
        mod = importlib.import_module(module)
    except Exception as exc:
        report[module] = f"{type(exc).__name__}: {exc}"
        continue
    missing = [c for c in classes if not isinstance(getattr(mod, c, None), type)]
    report[module] = f"missing {missing}" if missing else "ok"
print("REPORT " + json.dumps(report))
"""


@pytest.fixture(scope="module")
def other_reports(cpu_env):
    """version -> (returncode, stdout, stderr); one interpreter per release, all
    started at once (each import takes ~15 s of mostly single-core CPU)."""
    tests_dir = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    procs = {}
    for version in OTHER_TREES:
        expected = {m: c for m, c in EXPECTED.items() if m not in ABSENT.get(version, ())}
        procs[version] = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _CHILD,
                tests_dir,
                str(fetch_tree(version)),
                str(fetch_tree(PRIMARY)),
                json.dumps(expected),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
    results = {}
    for version, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        results[version] = (proc.returncode, out, err)
    return results


@pytest.mark.parametrize("version", OTHER_TREES)
def test_other_release_imports_in_subprocess(version, other_reports):
    returncode, out, err = other_reports[version]
    lines = [line for line in out.splitlines() if line.startswith("REPORT ")]
    assert returncode == 0 and lines, err[-3000:]
    report = json.loads(lines[-1][len("REPORT ") :])
    expected = {m: "ok" for m in EXPECTED if m not in ABSENT.get(version, ())}
    assert report == expected
