"""patchkit's cache is checked before use (issue 54, failures 4 and 6): a
cached release file that the shipped sha256 (known_releases.json)
contradicts is not used, and is fetched again; a wheel cut short is removed
and downloaded again; a read-only cache works read-only, and a release it
lacks goes to a temporary cache, said in one line.

Each test has a cache of its own (hard links to the real cache's files;
what a test changes there it replaces, never writes in place) and a stand-in
for the package registry that serves a small wheel built from the real
release."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from support import PRIMARY, linked_copy

from patchkit import fetch

pytestmark = pytest.mark.trees

BATCH = "srt/managers/schedule_batch.py"
EAGER_SUM = "self.seq_lens_sum = self.seq_lens.sum().item()"
MHA = "srt/layers/attention/trtllm_mha_backend.py"
HOOK = "trtllm-mha-overlap-hook"


def small_wheel(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for rel, data in files.items():
            zf.writestr(f"sglang/{rel}", data)
    return path


def _fork(tree: Path, rel: str, anchor: str, text: str) -> None:
    source = (tree / rel).read_text()
    at = source.index(anchor) + len(anchor)
    (tree / rel).unlink()  # a linked tree: a new file, the cache's keeps its bytes
    (tree / rel).write_text(source[:at] + text + source[at:])


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache of the test's own (the transform cache stays the shared
    one: only the release cache is under test)."""
    from patchkit import settings

    monkeypatch.setenv("PATCHKIT_TRANSFORM_CACHE", str(settings.transform_cache_dir() or "off"))
    folder = tmp_path / "cache"
    folder.mkdir()
    monkeypatch.setenv("PATCHKIT_CACHE_DIR", str(folder))
    return folder


class Registry:
    """A stand-in for the package registry: a wheel of the files in
    ``files`` (rel -> bytes); ``asked``: the versions asked for, in order."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.asked: list[str] = []

    def download(self, version: str, wheels: Path) -> Path:
        self.asked.append(version)
        wheels.mkdir(parents=True, exist_ok=True)
        return small_wheel(wheels / f"sglang-{version}-py3-none-any.whl", self.files)


@pytest.fixture
def registry(cache, monkeypatch):
    stand_in = Registry()
    monkeypatch.setattr(fetch, "download_from_registry", stand_in.download)
    return stand_in


@pytest.fixture(autouse=True)
def real_cache():
    """The real cache's copy of the release (fetched before the test's cache is set)."""
    return fetch.fetch_tree(PRIMARY)


def test_a_tampered_cached_release_is_not_used(tmp_path, real_cache, cache, registry, cli):
    """The issue's case: the cached release's schedule_batch.py edited as the
    fork is (``+ my_bias`` on a line needs-cpu-seq-lens rewrites). The
    vendor-code check compared the fork with it, found no vendor code and
    dropped ``my_bias``, exit 0. Now the cached copy fails the shipped
    sha256, is said, removed, fetched again, and the check refuses."""
    tree = linked_copy(real_cache, tmp_path / "fork" / "sglang")
    _fork(tree, BATCH, EAGER_SUM, " + my_bias")
    cached = linked_copy(real_cache, cache / "trees" / PRIMARY / "sglang")
    (cache / "trees" / PRIMARY / ".complete").write_text("stand-in")
    _fork(cached, BATCH, EAGER_SUM, " + my_bias")
    registry.files[BATCH] = (real_cache / BATCH).read_bytes()

    result = cli("apply", tree, "needs-cpu-seq-lens")
    assert (
        f"patchkit's cached sglang {PRIMARY} does not match the sha256 patchkit ships for {BATCH}: not used, "
        "and removed from the cache"
    ) in result.output, result.output
    assert registry.asked == [PRIMARY], result.output
    assert "refused" in result.output and "my_bias" in result.output
    assert "+ my_bias" in (tree / BATCH).read_text()
    # The cache holds the release as shipped again.
    assert fetch.pristine_source(PRIMARY, BATCH) == (real_cache / BATCH).read_bytes()


def test_a_cut_short_wheel_is_removed_and_fetched_again(real_cache, cache, registry, cli):
    """A wheel truncated in the cache gave BadZipFile on every fetch and
    apply, for ever."""
    registry.files[BATCH] = (real_cache / BATCH).read_bytes()
    wheels = cache / "wheels"
    wheels.mkdir()
    whole = small_wheel(wheels / f"sglang-{PRIMARY}-py3-none-any.whl", registry.files).read_bytes()
    cut = wheels / f"sglang-{PRIMARY}-py3-none-any.whl"
    cut.write_bytes(whole[: len(whole) // 2])

    # The vendor-code check's read of the cache: not a release, and removed.
    said: list[str] = []
    assert fetch.pristine_source(PRIMARY, BATCH, said.append) is None and not cut.exists()
    assert said == [
        f"patchkit's cached {cut.name} is not a whole zip: not used, and removed from the cache "
        f"({wheels}) to be fetched again"
    ]

    cut.write_bytes(whole[: len(whole) // 2])
    result = cli("fetch", PRIMARY)
    assert result.exit_code == 0, result.output
    assert registry.asked == [PRIMARY]
    assert (cache / "trees" / PRIMARY / "sglang" / BATCH).read_bytes() == (real_cache / BATCH).read_bytes()


def _read_only(folder: Path) -> list[str]:
    """A command prefix that runs with ``folder`` read-only: a read-only bind
    mount in a user namespace of its own (root writes through permissions),
    else the folder made unwritable."""
    if os.geteuid() != 0:
        subprocess.run(["chmod", "-R", "a-w", str(folder)], check=True)
        return []
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"]).returncode != 0:
        pytest.skip("root without user namespaces: no way to make a folder read-only")
    return ["unshare", "-rm", "sh", "-c", 'mount --bind -o ro "$0" "$0" && exec "$@"', str(folder)]


# Runs patchkit's command line with the registry standing in (a copy of the real wheel's one file).
STAND_IN = """
import sys, zipfile
from pathlib import Path
from patchkit import fetch
def download(version, wheels):
    wheels.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheels / f"sglang-{version}-py3-none-any.whl", "w") as zf:
        zf.write(sys.argv[1], "sglang/" + sys.argv[2])
    return wheels / f"sglang-{version}-py3-none-any.whl"
