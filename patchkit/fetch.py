"""Fetch real sglang release trees from the package registry into a local cache.

Tests, the demo, the matrix and the benchmark all work on real trees: a wheel is
a zip whose ``sglang/`` folder is the package. Nothing from sglang is ever
committed; trees live under ``$PATCHKIT_CACHE_DIR`` (``patchkit.settings.cache_dir``).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional

from patchkit import lifetimes, settings
from patchkit.errors import PatchkitError
from patchkit.tree import base_release

# Pure-Python parts are identical across platforms; pin one wheel flavour so the
# download works from any host.
_WHEEL_FLAGS = [
    "--no-deps",
    "--only-binary",
    ":all:",
    "--python-version",
    "3.11",
    "--platform",
    "manylinux_2_34_x86_64",
]


def cache_dir() -> Path:
    return settings.cache_dir()


def download_wheel(version: str) -> Path:
    wheels = cache_dir() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob(f"sglang-{version}-*.whl"))
    if found:
        return found[0]
    # On a terminal pip draws its download progress (on stderr: stdout stays
    # patchkit's results); elsewhere it is quiet.
    shown = sys.stderr.isatty()
    with tempfile.TemporaryDirectory(dir=wheels) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", *([] if shown else ["-q"]), *_WHEEL_FLAGS,
               f"sglang=={version}", "-d", tmp]
        proc = subprocess.run(cmd, stdout=sys.stderr if shown else subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              **lifetimes.in_child_process())  # pip dies with us
        got = sorted(Path(tmp).glob("sglang-*.whl"))
        if proc.returncode != 0 or not got:
            last = (proc.stderr.strip().splitlines() or ["no wheel"])[-1]
            raise PatchkitError(f"cannot download sglang=={version}: {last}")
        target = wheels / got[0].name
        os.replace(got[0], target)
        return target


def fetch_tree(version: str) -> Path:
    """Return the cached, pristine ``sglang/`` package folder of a release.

    Callers must copy it before changing anything (see ``copy_tree``).
    """
    dest = cache_dir() / "trees" / version
    package = dest / "sglang"
    if (dest / ".complete").exists():
        return package
    dest.parent.mkdir(parents=True, exist_ok=True)
    # One fetch per release at a time: a second process (matrix -j, parallel
    # tests) waits, then finds it complete, instead of replacing the folder
    # under the first one's readers.
    with open(dest.parent / f".{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (dest / ".complete").exists():
            return package
        wheel = download_wheel(version)
        tmp = Path(tempfile.mkdtemp(dir=dest.parent))
        try:
            with zipfile.ZipFile(wheel) as zf:
                members = [n for n in zf.namelist() if n.startswith("sglang/")]
                zf.extractall(tmp, members)
            (tmp / ".complete").write_text(wheel.name)
            if dest.exists():  # an extraction a kill cut short
                shutil.rmtree(dest)
            os.replace(tmp, dest)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return package


def copy_tree(version: str, target: Path, layout: str = "package") -> Path:
    """Copy a release into ``target`` in one of the accepted layouts.

    layout: ``package`` (target/sglang), ``python`` (target/python/sglang, returns
    target/python) or ``checkout`` (target/python/sglang, returns target).
    Returns the path a user would pass to patchkit.
    """
    src = fetch_tree(version)
    if layout == "package":
        shutil.copytree(src, target / "sglang")
        return target / "sglang"
    shutil.copytree(src, target / "python" / "sglang")
    return target / "python" if layout == "python" else target


# -- a release's bytes, from the cache only (the vendor-code check) ---------------------


def pristine_source(version: str, rel: str) -> Optional[bytes]:
    """``rel`` as the sglang ``version`` release ships it, from patchkit's cache
    (an extracted tree, else a downloaded wheel); b"" when the cached release
    has no such file (all of it is the vendor's); None when the release is not
    in the cache (or the version names no release). A local version
    (``0.5.11+acme``) reads its base release. Never downloads."""
    version = base_release(version)
    if version is None:
        return None
    cache = cache_dir()
    tree = cache / "trees" / version
    if (tree / ".complete").exists():
        try:
            return (tree / "sglang" / rel).read_bytes()
        except FileNotFoundError:
            return b""
        except OSError:
            return None
    for wheel in sorted((cache / "wheels").glob(f"sglang-{version}-*.whl")):
        try:
            with zipfile.ZipFile(wheel) as zf:
                try:
                    return zf.read(f"sglang/{rel}")
                except KeyError:
                    return b""
        except (OSError, zipfile.BadZipFile):
            continue
    return None


def release_file(version: str, rel: str) -> Optional[bytes]:
    """``rel`` as the sglang ``version`` wheel ships it, the wheel fetched
    from the package registry where patchkit's cache lacks it; None where the
    release cannot be had or has no such file (a local version: its base release's)."""
    release = base_release(version)
    if release is None:
        return None
    try:
        return (fetch_tree(release) / rel).read_bytes()
    except (PatchkitError, OSError):
        return None


def release_sources(version: str, files: Iterable[str], sources: Optional[Mapping[str, bytes]] = None,
                    download: bool = False, accept_risk: bool = False,
                    say: Callable[[str], None] = lambda line: None) -> dict[str, Optional[bytes]]:
    """The fetch step of apply, revert and export, before any transform: each
    of ``files`` as the release ``version`` ships it (the vendor-code check
    compares against these bytes). A file whose bytes (``sources``) match the
    shipped hashes is its own release bytes; else patchkit's cache gives them.
    ``download`` (apply): what neither has comes from the package registry,
    and a release that cannot be had refuses the run in one line, unless
    ``accept_risk`` (then nothing is downloaded and those files go unchecked:
    None, which the transform's notes say)."""
    from patchkit import known_releases

    sources = sources or {}
    files = list(files)
    release = base_release(version)
    if release is None:
        if download and not accept_risk and files and version and version != "unknown":
            raise PatchkitError(
                f"cannot run the vendor-code check: sglang {version!r} names no release to compare with; "
                f"nothing was changed ({RISK_FLAG} to apply without the check)")
        return dict.fromkeys(files)
    if release != version and files:
        say(f"the vendor-code check compares with sglang {release}: {version} is a local build of that release")
    out: dict[str, Optional[bytes]] = {}
    for rel in files:
        known = known_releases.release_bytes(release, rel, sources[rel]) if rel in sources else None
        out[rel] = known if known is not None else pristine_source(release, rel)
    missing = [rel for rel, data in out.items() if data is None]
    if not missing or not download or accept_risk:
        return out
    say(f"fetching sglang {release} from the package registry for the vendor-code check "
        f"({len(missing)} file(s) differ from the release)")
    try:
        package = fetch_tree(release)
    except PatchkitError as exc:
        raise PatchkitError(
            f"cannot run the vendor-code check: {exc}; nothing was changed "
            f"(`patchkit fetch {release}` when online, or {RISK_FLAG} to apply without the check)") from None
    for rel in missing:
        try:
            out[rel] = (package / rel).read_bytes()
        except FileNotFoundError:
            out[rel] = b""  # the release has no such file: all of it is the vendor's
    return out


RISK_FLAG = "--accept-vendor-code-risk"


def release_note(version: str, risk: bool = False) -> str:
    if risk and base_release(version) is None:
        return (f"note: the vendor-code check was skipped ({RISK_FLAG}): sglang {version!r} names no release to "
                "compare with, so code your fork added to the patched files was not checked to survive")
    version = base_release(version) or version
    if risk:
        return (f"note: the vendor-code check was skipped ({RISK_FLAG}): sglang {version} was not downloaded, "
                "so code your fork added to the patched files was not checked to survive")
    return (f"note: the vendor-code check was skipped: sglang {version} is not in patchkit's cache "
            f"(`patchkit fetch {version}` puts it there; code a fork added is then checked to survive)")


def is_release(version: str) -> bool:
    return base_release(version) is not None
