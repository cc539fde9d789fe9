"""Fetch real sglang release trees from the package registry into a local cache.

Tests, the demo, the matrix and the benchmark all work on real trees: a wheel is
a zip whose ``sglang/`` folder is the package. Nothing from sglang is ever
committed; trees live under ``$PATCHKIT_CACHE_DIR`` (``patchkit.settings.cache_dir``).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Optional

from patchkit import known_releases, lifetimes, settings
from patchkit.errors import PatchkitError
from patchkit.tree import Tree, base_release
from patchkit.versions import check_fetchable

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


def download_wheel(version: str, cache: Optional[Path] = None) -> Path:
    """The release's wheel in ``cache`` (patchkit's), downloaded where it is not there."""
    wheels = (cache or cache_dir()) / "wheels"
    settings.make_cache_folder(wheels)
    found = sorted(wheels.glob(f"sglang-{version}-*.whl"))
    if found:
        return found[0]
    return download_from_registry(version, wheels)


def download_from_registry(version: str, wheels: Path) -> Path:
    settings.make_cache_folder(wheels)
    # On a terminal pip draws its download progress (on stderr: stdout stays
    # patchkit's results); elsewhere it is quiet.
    shown = sys.stderr.isatty()
    with tempfile.TemporaryDirectory(dir=wheels) as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            *([] if shown else ["-q"]),
            *_WHEEL_FLAGS,
            f"sglang=={version}",
            "-d",
            tmp,
        ]
        proc = subprocess.run(
            cmd,
            stdout=sys.stderr if shown else subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            **lifetimes.in_child_process(),
        )  # pip dies with us
        got = sorted(Path(tmp).glob("sglang-*.whl"))
        if proc.returncode != 0 or not got:
            last = (proc.stderr.strip().splitlines() or ["no wheel"])[-1]
            raise PatchkitError(f"cannot download sglang=={version}: {last}")
        target = wheels / got[0].name
        os.replace(got[0], target)
        return target


def fetch_tree(version: str, say: Optional[Callable[[str], None]] = None, fallback: bool = True) -> Path:
    """Return the cached, pristine ``sglang/`` package folder of a release.

    Callers must copy it before changing anything (see ``copy_tree``). A
    cached wheel that is not a whole zip (cut short, damaged) is removed and
    downloaded again. Where patchkit's cache cannot be written (a read-only
    mount, no permission) a release it lacks goes to a temporary cache for
    this process, which ``say`` (else stderr) tells in one line; with
    ``fallback`` False that is refused in one line instead.
    """
    check_fetchable(version)
    for cache in [cache_dir(), *_TEMPORARY[:1]]:
        if (cache / "trees" / version / ".complete").exists():
            return cache / "trees" / version / "sglang"
    try:
        return _fetch_into(cache_dir(), version)
    except OSError as exc:
        if exc.errno not in _UNWRITABLE:
            raise
        if not fallback:
            raise PatchkitError(
                f"cannot write patchkit's cache {cache_dir()} ({_where(exc)}): set "
                "PATCHKIT_CACHE_DIR to a folder patchkit may write"
            ) from None
        temporary = _temporary_cache()
        (say or _note)(
            f"patchkit's cache {cache_dir()} cannot be written ({_where(exc)}): sglang {version} is "
            f"fetched into a temporary cache, {temporary}, removed when this command ends"
        )
        return _fetch_into(temporary, version)


# A cache that cannot be written, or made (HOME or PATCHKIT_CACHE_DIR missing,
# a file, under /proc): settings.make_cache_folder.
_UNWRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT, errno.ENOTDIR)


def _where(exc: OSError) -> str:
    return f"{exc.filename}: {exc.strerror}" if exc.filename else str(exc.strerror)


_TEMPORARY: list = []  # the temporary cache of this process, once made: [path, its owned_folder]


def _note(line: str) -> None:
    sys.stderr.write(f"patchkit: note: {line}\n")


def _temporary_cache() -> Path:
    if not _TEMPORARY:
        owned = lifetimes.owned_folder("patchkit-cache-")
        _TEMPORARY[:] = [owned.__enter__(), owned]
        atexit.register(owned.__exit__, None, None, None)
    return _TEMPORARY[0]


def _fetch_into(cache: Path, version: str) -> Path:
    dest = cache / "trees" / version
    package = dest / "sglang"
    if (dest / ".complete").exists():
        return package
    settings.make_cache_folder(dest.parent)
    # One fetch per release at a time: a second process (matrix -j, parallel
    # tests) waits, then finds it complete, instead of replacing the folder
    # under the first one's readers.
    with open(dest.parent / f".{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (dest / ".complete").exists():
            return package
        tmp = Path(tempfile.mkdtemp(dir=dest.parent))
        try:
            wheel = _wheel(version, cache)
            try:
                _extract(wheel, tmp)
            except _DAMAGED:  # cut short or damaged in the cache: fetched again, once
                with contextlib.suppress(OSError):  # a read-only cache's (see _wheel)
                    wheel.unlink()
                shutil.rmtree(tmp)
                wheel = download_from_registry(version, cache / "wheels")
                try:
                    _extract(wheel, tmp)
                except _DAMAGED as exc:
                    wheel.unlink()
                    raise PatchkitError(
                        f"the wheel of sglang {version} from the package registry is not a "
                        f"whole zip ({exc}); nothing was kept, run again to retry"
                    ) from None
            (tmp / ".complete").write_text(wheel.name)
            if dest.exists():  # an extraction a kill cut short
                shutil.rmtree(dest)
            os.replace(tmp, dest)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return package


def _wheel(version: str, cache: Path) -> Path:
    """The wheel to extract into ``cache``: from patchkit's own cache where it
    has it (read-only or not), else downloaded."""
    if cache == cache_dir():
        return download_wheel(version)  # the one-argument call (what tests stand in)
    found = sorted((cache_dir() / "wheels").glob(f"sglang-{version}-*.whl"))
    return found[0] if found else download_wheel(version, cache)


# What a zip that is not whole raises (no end record, a member cut short or
# with a bad CRC, a broken deflate stream).
_DAMAGED = (zipfile.BadZipFile, EOFError, zlib.error)


def _extract(wheel: Path, into: Path) -> None:
    into.mkdir(exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        members = [n for n in zf.namelist() if n.startswith("sglang/")]
        zf.extractall(into, members)


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
# Checked against its shipped hashes (``known_releases.shipped``): file -> sha256, None: no such file.
Shipped = Mapping[str, Optional[str]]


def pristine_source(
    release: Optional[str], rel: str, say: Callable[[str], None] = lambda line: None
) -> Optional[bytes]:
    """``rel`` as the sglang ``release`` (``Tree.release``) ships it, from
    patchkit's cache (an extracted tree, else a downloaded wheel); b"" when
    the cached release has no such file (all of it is the vendor's); None
    when the release (None: none) is not in the cache. Never downloads.

    Checked before use: a cached copy that the sha256 patchkit ships for the
    release contradicts (edited, cut short) is not used, and is removed from
    the cache (so that the next fetch extracts or downloads it again), which
    ``say`` tells; a wheel that is not a whole zip is removed too."""
    return None if release is None else _pristine(release, rel, known_releases.shipped(release), say)


def _pristine(release: str, rel: str, shipped: Shipped, say: Callable[[str], None]) -> Optional[bytes]:
    """``pristine_source`` with the release's ``shipped`` hashes in hand: a
    cached copy they contradict is not used, and its ``marker`` (a wheel, or
    the tree's completion mark) is removed."""
    for data, marker in _cached_copies(release, rel, say):
        if not _contradicts(shipped, rel, data):
            return data
        _remove(marker, f"patchkit's cached sglang {release} does not match the sha256 patchkit ships for {rel}", say)
    return None


def _cached_copies(release: str, rel: str, say: Callable[[str], None]) -> Iterator[tuple[bytes, Path]]:
    """``rel`` as each copy of ``release`` in patchkit's cache has it (b"":
    the copy has no such file), cheapest first (the extracted tree, then
    each wheel), with the file whose removal drops that copy from the cache.
    A wheel that is not a whole zip is removed as it is met."""
    cache = cache_dir()
    tree = cache / "trees" / release
    if (tree / ".complete").exists():
        try:
            data: Optional[bytes] = (tree / "sglang" / rel).read_bytes()
        except FileNotFoundError:
            data = b""
        except OSError:
            data = None
        if data is not None:
            yield data, tree / ".complete"
    for wheel in sorted((cache / "wheels").glob(f"sglang-{release}-*.whl")):
        try:
            with zipfile.ZipFile(wheel) as zf:
                try:
                    data = zf.read(f"sglang/{rel}")
                except KeyError:
                    data = b""
        except _DAMAGED:
            _remove(wheel, f"patchkit's cached {wheel.name} is not a whole zip", say)
            continue
        except OSError:
            continue
        yield data, wheel


def _as_shipped(shipped: Shipped, rel: str, data: bytes) -> Optional[bytes]:
    """What the release ships as ``rel``, by its ``shipped`` hashes: ``data``
    where its sha256 is the shipped one, b"" where the release has no such
    file; None where they do not know the file, or ``data`` is other bytes."""
    sha = shipped.get(rel, "")
    if sha is None:
        return b""
    return data if sha and hashlib.sha256(data).hexdigest() == sha else None


def _contradicts(shipped: Shipped, rel: str, data: bytes) -> bool:
    """Whether the ``shipped`` hashes say ``data`` is *not* the release's
    ``rel`` (b"": absent): a cached release edited, cut short or mixed up."""
    return rel in shipped and _as_shipped(shipped, rel, data) != data


def _remove(path: Path, why: str, say: Callable[[str], None]) -> None:
    try:
        path.unlink(missing_ok=True)
        say(f"{why}: not used, and removed from the cache ({path.parent}) to be fetched again")
    except OSError as exc:
        say(f"{why}: not used (the cache cannot be changed: {exc.strerror})")


def release_file(release: str, rel: str) -> Optional[bytes]:
    """``rel`` as the sglang ``release`` wheel ships it, the wheel fetched from
    the package registry where patchkit's cache lacks it; None where the
    release cannot be had or has no such file."""
    try:
        return (fetch_tree(release) / rel).read_bytes()
    except (PatchkitError, OSError):
        return None


def release_sources(
    tree: Tree,
    files: Iterable[str],
    sources: Optional[Mapping[str, bytes]] = None,
    download: bool = False,
    accept_risk: bool = False,
    say: Callable[[str], None] = lambda line: None,
) -> dict[str, Optional[bytes]]:
    """The fetch step of apply, revert and export, before any transform: each
    of ``files`` as the ``tree``'s release ships it (the vendor-code check
    compares against these bytes). A file whose bytes (``sources``) match the
    shipped hashes is its own release bytes; else patchkit's cache gives them.
    ``download`` (apply): what neither has comes from the package registry,
    and a release that cannot be had refuses the run in one line, unless
    ``accept_risk`` (then nothing is downloaded and those files go unchecked:
    None, which the transform's notes say)."""
    sources, files = sources or {}, list(files)
    version, release = tree.version, tree.release
    if release is None:
        if download and not accept_risk and files and version and version != "unknown":
            raise PatchkitError(
                f"cannot run the vendor-code check: sglang {version!r} names no release to compare with; "
                f"nothing was changed ({RISK_FLAG} to apply without the check)"
            )
        return dict.fromkeys(files)
    if release != version and files:
        say(f"the vendor-code check compares with sglang {release}: {version} is a local build of that release")
    shipped = known_releases.shipped(release)  # read once, checked here
    out: dict[str, Optional[bytes]] = {}
    for rel in files:
        known = _as_shipped(shipped, rel, sources[rel]) if rel in sources else None
        out[rel] = known if known is not None else _pristine(release, rel, shipped, say)
    missing = [rel for rel, data in out.items() if data is None]
    if not missing or not download or accept_risk:
        return out
    say(
        f"fetching sglang {release} from the package registry for the vendor-code check "
        f"({len(missing)} file(s) differ from the release)"
    )
    try:
        package = fetch_tree(release, say)
    except PatchkitError as exc:
        raise PatchkitError(
            f"cannot run the vendor-code check: {exc}; nothing was changed "
            f"(`patchkit fetch {release}` when online, or {RISK_FLAG} to apply without the check)"
        ) from None
    for rel in missing:
        try:
            data = (package / rel).read_bytes()
        except FileNotFoundError:
            data = b""  # the release has no such file: all of it is the vendor's
        out[rel] = data
        if _contradicts(shipped, rel, data):  # a cache that could not be set right
            raise PatchkitError(
                f"cannot run the vendor-code check: {package / rel} is not sglang {release}'s {rel} (not the "
                f"sha256 patchkit ships); nothing was changed (remove {package.parent} and run again)"
            )
    return out


RISK_FLAG = "--accept-vendor-code-risk"


def release_note(version: str, risk: bool = False) -> str:
    if risk and base_release(version) is None:
        return (
            f"note: the vendor-code check was skipped ({RISK_FLAG}): sglang {version!r} names no release to "
            "compare with, so code your fork added to the patched files was not checked to survive"
        )
    version = base_release(version) or version
    if risk:
        return (
            f"note: the vendor-code check was skipped ({RISK_FLAG}): sglang {version} was not downloaded, "
            "so code your fork added to the patched files was not checked to survive"
        )
    return (
        f"note: the vendor-code check was skipped: sglang {version} is not in patchkit's cache "
        f"(`patchkit fetch {version}` puts it there; code a fork added is then checked to survive)"
    )
