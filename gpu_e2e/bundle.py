"""Build the GPU bundle (host side, no GPU): everything a bare GPU machine lacks.

Layout of the bundle folder (at most 64 MiB; the device tool carries it):

    manifest.json                 releases, pins, runtime mode, sizes, sha256 of every file
    site/common.tar.gz            unpacked wheels shared by every release
    site/<release>.tar.gz         unpacked wheels pinned per release (transformers, ...)
    trees/<release>/pristine.tar.gz   the release's sglang/ package, as published
    trees/<release>/overlay.tar.gz    the files `patchkit apply` changed or added
    trees/<release>/overlay.json      their sha256 (checked on the GPU after unpacking)
    runtime/patchkit/...          only when the patched tree imports patchkit.runtime /
                                  patchkit.backends (package mode); absent once the tree
                                  carries its vendored runtime
    e2e/pk_gpu_e2e/...            this package (GPU side: orchestrate, runner, syncs)
    e2e/sitecustomize.py          installs the sync counter where PK_E2E_SYNC_DIR is set

The patched tree is made here by this checkout's own ``patchkit apply`` (CLI, in a
subprocess), then ``patchkit verify``; the bundle keeps only the difference.

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

import ast
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Iterable, Optional

MIB = 1024 * 1024
LIMIT_BYTES = 64 * MIB
PKG_NAME = "pk_gpu_e2e"

#: Releases this bundle knows how to run, patched against pristine.
RELEASES = ("0.5.12.post1", "0.5.10")
#: Releases carried as they are: the upstream reference of what sync-free means
#: (issue 23 compares a patched 0.5.12.post1's sync table with 0.5.13's).
REFERENCE_RELEASES = ("0.5.13",)

#: What the GPU image ('cuda', python 3.12) already holds (device KINDS.md list,
#: normalised distribution names). Anything the Engine path imports beyond this and
#: the standard library must be in the bundle.
IMAGE_PACKAGES = frozenset("""
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
""".split())

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
}

PIP_PLATFORM_FLAGS = [
    "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
    *[x for n in ("manylinux_2_28", "manylinux_2_27", "manylinux_2_24", "manylinux_2_17",
                  "manylinux2014", "manylinux1", "manylinux_2_31", "manylinux_2_34",
                  "manylinux_2_35")
      for x in ("--platform", f"{n}_x86_64")],
]


def normalise(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def repo_root() -> Path:
    return Path(__file__).resolve().parents[1]


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
    common = {k: v for k, v in COMMON_PINS.items()
              if not all(normalise(k) in own[rel] for rel in releases)}
    return {"common": common, **{rel: dict(RELEASE_PINS[rel]) for rel in releases}}


# ------------------------------------------------------------------ wheels

def _find_wheel(folder: Path, dist: str, version: str) -> Optional[Path]:
    stem = normalise(dist).replace("-", "_")
    for path in folder.glob("*.whl"):
        name, ver = path.name.split("-")[:2]
        if normalise(name).replace("-", "_") == stem and ver == version:
            return path
    return None


def download_wheels(pins: dict[str, str], folder: Path) -> dict[str, Path]:
    """Every pinned wheel, from the cache or the registry (one ``pip download``)."""
    folder.mkdir(parents=True, exist_ok=True)
    missing = [f"{d}=={v}" for d, v in pins.items() if _find_wheel(folder, d, v) is None]
    if missing:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps",
               *PIP_PLATFORM_FLAGS, "-d", str(folder), *missing]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"pip download failed: {proc.stderr.strip()[-2000:]}")
    out = {}
    for dist, ver in pins.items():
        path = _find_wheel(folder, dist, ver)
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


# ------------------------------------------------------------------ trees

def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _files(root: Path) -> dict[str, Path]:
    out = {}
    for path in root.rglob("*"):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(".patchkit/") or rel == ".patchkit" or "__pycache__" in rel:
            continue
        if path.is_file():
            out[rel] = path
    return out


def patchkit_cli(*args: str, cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
    """This checkout's ``patchkit`` CLI (``python -m patchkit``), whatever is installed."""
    env = dict(os.environ)
    root = str(repo_root())
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "patchkit", *args], capture_output=True,
                          text=True, env=env, cwd=cwd)


