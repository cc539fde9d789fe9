"""A patched tree is deployable (issue 68, items 1 and 8): the files ``apply``
adds get the mode the tree's own files get under the umask (they came out
0600), the files it changes keep mode and owner exactly (root's run made them
root:root), and a tree patched as root reads as any user: ``nobody`` reads
every added file and runs ``status``."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from support import PRIMARY

from patchkit.fetch import copy_tree, fetch_tree

pytestmark = [
    pytest.mark.trees,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("setpriv") is None or not os.path.exists("/usr/bin/python3"),
        reason="needs root, setpriv and a system python",
    ),
]

ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534
BLOBS = ".patchkit/blobs"  # copies of the originals, some maybe closed to others: the owner's alone


@pytest.fixture
def shared_tree():
    """A copy of the release in a folder every user may enter (pytest's own is root's, 0700)."""
    fetch_tree(PRIMARY)
    folder = Path(tempfile.mkdtemp(prefix="patchkit-modes-"))
    folder.chmod(0o755)
    try:
        yield copy_tree(PRIMARY, folder)
    finally:
        shutil.rmtree(folder)


def patchkit(*args, user: int = 0, umask: int = 0o022) -> subprocess.CompletedProcess:
    """The CLI in a process of its own, as ``user`` under ``umask``."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PATCHKIT_TRANSFORM_CACHE": "off",
        **({"HOME": "/nonexistent", "PATCHKIT_CACHE_DIR": "/nonexistent/cache"} if user else {}),
    }
    command = [sys.executable, "-m", "patchkit", *map(str, args)]
    if user:
        command = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *command]
    return subprocess.run(command, capture_output=True, text=True, env=env, preexec_fn=lambda: os.umask(umask))


def owners(package: Path) -> dict[str, tuple[int, int, int]]:
    """(mode, uid, gid) of every file and folder, .patchkit included."""
    return {
        str(p.relative_to(package)): (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
        for p in [package, *package.rglob("*")]
        if not p.is_symlink() and (st := p.stat())
    }


def added(before: dict, after: dict) -> dict:
    return {rel: after[rel] for rel in after.keys() - before.keys()}


def test_a_tree_patched_as_root_reads_as_nobody(shared_tree):
    before = owners(shared_tree)
    applied = patchkit("apply", shared_tree)
    assert applied.returncode == 0, applied.stderr
    new = added(before, owners(shared_tree))
    assert "srt/_patchkit/manifest.json" in new and "srt/_patchkit/runtime/seq_lens.py" in new
    for rel, (mode, uid, _gid) in new.items():
        want = 0o700 if rel == BLOBS else 0o755 if (shared_tree / rel).is_dir() else 0o644
        assert (mode, uid) == (want, 0), rel
    files = [str(shared_tree / rel) for rel in new if (shared_tree / rel).is_file() and ".patchkit" not in rel]
    read = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "cat", *files],
        capture_output=True,
    )
    assert read.returncode == 0, read.stderr
    # The vendored runtime imports with the standard library alone, as nobody (under the system's
    # python: a virtualenv's may link to an interpreter only its owner may run).
    code = f"from patchkit.state import vendoring; print(vendoring.import_in_isolation({str(shared_tree)!r}))"
    imported = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "/usr/bin/python3", "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert imported.stdout.strip() == "(True, '')", imported.stdout + imported.stderr  # the vendored runtime
    status = patchkit("status", shared_tree, user=NOBODY)
    assert status.returncode == 0 and "applied" in status.stdout, status.stderr
    assert "needs-cpu-seq-lens" in patchkit("verify", shared_tree, user=NOBODY).stdout


def test_an_unprivileged_user_gets_its_umask(shared_tree):
    subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", shared_tree.parent], check=True)
    before = owners(shared_tree)
    applied = patchkit("apply", shared_tree, user=NOBODY, umask=0o027)
    assert applied.returncode == 0, applied.stderr
    new = added(before, owners(shared_tree))
    assert new and all(
        mode == (0o700 if rel == BLOBS else 0o750 if (shared_tree / rel).is_dir() else 0o640) and uid == NOBODY
        for rel, (mode, uid, _gid) in new.items()
    ), new


def test_root_keeps_another_users_owners_and_modes(shared_tree):
    """Root applies and reverts on nobody's tree: every file keeps its owner
    and mode (a 0640 one too), what apply adds is nobody's, and nobody can
    then run patchkit on its own tree."""
    subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", shared_tree.parent], check=True)
    target = shared_tree / "srt/speculative/eagle_info_v2.py"
    target.chmod(0o640)
    before = owners(shared_tree)
    assert patchkit("apply", shared_tree).returncode == 0
    after = owners(shared_tree)
    assert {rel: after[rel] for rel in before} == before
    assert {uid for _mode, uid, _gid in added(before, after).values()} == {NOBODY}
    assert patchkit("revert", shared_tree).returncode == 0
    reverted = owners(shared_tree)
    assert {rel: reverted[rel] for rel in before} == before
    assert {uid for _mode, uid, _gid in added(before, reverted).values()} == {NOBODY}  # .patchkit/
    again = patchkit("apply", shared_tree, user=NOBODY)
    assert again.returncode == 0, again.stderr
