"""Shared test helpers: the releases tests use, and file snapshots.

Imported as ``from support import ...`` (not from conftest: tests/behaviour has
a conftest of its own, and two modules named conftest collide)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from functools import cache
from pathlib import Path

import profiling

from patchkit.fetch import fetch_tree

PRE_UPSTREAM = ["0.5.10", "0.5.10.post1", "0.5.11", "0.5.12", "0.5.12.post1"]
PRIMARY = "0.5.12.post1"
#: Built-in patches not applicable on 0.5.10 .. 0.5.13 (PRIMARY included): what they change
#: is not there (flashinfer-swa-host-sum: no prefix_lens=None case before 0.5.14, issue 71).
NOT_ON_PRIMARY = frozenset({"flashinfer-swa-host-sum"})


def carried_states(states: dict) -> set:
    """The states of ``states`` (patch id -> state), NOT_ON_PRIMARY left out."""
    return {s for pid, s in states.items() if pid not in NOT_ON_PRIMARY}


NATIVE = "0.5.13"
#: The first release with every patch upstream (FA3's and FlashMLA's sync-free spec v2 came with
#: 0.5.16, FA3 in the draft-extend CUDA-graph check with 0.5.23).
ALL_NATIVE = "0.5.23"

# What a test that reads a real release uses: a fixture that copies one, or a helper that fetches one
# (conftest marks such tests ``trees``; tests/unit/test_suite_layout.py keeps them out of tests/unit).
TREE_FIXTURES = {"make_tree", "pristine_tree", "patched_tree", "reference", "tree"}
TREE_CALLS = (
    "fetch_tree(",
    "copy_tree(",
    "make_tree",
    "pristine(",
    "pristine_snapshot(",
    "git_checkout(",
    "release_sources(",
    "linked_copy(",
    "PRIMARY_TREE",
    "patched_tree",
)


def written_files(version: str) -> tuple[list[str], list[str]]:
    """What an apply of every built-in patch writes on ``version``, from the recorded
    digests (tests/patched_digests.json, scripts/patched_digests.py): (the release's files
    it changes, the runtime files it adds under srt/_patchkit/). Tests derive their counts
    from it, so a new patch needs no count edited by hand."""
    digests = json.loads((Path(__file__).parent / "patched_digests.json").read_text(encoding="utf-8"))[version]
    added = sorted(rel for rel in digests if rel.startswith("srt/_patchkit/"))
    return sorted(set(digests) - set(added)), added


def patch_states(cli, tree, *ids: str) -> dict[str, dict]:
    """``patchkit status --format json`` (of ``ids``, or every patch) by patch id."""
    result = cli("status", tree, *ids, "--format", "json")
    assert result.exit_code == 0, result.output
    return {p["id"]: p for p in json.loads(result.stdout)["patches"]}


def verified_idempotent_reverted(cli, tree: Path, patch: str, before: dict[str, str]) -> None:
    """The end of one patch's round trip on a tree it was just applied to: reported
    applied, verify passes, a second apply changes nothing, revert gives ``before`` back."""
    assert patch_states(cli, tree, patch)[patch]["state"] == "applied"
    assert cli("verify", tree, patch).exit_code == 0
    again = snapshot(tree)
    assert cli("apply", tree, patch).exit_code == 0 and snapshot(tree) == again
    assert cli("revert", tree, patch).exit_code == 0 and snapshot(tree) == before


def class_section(text: str, cls: str) -> str:
    """The source of class ``cls`` in ``text``, up to the next top-level class."""
    start = text.index(f"\nclass {cls}")
    end = text.find("\nclass ", start + 1)
    return text[start : end if end != -1 else None]


def libcst_add_imports(module, wanted):
    """What ``primitives.add_imports`` replaced, the reference it must agree
    with: libcst's AddImportsVisitor run on the module's import block only
    (tests/unit/test_primitives.py on snippets, tests/trees/test_primitives_on_releases.py
    on real files)."""
    from libcst.codemod import CodemodContext
    from libcst.codemod.visitors import AddImportsVisitor

    from patchkit.codemods.common import primitives

    context = CodemodContext()
    for mod, obj in wanted:
        AddImportsVisitor.add_needed_import(context, mod, obj)
    body = list(module.body)
    first, last = primitives.imports._import_header(body)
    header = AddImportsVisitor(context).transform_module(module.with_changes(body=body[first : last + 1]))
    return module.with_changes(body=body[:first] + list(header.body) + body[last + 1 :])


def snapshot(package: Path) -> dict[str, str]:
    """sha256 of every file of a package folder, .patchkit excluded."""
    with profiling.timed("hash tree"):
        return _snapshot(package)


def _snapshot(package: Path) -> dict[str, str]:
    return {
        str(p.relative_to(package)): _digest(p)
        for p in sorted(package.rglob("*"))
        if p.is_file() and ".patchkit" not in p.relative_to(package).parts
    }


#: (device, inode) -> (size, mtime, sha256) of the hard-linked files hashed so far.
_LINKED: dict[tuple[int, int], tuple[int, int, str]] = {}
#: A file written this recently may be written again within the clock's tick, unseen by its mtime.
_SETTLED_NS = 2_000_000_000


def _digest(path: Path) -> str:
    """sha256 of a file's bytes. A file hard-linked to the release cache
    (``linked_copy``) is hashed once per process: the crash and signal tests
    snapshot hundreds of such trees, and only patchkit writes them, always by
    rename (a new inode). An in-place write changes the mtime; only an inode
    with other links (the cache's, never deleted in a run, so never reused) and
    an mtime older than its hashing is taken from the memo."""
    st = path.stat()
    key = (st.st_dev, st.st_ino)
    known = _LINKED.get(key)
    if known is not None and known[:2] == (st.st_size, st.st_mtime_ns):
        return known[2]
    hashed_at = time.time_ns()
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if st.st_nlink > 1 and st.st_mtime_ns < hashed_at - _SETTLED_NS and path.stat().st_mtime_ns == st.st_mtime_ns:
        _LINKED[key] = (st.st_size, st.st_mtime_ns, digest)
    return digest


def pristine(version: str) -> Path:
    with profiling.timed("fetch release"):
        return fetch_tree(version)


@cache
def _pristine_snapshot(version: str) -> tuple:
    return tuple(snapshot(fetch_tree(version)).items())


def pristine_snapshot(version: str) -> dict[str, str]:
    """snapshot() of the pristine release, computed once per test session."""
    return dict(_pristine_snapshot(version))


def recorded_patched(version: str) -> dict[str, str]:
    """snapshot() of the release with every built-in patch applied, as
    tests/patched_digests.json records it (the plain engine's whole parses,
    no cache, one process: ``scripts/patched_digests.py``): the reference a
    test compares an applied tree with, instead of applying one of its own."""
    written = json.loads((Path(__file__).with_name("patched_digests.json")).read_text())[version]
    patched = {**pristine_snapshot(version), **{rel: d for rel, d in written.items() if d is not None}}
    return {rel: patched[rel] for rel in sorted(patched) if written.get(rel, "") is not None}


def linked_copy(src: Path, dest: Path) -> Path:
    """A copy of the folder ``src`` whose files are hard links to ``src``'s (a
    tenth of a copy's time). Only for trees that nothing but patchkit writes:
    patchkit writes a file by renaming a new one over it (never in place), so
    the linked originals keep their bytes; a test that edits a file itself
    must take a real copy (``make_tree``)."""
    with profiling.timed("copy tree"):
        if src not in _STAMPS:
            _STAMPS[src] = _stamps(src)
        for folder, _dirs, files in os.walk(src):
            here = dest / Path(folder).relative_to(src)
            here.mkdir(parents=True, exist_ok=True)
            for name in files:
                os.link(os.path.join(folder, name), here / name)
    return dest


#: A linked source folder -> (size, mtime) of each of its files when this process first linked it.
_STAMPS: dict[Path, dict[str, tuple[int, int]]] = {}


def _stamps(src: Path) -> dict[str, tuple[int, int]]:
    found = {}
    for folder, _dirs, files in os.walk(src):
        for name in files:
            st = os.stat(os.path.join(folder, name))
            found[os.path.join(folder, name)] = (st.st_size, st.st_mtime_ns)
    return found


def linked_sources_written(sources: set[Path]) -> list[str]:
    """Files of a folder ``linked_copy`` linked from (the release cache) that
    were written in place since: a test that edited a linked file instead of
    taking a real copy (``make_tree``) or breaking the link first. The
    linked_tree fixture fails such a test (and the cache must be fetched again)."""
    return sorted(
        path for src in sources for path, stamp in _stamps(src).items() if _STAMPS[src].get(path, stamp) != stamp
    )


def git(cwd: Path, *args: str) -> str:
    """Run git with a fixed identity; its stdout."""
    env = dict(
        os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t"
    )
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def git_checkout(make_tree, version: str = PRIMARY) -> Path:
    """A git checkout (ROOT/python/sglang) with the pristine release committed."""
    root = make_tree(version, "checkout")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "sglang release")
    return root


def import_cost(module: str) -> tuple[list[str], float]:
    """Import ``module`` in a fresh interpreter: which of libcst, click and
    torch it pulled in, and how long it took (runtime modules imported by
    patched sglang must stay stdlib-only at import time)."""
    import subprocess
    import sys

    probe = (
        f"import sys, time; t = time.perf_counter(); import {module}; dt = time.perf_counter() - t; "
        "print(','.join(m for m in ('libcst', 'click', 'torch') if m in sys.modules), dt)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    heavy, seconds = out.rsplit(" ", 1)
    return [m for m in heavy.split(",") if m], float(seconds)


def under_triton_interpreter(script: str) -> str:
    """Run ``script`` in a fresh interpreter with Triton's CPU interpreter on
    (TRITON_INTERPRET=1: read when a kernel is made, so not in this process) and
    return what it printed; a failure is the assertion, with the script's stderr."""
    import subprocess
    import sys

    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def _stat(path: Path) -> tuple[str, list[str]]:
    """``/proc/PID/stat``: the process's "PID (name)", and the fields after it
    (state ppid pgrp session ...); ("", []) where it is gone."""
    try:
        text = path.read_text()
    except OSError:
        return "", []
    return text[: text.rindex(")") + 1], text[text.rindex(")") + 2 :].split()


def session_processes(sid: int) -> list[str]:
    """Live processes of session ``sid`` (patchkit runs as a session leader,
    its workers inherit the session, even once orphaned)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        who, fields = _stat(stat)
        if fields and int(fields[3]) == sid and fields[0] != "Z":
            found.append(f"{stat.parent.name}: {who}")
    return found


def alive(pid: int) -> bool:
    _, fields = _stat(Path(f"/proc/{pid}/stat"))
    return bool(fields) and fields[0] != "Z"


# -- synthetic forks (tests/trees/test_forks_v.py, test_forks_vi.py) ----------------------------


def edit_file(tree: Path, rel: str, old: str, new: str) -> None:
    """The fork's edit: ``old`` (once in the file) becomes ``new``."""
    text = (tree / rel).read_text()
    assert text.count(old) == 1, (rel, old)
    (tree / rel).unlink()  # a file of its own: in a linked tree, never the release cache's
    (tree / rel).write_text(text.replace(old, new))


def carries_every_patch(cli, tree: Path, not_applicable: tuple[str, ...] = ()) -> str:
    """apply, verify OK, every patch applied (but ``not_applicable``: those, with the
    release's reason), audit ok, revert exact; apply's output."""
    forked = snapshot(tree)
    applied = cli("apply", tree)
    assert applied.exit_code == 0 and "not applied" not in applied.output, applied.output
    states = patch_states(cli, tree)
    got = {pid: p["state"] for pid, p in states.items() if pid not in NOT_ON_PRIMARY}
    assert got == {pid: "not-applicable" if pid in not_applicable else "applied" for pid in got}
    verified = cli("verify", tree)
    assert verified.exit_code == 0 and "verify: OK" in verified.output, verified.output
    doc = json.loads(cli("audit", tree, "--format", "json").output)
    assert doc["ok"], [r for r in doc["reads"] if r["verdict"] in ("unguarded", "stale")]
    assert cli("revert", tree).exit_code == 0
    assert snapshot(tree) == forked
    return applied.output
