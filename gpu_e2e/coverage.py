"""Which distributions does the Engine path import? (host side, CPU, for the bundle's tests)

Imports the modules a ``sglang.Engine`` with EAGLE3 spec v2 loads (engine, scheduler,
model runner, Llama + EAGLE3 models, the spec-v2 worker, Triton attention, sampler,
loader) from a tree, in a fresh interpreter of the CPU behaviour environment
(``requirements-behaviour.txt``; ``tests/sglang_cpu_env.py`` stands in for the
GPU-only ``torchvision`` and ``sgl_kernel``), then maps every module loaded to its
distribution. :func:`uncovered` names those neither on the GPU image nor in the bundle.

An image package that the CPU environment lacks (``uvloop``) is replaced by a
stand-in and the import retried, so the walk goes on past it; a missing package that
is neither on the image nor pinned in the bundle stops the walk and is reported.
What only CUDA code paths import (``flashinfer.sampling`` under ``is_cuda()``) is not
seen here: the GPU run is the check for those.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from .bundle import repo_root
from .wheels import IMAGE_PACKAGES, all_pins, normalise

ENGINE_PATH_MODULES = (
    "sglang.srt.entrypoints.engine",
    "sglang.srt.managers.scheduler",
    "sglang.srt.managers.tokenizer_manager",
    "sglang.srt.managers.detokenizer_manager",
    "sglang.srt.model_executor.model_runner",
    "sglang.srt.model_loader.loader",
    "sglang.srt.models.llama",
    "sglang.srt.models.llama_eagle3",
    "sglang.srt.speculative.eagle_worker_v2",
    "sglang.srt.speculative.eagle_info_v2",  # up to 0.5.13; 0.5.17 folded it into eagle_info
    "sglang.srt.speculative.eagle_info",
    "sglang.srt.layers.attention.triton_backend",
    "sglang.srt.layers.attention.flashattention_backend",  # FA3: what Hopper picks by default
    "sglang.srt.layers.sampler",
    "sglang.srt.server_args",
)


def present_modules(tree_parent: Path, modules: Iterable[str] = ENGINE_PATH_MODULES) -> list[str]:
    """The modules of ``modules`` that the tree has (a release drops or folds some)."""
    root = Path(tree_parent)
    return [
        m
        for m in modules
        if (root / (m.replace(".", "/") + ".py")).is_file() or (root / m.replace(".", "/") / "__init__.py").is_file()
    ]


#: import name -> distribution, where they differ (image packages and bundle pins).
IMPORT_ALIASES = {
    "yaml": "pyyaml",
    "PIL": "pillow",
    "cv2": "opencv-python-headless",
    "zmq": "pyzmq",
    "google": "protobuf",
    "dateutil": "python-dateutil",
    "multipart": "python-multipart",
    "python_multipart": "python-multipart",
    "tvm_ffi": "apache-tvm-ffi",
    "IPython": "ipython",
    "sgl_kernel": "sglang-kernel",
    "flashinfer": "flashinfer-python",
    "pydantic_core": "pydantic-core",
    "typing_extensions": "typing-extensions",
    "jinja2": "jinja2",
    "markupsafe": "markupsafe",
    "huggingface_hub": "huggingface-hub",
    "partial_json_parser": "partial-json-parser",
    "compressed_tensors": "compressed-tensors",
    "sklearn": "scikit-learn",
    "skimage": "scikit-image",
    "attr": "attrs",
    "_cffi_backend": "cffi",
    "opentelemetry": "opentelemetry-api",
    "deep_gemm": "sgl-deep-gemm",
}


def distribution_of_import(name: str) -> str:
    """The distribution a top-level import name comes from (normalised; a guess by name
    where :data:`IMPORT_ALIASES` does not say)."""
    return normalise(IMPORT_ALIASES.get(name, name))


_CHILD = r"""
import importlib, importlib.util, importlib.metadata as md, json, sys
tree_parent, tests_dir, allowed, modules = sys.argv[1], sys.argv[2], set(json.loads(sys.argv[3])), json.loads(sys.argv[4])
aliases = json.loads(sys.argv[5])
sys.path.insert(0, tests_dir)
import sglang_cpu_env as env
env.install_import_stubs(tree_parent + "/sglang")
sys.path.insert(0, tree_parent)
stood_in = []
import asyncio, types
if importlib.util.find_spec("uvloop") is None:
    # On the image; absent from the CPU environment. tokenizer_manager calls
    # uvloop.EventLoopPolicy() at import: asyncio's own policy keeps the walk going.
    shim = types.ModuleType("uvloop")
    shim.EventLoopPolicy = asyncio.DefaultEventLoopPolicy
    shim.__patchkit_stand_in__ = True
    sys.modules["uvloop"] = shim
