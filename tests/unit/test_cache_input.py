"""What ``fetch`` takes and where patchkit's cache may go (issue 68, items 9
and 10): a VERSION is a PEP 440 version, never a path or a pip option, and
writes nothing; a HOME or a PATCHKIT_CACHE_DIR that cannot hold the cache is
one line, and a missing HOME is never created. No release is read: each
case stops before a download."""

from __future__ import annotations

import pytest


def one_line_error(result, *needles) -> str:
    out = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(out) == 1 and out[0].startswith("patchkit: error: "), result.output
    for needle in needles:
        assert needle in out[0], out[0]
    return out[0]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("PATCHKIT_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATCHKIT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.parametrize("version", ["./../../esc", "-r/etc/passwd", "--index-url=http://x", "../x", " 0.5.12"])
def test_fetch_takes_only_a_version(cli, cache, tmp_path, version):
    """``fetch -- ./../../esc`` made ``esc.lock`` outside the cache; ``-r`` and
    ``--index-url`` went to pip (a traceback, stray folders)."""
    one_line_error(cli("fetch", "--", version), repr(version), "not a version of sglang (PEP 440")
    assert list(tmp_path.iterdir()) == []  # not even the cache


def test_pip_options_are_not_fetch_options(cli, cache, tmp_path):
    for option in ("-r/etc/passwd", "--index-url=http://x"):
        one_line_error(cli("fetch", option), "No such option")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("home", ["/proc", "a file", "missing"])
def test_a_home_that_cannot_hold_the_cache(cli, cache, tmp_path, monkeypatch, home):
    """HOME=/proc or a file gave a traceback; HOME=/nonexistent created /nonexistent/.cache."""
    monkeypatch.delenv("PATCHKIT_CACHE_DIR")
    path = {"/proc": "/proc", "a file": str(tmp_path / "file"), "missing": str(tmp_path / "nonexistent")}[home]
    if home == "a file":
        (tmp_path / "file").write_text("")
    monkeypatch.setenv("HOME", path)
    one_line_error(cli("fetch", "0.5.12"), f"cannot write patchkit's cache {path}/.cache/patchkit ({path}")
    assert sorted(p.name for p in tmp_path.iterdir()) == (["file"] if home == "a file" else [])


@pytest.mark.parametrize(
    "value, needle",
    [("/proc/x", "cannot write patchkit's cache /proc/x"), ("~nosuchuser/x", "names the home folder of no user")],
)
def test_a_cache_folder_that_cannot_be(cli, cache, monkeypatch, value, needle):
    monkeypatch.setenv("PATCHKIT_CACHE_DIR", value)
    one_line_error(cli("fetch", "0.5.12"), needle)
    one_line_error(cli("status"), *([needle] if "~" in value else ["is not an sglang tree"]))