def patched_tree(release: str, work: Path, skip: Iterable[str] = ()) -> tuple[Path, Path, str]:
    """(pristine package dir, patched package dir, apply+verify output); ``skip``:
    patches left out (a "minus" variant, to measure what they add)."""
    from patchkit.fetch import fetch_tree

    pristine = fetch_tree(release)
    dest = work / release / "-".join(["sglang", *skip]) / "sglang"
    if dest.parent.exists():
        shutil.rmtree(dest.parent)
    shutil.copytree(pristine, dest)
    applied = patchkit_cli("apply", str(dest), *[a for pid in skip for a in ("--skip", pid)])
    if applied.returncode != 0:
        raise SystemExit(f"patchkit apply {release} failed:\n{applied.stdout}{applied.stderr}")
    from patchkit import registry

    applied_ids = [p.id for p in registry.select([], skip=skip)] if skip else []
    verified = patchkit_cli("verify", str(dest), *applied_ids)
    if verified.returncode != 0:
        raise SystemExit(f"patchkit verify {release} failed:\n{verified.stdout}{verified.stderr}")
    return pristine, dest, applied.stdout + verified.stdout


def overlay(pristine: Path, patched: Path) -> tuple[dict[str, str], list[str]]:
    """Files of ``patched`` that differ from / are absent in ``pristine`` (rel -> sha256)."""
    a, b = _files(pristine), _files(patched)
    changed = {rel: _sha256(p) for rel, p in sorted(b.items())
               if rel not in a or a[rel].read_bytes() != p.read_bytes()}
    removed = sorted(set(a) - set(b))
    return changed, removed


def imports_patchkit(patched: Path, rels: Iterable[str]) -> list[str]:
    """Modules under ``patchkit.`` that the changed files import (package mode)."""
    found = set()
    for rel in rels:
        if not rel.endswith(".py"):
            continue
        tree = ast.parse((patched / rel).read_bytes())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module == "patchkit" or node.module.startswith("patchkit."):
                    found.add(node.module)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == "patchkit" or alias.name.startswith("patchkit."):
                        found.add(alias.name)
    return sorted(found)


def _tar_dir(out: Path, root: Path, arcroot: str, rels: Optional[Iterable[str]] = None) -> None:
    with tarfile.open(out, "w:gz", compresslevel=9) as tar:
        names = sorted(rels) if rels is not None else sorted(_files(root))
        for rel in names:
            tar.add(root / rel, arcname=f"{arcroot}/{rel}", recursive=False)


# ------------------------------------------------------------------ bundle

def copy_e2e_package(dest: Path) -> None:
    here = Path(__file__).resolve().parent
    pkg = dest / "e2e" / PKG_NAME
    pkg.mkdir(parents=True, exist_ok=True)
    for src in sorted(here.glob("*.py")):
        shutil.copy2(src, pkg / src.name)
    shutil.copy2(here / "sitecustomize.py.in", dest / "e2e" / "sitecustomize.py")


def copy_runtime(dest: Path) -> list[str]:
    """patchkit/__init__.py + runtime/ + backends/ (package mode only)."""
    src = repo_root() / "patchkit"
    out = dest / "runtime" / "patchkit"
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src / "__init__.py", out / "__init__.py")
    copied = ["patchkit/__init__.py"]
    for sub in ("runtime", "backends"):
        for path in sorted((src / sub).glob("*.py")):
            (out / sub).mkdir(exist_ok=True)
            shutil.copy2(path, out / sub / path.name)
            copied.append(f"patchkit/{sub}/{path.name}")
    return copied


def _add_reference_tree(dest: Path, release: str, manifest: dict) -> None:
    from patchkit.fetch import fetch_tree

    tdir = dest / "trees" / release
    tdir.mkdir(parents=True)
    _tar_dir(tdir / "pristine.tar.gz", fetch_tree(release), "sglang")
    manifest["releases"][release] = {"runtime_mode": "upstream", "reference": True}