fetch.download_from_registry = download
from patchkit.cli import main
main.main(sys.argv[3:], prog_name="patchkit")
"""


def test_a_read_only_cache(tmp_path, real_cache, cache):
    """Gave EROFS on trees/.VER.lock (a traceback). A release the cache has
    is read from it; one it lacks is fetched into a temporary cache, said in
    one line, and removed at the end."""
    fork = linked_copy(real_cache, tmp_path / "fork" / "sglang")
    _fork(fork, MHA, "\n", "ACME_VENDOR = 1\n")  # vendor code: the check needs the release's bytes
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp), "PYTHONPATH": os.pathsep.join(sys.path)}
    prefix = _read_only(cache)
    command = [*prefix, sys.executable, "-c", STAND_IN, str(real_cache / MHA), MHA]

    lacking = subprocess.run([*command, "apply", str(fork), HOOK], env=env, capture_output=True, text=True)
    assert lacking.returncode == 0 and "Traceback" not in lacking.stderr, lacking.stderr
    notes = [line for line in lacking.stderr.splitlines() if "temporary cache" in line]
    assert len(notes) == 1 and notes[0].startswith(f"patchkit's cache {cache} cannot be written ("), lacking.stderr
    assert "ACME_VENDOR = 1" in (fork / MHA).read_text() and "skipped" not in lacking.stderr
    assert list(cache.iterdir()) == [] and list(temp.iterdir()) == []

    # A cache that has the release: read, nothing written, nothing said.
    cached = linked_copy(real_cache, tmp_path / "cache2" / "trees" / PRIMARY / "sglang")
    (cached.parent / ".complete").write_text("stand-in")
    fork = linked_copy(real_cache, tmp_path / "fork2" / "sglang")
    _fork(fork, MHA, "\n", "ACME_VENDOR = 1\n")
    prefix = _read_only(tmp_path / "cache2")
    having = subprocess.run(
        [*prefix, sys.executable, "-m", "patchkit", "-q", "apply", str(fork), HOOK],
        env={**env, "PATCHKIT_CACHE_DIR": str(tmp_path / "cache2")},
        capture_output=True,
        text=True,
    )
    assert having.returncode == 0 and having.stderr == "", having.stderr
    assert "ACME_VENDOR = 1" in (fork / MHA).read_text()


@pytest.mark.parametrize("where", ["HOME=/proc", "HOME=a file", "HOME=missing", "PATCHKIT_CACHE_DIR=/proc/x"])
def test_a_cache_that_cannot_be_made_works_as_a_read_only_one(tmp_path, real_cache, registry, cli, monkeypatch, where):
    """HOME=/proc, HOME a file or PATCHKIT_CACHE_DIR=/proc/x: apply on a fork
    (which fetches its release for the vendor-code check) was a traceback.
    Now, as with a read-only cache: the release goes to a temporary cache,
    said in one line, and the apply goes on."""
    name, _, value = where.partition("=")
    if value == "a file":
        value = str(tmp_path / "home")
        Path(value).write_text("")
    elif value == "missing":  # HOME=/nonexistent, a service user's: never created
        value = str(tmp_path / "nonexistent")
    monkeypatch.delenv("PATCHKIT_CACHE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv(name, value)
    monkeypatch.setattr(fetch, "_TEMPORARY", [])  # none made yet by this process
    tree = linked_copy(real_cache, tmp_path / "fork" / "sglang")
    _fork(tree, BATCH, "\n", "# a vendor's comment\n")
    registry.files[BATCH] = (real_cache / BATCH).read_bytes()
    result = cli("apply", tree, "needs-cpu-seq-lens")
    assert result.exit_code == 0, result.output
    assert f"sglang {PRIMARY} is fetched into a temporary cache" in result.output
    assert registry.asked == [PRIMARY]
    assert not (tmp_path / "nonexistent").exists()
