"""Build the GPU bundle (host side, no GPU): everything a bare GPU machine lacks.

Layout of the bundle folder (at most 64 MiB; the device tool carries it):

    manifest.json                 releases, pins, runtime mode, sizes, sha256 of every file
    site/common.tar.xz            unpacked wheels shared by every release
    site/<release>.tar.xz         unpacked wheels pinned per release (transformers, ...)
                                  (xz: a third smaller than gzip, so a release with its
                                  own flashinfer and transformers fits beside the checkout)
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

The wheels it carries: ``wheels.py``.
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
from collections.abc import Iterable
from pathlib import Path
from typing import Optional

from .wheels import (
    COMMON_PINS,
    RELEASE_ENV,
    RELEASES,
    add_wheels_to_tar,
    all_pins,
    download_wheels,
    wheel_cache,
)

MIB = 1024 * 1024
LIMIT_BYTES = 64 * MIB
PKG_NAME = "pk_gpu_e2e"


def repo_root() -> Path:
    return Path(__file__).resolve().parents[1]


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
    return subprocess.run([sys.executable, "-m", "patchkit", *args], capture_output=True, text=True, env=env, cwd=cwd)


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


def earlier_patched_tree(release: str, work: Path, name: str, commit: str) -> tuple[Path, str]:
    """(patched package dir, apply+verify output) as patchkit at ``commit`` writes it: a
    variant ``name`` that shows what later commits changed in the patched tree (issue
    42: the patched tree with and without upstream's later fixes). That patchkit runs
    from ``git archive`` of the commit, with a transform cache of its own (an earlier
    patchkit may key its cache by its version alone) over the same fetched releases."""
    from patchkit.fetch import cache_dir, fetch_tree

    src = work / f"patchkit-{name}"
    src.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(repo_root()), "archive", commit], capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"git archive {commit}: {archive.stderr.decode().strip()}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(src, filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(src)
    cache = work / f"cache-{name}"
    cache.mkdir()
    for shared in ("wheels", "trees"):
        (cache / shared).symlink_to(cache_dir() / shared)
    pristine = fetch_tree(release)
    dest = work / release / f"sglang-{name}" / "sglang"
    shutil.copytree(pristine, dest)
    env = dict(os.environ, PYTHONPATH=str(src), PATCHKIT_CACHE_DIR=str(cache))
    outputs = []
    for args in (("apply", str(dest)), ("verify", str(dest))):
        done = subprocess.run(
            [sys.executable, "-m", "patchkit", *args], capture_output=True, text=True, env=env, cwd=src
        )
        if done.returncode != 0:
            raise SystemExit(f"patchkit {args[0]} at {commit} on {release} failed:\n{done.stdout}{done.stderr}")
        outputs.append(done.stdout)
    return dest, "".join(outputs)


def overlay(pristine: Path, patched: Path) -> tuple[dict[str, str], list[str]]:
    """Files of ``patched`` that differ from / are absent in ``pristine`` (rel -> sha256)."""
    a, b = _files(pristine), _files(patched)
    changed = {rel: _sha256(p) for rel, p in sorted(b.items()) if rel not in a or a[rel].read_bytes() != p.read_bytes()}
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


#: The image's Python. The cached trees are the releases' cp311 wheels; an extension
#: module built for another Python (0.5.17's Rust server, gRPC and multimodal cores,
#: 23 MB, none on the Engine path) cannot load there, so a reference tree leaves it out.
IMAGE_EXTENSION_TAG = ".cpython-312-"


def loads_on_image(rel: str) -> bool:
    return not (rel.endswith(".so") and ".cpython-" in rel and IMAGE_EXTENSION_TAG not in rel)


def _add_reference_tree(dest: Path, release: str, manifest: dict) -> None:
    from patchkit.fetch import fetch_tree

    tdir = dest / "trees" / release
    tdir.mkdir(parents=True)
    tree = fetch_tree(release)
    rels = sorted(_files(tree))
    _tar_dir(tdir / "pristine.tar.gz", tree, "sglang", [r for r in rels if loads_on_image(r)])
    manifest["releases"][release] = {
        "runtime_mode": "upstream",
        "reference": True,
        "env": RELEASE_ENV.get(release, {}),
        "left_out": [r for r in rels if not loads_on_image(r)],
    }


def _git_head() -> Optional[str]:
    """This checkout's commit (``+dirty`` when tracked files differ), or None."""
    root = str(repo_root())
    try:
        head = subprocess.run(
            ["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", root, "status", "--porcelain", "-uno"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + ("+dirty" if dirty else "")) or None


def folder_size(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def carried(releases: Iterable[str], reference: Iterable[str]) -> tuple[list[str], list[str]]:
    """(releases carried pristine and patched, releases carried as published). A release
    patchkit only measures against (0.5.17: its patches are native or partial there, and
    the yardstick is upstream's own tree) is carried as published even when named as a
    release, so ``bundle --release 0.5.17`` builds issue 57's yardstick bundle."""
    patched = [r for r in releases if r in RELEASES]
    published = list(dict.fromkeys([*reference, *(r for r in releases if r not in RELEASES)]))
    return patched, published


def build(
    dest: Path,
    releases: Iterable[str] = ("0.5.12.post1",),
    *,
    limit: int = LIMIT_BYTES,
    log=print,
    minus: Iterable[str] = (),
    kernels: Iterable[str] = (),
    extra_wheels: Iterable[str] = (),
    reference: Iterable[str] = (),
    earlier: Optional[dict[str, str]] = None,
    site_compression: str = "xz",
    reuse_site: Optional[Path] = None,
) -> dict:
    """``minus``: patch ids; each adds a tree "minus-ID" (every patch but that
    one) beside "patched", as ``overlay-minus-ID.tar.gz``: the orchestrator
    then measures that patch's own effect side by side. ``earlier``: {name:
    commit}; each adds a tree "name", patched by patchkit at that commit
    (``overlay-name.tar.gz``). ``reference``: releases carried as published.
    ``site_compression``: "xz" (a third smaller) or "gz" (minutes faster to build).
    ``reuse_site``: an earlier bundle whose site tars of the same pins are copied, not
    rebuilt (compressing them takes minutes; a rebuild after a codemod change needs none)."""
    if site_compression not in ("xz", "gz"):
        raise SystemExit(f"site compression {site_compression!r}: xz or gz")
    reference, earlier = list(reference), dict(earlier or {})
    releases, minus = list(releases) + [r for r in reference if r not in releases], list(minus)
    dest = Path(dest)
    pins = all_pins(releases)
    if dest.exists():
        for child in dest.iterdir():  # keep the folder itself (git exclude entry)
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    dest.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    manifest: dict = {
        "releases": {},
        "pins": pins,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "patchkit_commit": _git_head(),
    }

    (dest / "site").mkdir()
    earlier_site = json.loads((reuse_site / "manifest.json").read_text()) if reuse_site else {}
    for group, group_pins in pins.items():
        wheels = download_wheels(group_pins, wheel_cache())
        name = dest / "site" / f"{group}.tar.{site_compression}"
        if (
            reuse_site is not None
            and earlier_site.get("pins", {}).get(group) == group_pins
            and (reuse_site / "site" / name.name).exists()
        ):
            shutil.copy2(reuse_site / "site" / name.name, name)
            manifest.setdefault("site_bytes", {})[group] = earlier_site["site_bytes"][group]
            log(f"site/{name.name}: copied from {reuse_site} (same pins)")
            continue
        options = {"preset": 9} if site_compression == "xz" else {"compresslevel": 9}
        with tarfile.open(name, f"w:{site_compression}", **options) as tar:  # type: ignore[call-overload]
            kept = add_wheels_to_tar(tar, wheels)
        manifest.setdefault("site_bytes", {})[group] = kept
        log(f"site/{name.name}: {len(wheels)} wheels")
    kernels = list(kernels)
    if kernels:  # issue 44: FlashMLA's library, which the slimmed sglang-kernel leaves out
        from .bundle_kernels import add as add_kernels

        kernel_wheel = download_wheels({"sglang-kernel": COMMON_PINS["sglang-kernel"]}, wheel_cache())
        manifest["kernels"] = add_kernels(dest, kernel_wheel["sglang-kernel"], kernels)
        log(f"kernels/: {', '.join(manifest['kernels'])}")
    extra_wheels = list(extra_wheels)
    if extra_wheels:  # issue 72: deep_gemm for DeepSeek sparse attention's indexer
        from .bundle_kernels import WHEELS, add_wheels

        got = download_wheels({n: WHEELS[n] for n in extra_wheels if n in WHEELS}, wheel_cache())
        manifest["wheels"] = add_wheels(dest, {n: got.get(n, Path(n)) for n in extra_wheels})
        log(f"kernels/: wheels {', '.join(manifest['wheels'])}")

    runtime_modes = set()
    with tempfile.TemporaryDirectory(prefix="pk-gpu-bundle-") as tmp:
        for rel in releases:
            if rel in reference:
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
            for earlier_name, commit in earlier.items():
                older, out_older = earlier_patched_tree(rel, Path(tmp), earlier_name, commit)
                part, gone = overlay(pristine, older)
                if gone:
                    raise SystemExit(f"patchkit at {commit} removed files from {rel}: {gone}")
                _tar_dir(tdir / f"overlay-{earlier_name}.tar.gz", older, "sglang", part)
                (tdir / f"overlay-{earlier_name}.json").write_text(json.dumps(part, indent=1, sort_keys=True) + "\n")
                log(f"trees/{rel}: {earlier_name} (patchkit at {commit}): {len(part)} changed file(s)")
            manifest["releases"][rel] = {
                "earlier": earlier,
                "env": RELEASE_ENV.get(rel, {}),
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
