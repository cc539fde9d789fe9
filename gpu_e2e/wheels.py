"""The wheels a GPU bundle carries (host side, no GPU): the releases it runs,
their pins, and each wheel downloaded, slimmed and unpacked into a tar.

Wheels come from the registry (``pip download --no-deps`` for cp312 manylinux), are
unpacked, and two are slimmed: ``sglang-kernel`` keeps its Python files, the sm90
``common_ops`` library and its metadata (the FA3, FlashMLA and sm100 libraries are
not used by Triton attention on Hopper). ``flashinfer-python`` travels whole: with it
importable, sgl_kernel's ``rmsnorm``/``fused_add_rmsnorm`` go through
``flashinfer.norm``, which JIT-compiles its norm module (nvcc, from ``data/csrc``) at
the first call on the GPU machine; nothing else of flashinfer is built with
``sampling_backend="pytorch"`` and Triton attention.
"""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Optional

#: Releases this bundle knows how to run, patched against pristine. 0.5.13 is the
#: first whose spec v2 takes tree drafts (topk > 1, issue 44); 0.5.9 is the newest
#: release before 0.5.10 (issue 43).
RELEASES = ("0.5.12.post1", "0.5.11", "0.5.10", "0.5.13", "0.5.9")
#: Releases that may also travel as they are (``bundle --reference``): the upstream
#: reference of what sync-free means (issue 23 compares a patched 0.5.12.post1's
#: sync table with 0.5.13's); 0.5.17, the newest release that pins the image's torch
#: 2.11.0 (0.5.18+ pin 2.13 and later), is issue 57's yardstick.
REFERENCE_RELEASES = ("0.5.13", "0.5.17")

#: What the GPU image ('cuda', python 3.12) already holds (device KINDS.md list,
#: normalised distribution names). Anything the Engine path imports beyond this and
#: the standard library must be in the bundle.
IMAGE_PACKAGES = frozenset(
    """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy
coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython
diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic
frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities
linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl
meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti
nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile
nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py
nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime
onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich
sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn
sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server
tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio
torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton
typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt
xarray xxhash yarl zipp
""".split()
)

#: Pure-Python and cp312 wheels shared by every release (distribution -> version).
#: Versions are those of requirements-behaviour.txt's resolved environment, where the
#: same sglang modules import on CPU.
COMMON_PINS = {
    "fastapi": "0.165.0",
    "opentelemetry-api": "1.45.2",  # fastapi.telemetry imports it
    "starlette": "1.10.0",
    "pydantic": "2.13.4",
    "pydantic-core": "2.46.4",
    "annotated-types": "0.8.0",
    "typing-inspection": "0.4.5",
    "uvicorn": "0.54.0",
    "orjson": "3.13.0",
    "pyzmq": "27.3.0",
    "pybase64": "1.5.1",
    "msgspec": "0.22.0",
    "setproctitle": "1.3.8",
    "partial-json-parser": "0.2.1.1.post7",
    "openai": "2.6.1",
    "distro": "1.9.0",
    "jiter": "0.19.0",
    "sniffio": "1.3.1",
    "compressed-tensors": "0.20.0",
    "loguru": "0.7.3",
    "gguf": "0.19.0",
    "dill": "0.4.1",
    "python-multipart": "0.0.20",
    "interegular": "0.3.3",
    "apache-tvm-ffi": "0.1.9",
    "ipython": "9.18.1",
    "ipython-pygments-lexers": "1.1.1",
    "decorator": "5.2.1",
    "jedi": "0.20.1",
    "parso": "0.8.7",
    "matplotlib-inline": "0.2.2",
    "pexpect": "4.9.0",
    "ptyprocess": "0.7.0",
    "prompt-toolkit": "3.0.53",
    "wcwidth": "0.9.4",
    "stack-data": "0.6.3",
    "asttokens": "3.0.2",
    "executing": "2.3.0",
    "pure-eval": "0.2.4",
    "traitlets": "5.16.1",
    # torch 2.11.0+cu130 is what the image has (0.5.11+ pin it). sglang-kernel
    # 0.4.2.post2 is the build for it; 0.5.10 asks for >= 0.4.1 and gets it too
    # (0.4.1 is built for 0.5.10's torch 2.9.1, which the image lacks).
    "sglang-kernel": "0.4.2.post2",
}