def dist_of_import(name):
    return aliases.get(name, name).lower().replace("_", "-")
for attempt in range(20):
    try:
        for m in modules:
            importlib.import_module(m)
        break
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if not top or dist_of_import(top) not in allowed or top in stood_in:
            print(json.dumps({"error": f"{type(exc).__name__}: {exc}", "missing": top, "stood_in": stood_in}))
            sys.exit(0)
        stood_in.append(top)
        sys.meta_path.insert(0, env._StandInFinder([top]))
        env.purge_sglang_modules()
pd = md.packages_distributions()
tops = sorted({n.split(".")[0] for n in list(sys.modules)})
out = {}
for t in tops:
    if t in sys.stdlib_module_names or t in ("__main__", "__mp_main__", "sglang_cpu_env"):
        continue
    mod = sys.modules.get(t)
    if getattr(mod, env.STAND_IN_MARKER, False):
        out[t] = ["<stand-in>", dist_of_import(t)]
        continue
    where = [getattr(mod, "__file__", None) or "", *map(str, getattr(mod, "__path__", None) or [])]
    if any("/setuptools/_vendor/" in w for w in where):
        # setuptools' own copies (jaraco, more_itertools, backports), put on the path when
        # setuptools is imported (0.5.17: through torch's cpp_extension): setuptools is the image's
        out[t] = ["setuptools", dist_of_import(t)]
        continue
    out[t] = [(pd.get(t) or [None])[0], dist_of_import(t)]
print(json.dumps({"modules": out, "stood_in": stood_in}))
"""


def allowed_distributions(releases: Iterable[str]) -> set[str]:
    pins = all_pins(list(releases))
    names = set(IMAGE_PACKAGES) | {"sglang", "patchkit"}
    for group in pins.values():
        names |= {normalise(d) for d in group}
    return names


def engine_path_imports(
    tree_parent: Path, release: str, python: str = sys.executable, site: Iterable[Path] = ()
) -> dict:
    """``{"modules": {top: [dist-or-None, guessed-dist]}, "stood_in": [...]}`` or ``{"error": ...}``.
    ``site``: folders put first on the child's path (a bundle's unpacked site)."""
    allowed = sorted(allowed_distributions([release]))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, site), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run(
        [
            python,
            "-c",
            _CHILD,
            str(tree_parent),
            str(repo_root() / "tests"),
            json.dumps(allowed),
            json.dumps(present_modules(tree_parent)),
            json.dumps(IMPORT_ALIASES),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": f"rc={proc.returncode}: {proc.stderr.strip()[-3000:]}"}
    return json.loads(lines[-1])


def uncovered(result: dict, release: str) -> list[str]:
    """Distributions the Engine path imported that neither the image nor the bundle holds."""
    if "error" in result:
        return [result["error"]]
    allowed = allowed_distributions([release])
    bad = []
    for top, (dist, guess) in sorted(result["modules"].items()):
        if dist is None and (top.startswith("_") or top == "cython_runtime"):
            continue  # interpreter/extension internals (_cython_3_1_4, _sysconfigdata_...)
        name = normalise(dist) if dist and dist != "<stand-in>" else guess
        if normalise(name) not in allowed:
            bad.append(f"{top} ({name})")
    return bad
