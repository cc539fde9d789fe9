"""What patchkit reads and where it writes its state stay in the tree (issue
68, items 3 and 7): ``.patchkit`` and everything in it are real folders and
files (a link there sent the state, the blobs and the lock outside); no read
follows a link out of the tree (``audit`` read a module linked to /dev/zero or
to an outside .py); a FIFO or a device is never opened (one as a module,
``state.json`` or ``manifest.json`` hung every command). Each is one line,
exit 2, nothing written (docs/reliability.md, "Links, FIFOs and devices")."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from support import PRIMARY, snapshot

pytestmark = pytest.mark.trees

MODULE = "srt/layers/attention/trtllm_mha_backend.py"  # a target file, and a module the audit reads
PATCH = "trtllm-mha-overlap-hook"


def one_line(result, *needles: str) -> str:
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("patchkit: error: "), result.output
    assert all(n in lines[0] for n in needles), lines[0]
    return lines[0]


def run_bounded(*args: str) -> subprocess.CompletedProcess:
    """patchkit in a child that may neither hang (60 s) nor take the
    machine's memory (2 GiB): what these cases did before."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    return subprocess.run(
        [sys.executable, "-m", "patchkit", *args],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=limit,
    )


def assert_refused_in_a_child(*args: str, needle: str) -> None:
    proc = run_bounded(*args)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and needle in lines[0], (proc.returncode, proc.stderr[-2000:])


@pytest.mark.parametrize("link", [".patchkit", ".patchkit/blobs", ".patchkit/set-aside"])
def test_a_state_folder_that_is_a_link_is_refused(linked_tree, cli, tmp_path, link):
    """`ln -s OUTSIDE T/.patchkit; patchkit apply T` wrote 54 files outside."""
    tree = linked_tree(PRIMARY)
    outside = tmp_path / "outside"
    outside.mkdir()
    (tree / link).parent.mkdir(exist_ok=True)
    (tree / link).symlink_to(outside, target_is_directory=True)
    before = snapshot(tree)
    for command in (("apply",), ("revert",), ("status",), ("revert", "--recover")):
        one_line(cli(*command, tree), link, "a symbolic link", "refused")
    assert list(outside.iterdir()) == []
    assert snapshot(tree) == before


def test_a_dangling_lock_link_creates_nothing(linked_tree, cli, tmp_path):
    """With a dangling `.patchkit/lock` link, even `status` created the file it names."""
    tree = linked_tree(PRIMARY)
    assert cli("apply", tree, PATCH).exit_code == 0
    target = tmp_path / "outside-lock"
    (tree / ".patchkit" / "lock").unlink()
    (tree / ".patchkit" / "lock").symlink_to(target)
    for command in ("status", "verify", "apply", "revert"):
        one_line(cli(command, tree), ".patchkit/lock", "refused")
    assert not target.exists()


def test_a_module_linked_out_of_the_tree_is_not_read(linked_tree, cli, tmp_path):
    """`audit` reported the reads of an outside .py a module links to."""
    tree = linked_tree(PRIMARY)
    outside = tmp_path / "elsewhere.py"
    outside.write_text("def f(batch):\n    return batch.seq_lens_cpu.sum()\n")
    (tree / "srt" / "linked_out.py").symlink_to(outside)
    one_line(cli("audit", tree), "srt/linked_out.py", "leads out of", "refused")
    (tree / "srt" / "linked_out.py").unlink()
    (tree / "srt" / "linked_in.py").symlink_to(tree / MODULE)  # a link inside the tree is read
    assert cli("audit", tree).exit_code in (0, 1)


def test_a_module_linked_to_dev_zero_is_refused(linked_tree):
    """It took 24 GB before it was killed."""
    tree = linked_tree(PRIMARY)
    (tree / "srt" / "zero.py").symlink_to("/dev/zero")
    assert_refused_in_a_child("audit", str(tree), needle="leads out of")


@pytest.mark.parametrize("command", ["status", "apply", "audit"])
def test_a_fifo_as_a_module_is_refused(linked_tree, command):
    tree = linked_tree(PRIMARY)
    (tree / MODULE).unlink()
    os.mkfifo(tree / MODULE)
    assert_refused_in_a_child(command, str(tree), needle="a FIFO")


@pytest.mark.parametrize("fifo", [".patchkit/state.json", ".patchkit/journal.json", "srt/_patchkit/manifest.json"])
def test_a_fifo_as_state_or_manifest_is_refused(linked_tree, cli, fifo):
    tree = linked_tree(PRIMARY)
    assert cli("apply", tree, PATCH).exit_code == 0
    path = tree / fifo
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    for command in ("status", "apply", "revert"):
        assert_refused_in_a_child(command, str(tree), needle=fifo.rsplit("/", 1)[-1])
    assert path.exists() and not path.is_file()  # left as it was


def test_only_regular_files_are_opened(tmp_path):
    """The one reader (``patchkit.tree.read_regular``): a FIFO is refused before it is opened, a device too."""
    from patchkit.errors import PatchkitError
    from patchkit.tree import read_regular

    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "null").symlink_to("/dev/null")
    with pytest.raises(PatchkitError, match="a FIFO"):
        read_regular(tmp_path / "fifo", tmp_path)
    with pytest.raises(PatchkitError, match="leads out of"):
        read_regular(tmp_path / "null", tmp_path)
    with pytest.raises(PatchkitError, match="a character device"):
        read_regular(Path("/dev/null"), Path("/dev"))
    assert read_regular(tmp_path / "missing", tmp_path) is None