#: Per release: what its metadata pins differently (transformers, flashinfer).
RELEASE_PINS = {
    "0.5.12.post1": {
        "transformers": "5.6.0",
        "tokenizers": "0.22.2",  # transformers 5.6.0 refuses the image's 0.23.2
        "flashinfer-python": "0.6.11.post1",
    },
    "0.5.11": {
        "transformers": "5.6.0",
        "tokenizers": "0.22.2",
        "flashinfer-python": "0.6.8.post1",
    },
    "0.5.10": {
        "transformers": "5.3.0",
        "tokenizers": "0.22.2",
        "flashinfer-python": "0.6.7.post2",
    },
    "0.5.13": {
        "transformers": "5.8.1",
        "tokenizers": "0.22.2",
        "flashinfer-python": "0.6.12",
        "sglang-kernel": "0.4.3",  # 0.5.13 pins it (built for the image's torch 2.11)
    },
    # Issue 57's yardstick, carried as published (``--reference 0.5.17``). Its metadata
    # pins more (flash-attn-4, helion, humming-kernels, nvidia-cutlass-dsl, quack,
    # tilelang, tokenspeed-mla, torchao, kernels, ...); those are imported inside
    # functions or under guards that a Llama EAGLE3 spec-v2 engine on FA3 or Triton
    # does not reach (docs/research/sglang-0.5.17-bundle.md lists each site), so they
    # stay behind. sgl-deep-gemm 0.1.5.post1 (its pin; it needs apache-tvm-ffi 0.1.11)
    # travels: the EAGLE v2 worker's graph capture imports layers/attention/dsa_backend
    # on CUDA, which imports deep_gemm at module level under ``if is_cuda()`` (the first
    # GPU run died there; cuda_only_imports.py reads such imports on CPU). What its Engine path imports at module level and the image lacks
    # or holds at another version travels: xgrammar (function_call's detectors import it
    # at module level and pydantic needs its real types), apache-tvm-ffi 0.1.11 (its
    # pin; xgrammar and sglang's JIT kernels load it), sglang-kernel 0.4.5 (its pin,
    # built for torch 2.11), transformers 5.12.1 with tokenizers 0.22.2 (5.12.1 refuses
    # the image's 0.23.2: tokenizers<=0.23.0) and flashinfer 0.6.15.post1 (sgl_kernel's
    # rmsnorm and sglang's layernorm go through flashinfer.norm where it is importable).
    "0.5.17": {
        "transformers": "5.12.1",
        "tokenizers": "0.22.2",
        "flashinfer-python": "0.6.15.post1",
        "sglang-kernel": "0.4.5",
        "apache-tvm-ffi": "0.1.11",
        "xgrammar": "0.2.1",
        "sgl-deep-gemm": "0.1.5.post1",
    },
    # 0.5.9 pins torch 2.9.1 and sgl-kernel 0.3.21 (built for torch 2.9.1, which the
    # image lacks): it runs on the common sglang-kernel 0.4.2.post2 (same sgl_kernel
    # module), with the release's own switch SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK
    # (its check asks for the distribution sgl-kernel; the runner sets it for 0.5.9),
    # and flashinfer 0.6.7.post2, the build that runs on the image (0.5.9 pins 0.6.3).
    # transformers 4.57.1 is its pin; it refuses the image's huggingface-hub 1.x.
    "0.5.9": {
        "transformers": "4.57.1",
        "tokenizers": "0.22.2",
        "huggingface-hub": "0.36.0",
        "flashinfer-python": "0.6.7.post2",
    },
}

#: Environment a release's engines need beyond the common one (runner.py sets it).
#: 0.5.9 also imports names the image's sgl_kernel no longer has (kernel_gaps.py).
#: 0.5.17 loads FA3 from sglang-kernel only while SGLANG_USE_SGL_FA3_KERNEL is on (its
#: default); off, it first tries the `kernels` package's hub download, which the
#: offline image cannot reach. Set, so that no run depends on the default staying so.
RELEASE_ENV = {
    "0.5.9": {"SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK": "1", "PK_E2E_KERNEL_GAPS": "1"},
    "0.5.17": {"SGLANG_USE_SGL_FA3_KERNEL": "1"},
}

PIP_PLATFORM_FLAGS = [
    "--only-binary=:all:",
    "--python-version",
    "3.12",
    "--implementation",
    "cp",
    *[
        x
        for n in (
            "manylinux_2_28",
            "manylinux_2_27",
            "manylinux_2_24",
            "manylinux_2_17",
            "manylinux2014",
            "manylinux1",
            "manylinux_2_31",
            "manylinux_2_34",
            "manylinux_2_35",
        )
        for x in ("--platform", f"{n}_x86_64")
    ],
]