def _git_head() -> Optional[str]:
    """This checkout's commit (``+dirty`` when tracked files differ), or None."""
    root = str(repo_root())
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "-uno"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + ("+dirty" if dirty else "")) or None


def folder_size(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def build(dest: Path, releases: Iterable[str] = ("0.5.12.post1",), *,
          limit: int = LIMIT_BYTES, log=print, minus: Iterable[str] = ()) -> dict:
    """``minus``: patch ids; each adds a tree "minus-ID" (every patch but that
    one) beside "patched", as ``overlay-minus-ID.tar.gz``: the orchestrator
    then measures that patch's own effect side by side."""
    releases, minus = list(releases), list(minus)
    dest = Path(dest)
    pins = all_pins(releases)
    if dest.exists():
        for child in dest.iterdir():  # keep the folder itself (git exclude entry)
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    dest.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    manifest: dict = {"releases": {}, "pins": pins, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                      "patchkit_commit": _git_head()}

    (dest / "site").mkdir()
    for group, group_pins in pins.items():
        wheels = download_wheels(group_pins, wheel_cache())
        with tarfile.open(dest / "site" / f"{group}.tar.gz", "w:gz", compresslevel=9) as tar:
            kept = add_wheels_to_tar(tar, wheels)
        manifest.setdefault("site_bytes", {})[group] = kept
        log(f"site/{group}.tar.gz: {len(wheels)} wheels")

    runtime_modes = set()
    with tempfile.TemporaryDirectory(prefix="pk-gpu-bundle-") as tmp:
        for rel in releases:
            if rel in REFERENCE_RELEASES:
                _add_reference_tree(dest, rel, manifest)
                log(f"trees/{rel}: upstream tree, carried as published (the reference)")
                continue
            pristine, patched, out = patched_tree(rel, Path(tmp))
            changed, removed = overlay(pristine, patched)
            if removed:
                raise SystemExit(f"patchkit removed files from {rel}: {removed}")
            mods = imports_patchkit(patched, changed)
            mode = "package" if mods else "vendored"
            runtime_modes.add(mode)
            tdir = dest / "trees" / rel
            tdir.mkdir(parents=True)
            _tar_dir(tdir / "pristine.tar.gz", pristine, "sglang")
            _tar_dir(tdir / "overlay.tar.gz", patched, "sglang", changed)
            (tdir / "overlay.json").write_text(json.dumps(changed, indent=1, sort_keys=True) + "\n")
            for pid in minus:
                _, without, _ = patched_tree(rel, Path(tmp), skip=[pid])
                part, _ = overlay(pristine, without)
                _tar_dir(tdir / f"overlay-minus-{pid}.tar.gz", without, "sglang", part)
                (tdir / f"overlay-minus-{pid}.json").write_text(json.dumps(part, indent=1, sort_keys=True) + "\n")
                log(f"trees/{rel}: minus-{pid}: {len(part)} changed file(s)")
            manifest["releases"][rel] = {
                "runtime_mode": mode,
                "patchkit_imports": mods,
                "changed_files": sorted(changed),
                "minus": minus,
                "patchkit_output": out,
            }
            log(f"trees/{rel}: {len(changed)} changed file(s), runtime mode: {mode}")
    if "package" in runtime_modes:
        manifest["runtime_files"] = copy_runtime(dest)
    copy_e2e_package(dest)

    files = {p.relative_to(dest).as_posix(): p for p in sorted(dest.rglob("*")) if p.is_file()}
    manifest["files"] = {rel: {"bytes": p.stat().st_size, "sha256": _sha256(p)} for rel, p in files.items()}
    total = folder_size(dest)
    manifest["total_bytes"] = total
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    total = folder_size(dest)
    log(f"bundle {dest}: {total / MIB:.1f} MiB in {time.perf_counter() - t0:.0f} s")
    if total > limit:
        raise SystemExit(f"bundle is {total / MIB:.1f} MiB, over the {limit / MIB:.0f} MiB limit")
    return manifest