def normalise(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def wheel_cache() -> Path:
    from patchkit.fetch import cache_dir

    return cache_dir() / "gpu-wheels"


def all_pins(releases: Iterable[str]) -> dict[str, dict[str, str]]:
    """``{"common": {...}, release: {...}}``.

    A release may pin a common package its own way (0.5.13: sglang-kernel 0.4.3);
    the common group then keeps that package only if another release of the
    bundle uses the common pin (its site folder comes first on the path)."""
    releases = list(releases)
    for rel in releases:
        if rel not in RELEASE_PINS:
            raise SystemExit(f"unknown release {rel!r}; known: {', '.join(RELEASES + REFERENCE_RELEASES)}")
    own = {rel: {normalise(k) for k in RELEASE_PINS[rel]} for rel in releases}
    common = {k: v for k, v in COMMON_PINS.items() if not all(normalise(k) in own[rel] for rel in releases)}
    return {"common": common, **{rel: dict(RELEASE_PINS[rel]) for rel in releases}}


# ------------------------------------------------------------------ wheels


def find_wheel(folder: Path, dist: str, version: str) -> Optional[Path]:
    stem = normalise(dist).replace("-", "_")
    for path in folder.glob("*.whl"):
        name, ver = path.name.split("-")[:2]
        if normalise(name).replace("-", "_") == stem and ver == version:
            return path
    return None


def download_wheels(pins: dict[str, str], folder: Path) -> dict[str, Path]:
    """Every pinned wheel, from the cache or the registry (one ``pip download``)."""
    folder.mkdir(parents=True, exist_ok=True)
    missing = [f"{d}=={v}" for d, v in pins.items() if find_wheel(folder, d, v) is None]
    if missing:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            *PIP_PLATFORM_FLAGS,
            "-d",
            str(folder),
            *missing,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"pip download failed: {proc.stderr.strip()[-2000:]}")
    out = {}
    for dist, ver in pins.items():
        path = find_wheel(folder, dist, ver)
        if path is None:
            raise SystemExit(f"no wheel for {dist}=={ver} in {folder}")
        out[dist] = path
    return out


def keep_member(dist: str, name: str) -> bool:
    """Slimming rules: which members of a wheel go into the bundle."""
    d = normalise(dist)
    if name.split("/", 1)[0].endswith(".data"):
        return False  # scripts/headers of the .data folder: not importable code
    if d == "sglang-kernel":
        if name.startswith("sglang_kernel-") and ".dist-info/" in name:
            return True
        if not name.startswith("sgl_kernel/"):
            return False  # mscclpp, cmake, include/, lib/, triton_kernels
        if name.endswith(".py"):
            return True
        return name.startswith("sgl_kernel/sm90/") or name == "sgl_kernel/spatial_ops.abi3.so"
    if d == "xgrammar":
        # its static library and C++ headers (65 MB) serve C++ builds against it, not import
        return not name.startswith(("xgrammar/lib/", "xgrammar/include/"))
    return True


def installed_name(member: str) -> Optional[str]:
    """Where a wheel member lands in site-packages (``X.data/purelib/a`` -> ``a``)."""
    top, _, rest = member.partition("/")
    if top.endswith(".data"):
        kind, _, inner = rest.partition("/")
        return inner if kind in ("purelib", "platlib") and inner else None
    return member


def add_wheels_to_tar(tar: tarfile.TarFile, wheels: dict[str, Path]) -> dict[str, int]:
    """Unpack each wheel into the tar (as ``pip install --target`` lays it out)."""
    kept = {}
    seen: dict[str, str] = {}
    for dist, wheel in sorted(wheels.items()):
        n = 0
        with zipfile.ZipFile(wheel) as zf:
            for info in zf.infolist():
                name = installed_name(info.filename)
                if info.is_dir() or name is None or not keep_member(dist, name):
                    continue
                if name in seen:
                    raise SystemExit(f"{name} in both {seen[name]} and {dist}")
                seen[name] = dist
                data = zf.read(info)
                ti = tarfile.TarInfo(name)
                ti.size = len(data)
                ti.mode = 0o755 if ".so" in name else 0o644
                ti.mtime = 0
                tar.addfile(ti, io.BytesIO(data))
                n += len(data)
        kept[dist] = n
    return kept
