"""The vendor-code check runs by default (issue 45 §1): apply's fetch step
downloads the release's bytes of the files it will change where neither the
shipped hashes nor the cache have them; offline it refuses in one line unless
--accept-vendor-code-risk. Every test starts from an empty cache, with a
stand-in fetcher (a wheel built from the real cached release) or an offline
one."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest
from support import PRIMARY, snapshot

from patchkit import fetch, known_releases
from patchkit.errors import PatchkitError

BATCH = "srt/managers/schedule_batch.py"
EAGER_SUM = "self.seq_lens_sum = self.seq_lens.sum().item()"
SYNC = "srt/speculative/eagle_info_v2.py"
SYNC_LINE = "        batch.seq_lens_cpu = batch.seq_lens.cpu()\n"
# After the pair the patch guards (a statement between the two is refused: tests/trees/test_vendor_code.py).
SUM_LINE = "        batch.seq_lens_sum = batch.seq_lens_cpu.sum().item()\n"


def add_after(tree: Path, rel: str, anchor: str, text: str) -> None:
    source = (tree / rel).read_text()
    at = source.index(anchor) + len(anchor)
    (tree / rel).write_text(source[:at] + text + source[at:])


@pytest.fixture
def tree(make_tree):
    """A private copy of the release, made before the cache is emptied."""
    return make_tree(PRIMARY)


@pytest.fixture
def empty_cache(tree, tmp_path, monkeypatch):
    """An empty PATCHKIT_CACHE_DIR; returns the list of versions downloaded
    through the stand-in fetcher (which builds the wheel from the real cache)."""
    real = {v: fetch.fetch_tree(v) for v in (PRIMARY,)}
    cache = tmp_path / "empty-cache"
    cache.mkdir()
    monkeypatch.setenv("PATCHKIT_CACHE_DIR", str(cache))
    calls: list[str] = []

    def stand_in(version: str) -> Path:
        calls.append(version)
        wheels = cache / "wheels"
        wheels.mkdir(parents=True, exist_ok=True)
        wheel = wheels / f"sglang-{version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            for path in sorted(real[version].rglob("*.py")):
                zf.write(path, "sglang/" + path.relative_to(real[version]).as_posix())
        return wheel

    monkeypatch.setattr(fetch, "download_wheel", stand_in)
    return calls


@pytest.fixture
def offline(monkeypatch):
    def unreachable(version: str) -> Path:
        raise PatchkitError(f"cannot download sglang=={version}: ERROR: No matching distribution found")

    monkeypatch.setattr(fetch, "download_wheel", unreachable)


def test_shipped_hashes_know_the_release_files(tree):
    data = (tree / BATCH).read_bytes()
    assert known_releases.release_bytes(PRIMARY, BATCH, data) == data
    assert known_releases.release_bytes(PRIMARY, BATCH, data + b"# vendor\n") is None
    assert known_releases.release_bytes("9.9.9", BATCH, data) is None
    assert known_releases.release_bytes("0.5.10", "srt/model_executor/breakable_cuda_graph_runner.py", b"x") == b""
    # The patches' files and the modules that read the mirror (the audit's), each content once: ~8 KB a release.
    assert known_releases.PATH.stat().st_size < 10_000 * len(known_releases._table()[0])


def test_release_tree_needs_no_download(tree, cli, empty_cache):
    result = cli("apply", tree)
    assert result.exit_code == 0, result.output
    assert empty_cache == [] and "skipped" not in result.output


def test_fork_fetches_the_release_and_the_check_refuses(tree, cli, empty_cache):
    add_after(tree, BATCH, EAGER_SUM, " + acme_vendor_bias")
    result = cli("apply", tree)
    assert empty_cache == [PRIMARY], result.output
    assert "fetching sglang 0.5.12.post1 from the package registry for the vendor-code check" in result.output
    assert "refused" in result.output and "acme_vendor_bias" in result.output
    assert "skipped" not in result.output


def test_fork_carries_vendor_code_after_a_download(tree, cli, empty_cache):
    add_after(tree, SYNC, SUM_LINE, "        acme_vendor_stmt = batch.seq_lens.numel()\n")
    result = cli("apply", tree)
    assert result.exit_code == 0, result.output
    assert empty_cache == [PRIMARY] and "skipped" not in result.output
    assert "acme_vendor_stmt" in (tree / SYNC).read_text()


def test_offline_refuses_in_one_line_changing_nothing(tree, cli, empty_cache, offline):
    add_after(tree, SYNC, SUM_LINE, "        acme_vendor_stmt = batch.seq_lens.numel()\n")
    before = snapshot(tree)
    result = cli("apply", tree)
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if "cannot" in line]
    assert len(errors) == 1 and "cannot run the vendor-code check" in errors[0]
    assert "nothing was changed" in errors[0] and "--accept-vendor-code-risk" in errors[0]
    assert snapshot(tree) == before


def test_the_risk_flag_applies_unchecked_and_says_so(tree, cli, empty_cache, offline):
    add_after(tree, SYNC, SUM_LINE, "        acme_vendor_stmt = batch.seq_lens.numel()\n")
    result = cli("apply", "--accept-vendor-code-risk", tree)
    assert result.exit_code == 0, result.output
    assert "the vendor-code check was skipped (--accept-vendor-code-risk)" in result.output
    assert empty_cache == []


def test_the_hash_script_reads_the_cached_trees(tmp_path):
    import runpy

    table = runpy.run_path(str(Path(__file__).resolve().parents[2] / "scripts" / "release_hashes.py"))["table"](
        [PRIMARY]
    )
    data = (fetch.fetch_tree(PRIMARY) / BATCH).read_bytes()
    assert table["releases"] == [PRIMARY]
    assert table["files"][BATCH] == {hashlib.sha256(data).hexdigest(): PRIMARY}


def test_cold_apply_audits_only_what_the_vendor_changed(tree, tmp_path, monkeypatch):
    """The vendor audit apply ends with parses no module that is the release's
    own bytes, nor a file patched from release bytes (issue 45 §6: the
    whole-tree audit was a large share of a cold apply)."""
    from patchkit import api
    from patchkit.audit import facts as audit_facts

    monkeypatch.setenv("PATCHKIT_TRANSFORM_CACHE", str(tmp_path / "cold"))
    audit_facts._MEMO.clear()
    # The safety rule's audit of the tree as it would be written is a cost of its own (kept by the
    # tree's bytes in the transform cache: tests/trees/test_pre_0510.py); here only the vendor audit.
    from patchkit.checks import mirror_reads

    monkeypatch.setattr(mirror_reads, "first_unsafe_read", lambda *args, **kwargs: None)
    (tree / "srt" / "acme_reads.py").write_text("def f(forward_batch):\n    return forward_batch.seq_lens_cpu.max()\n")
    read = []
    real = audit_facts.facts_of
    monkeypatch.setattr(
        audit_facts,
        "facts_of",
        lambda rel, data, reads=True: (read.append(rel) if reads else None) or real(rel, data, reads),
    )
    result = api.apply(str(tree))
    assert read == ["srt/acme_reads.py"]
    assert result.vendor_line and result.vendor_line.startswith("audit: 1 read(s)")


# -- a fork's own version string ----------------------------------------------------------------


def set_version(tree: Path, version: str) -> None:
    path = tree / "_version.py"
    path.write_text(path.read_text().replace(f"'{PRIMARY}'", f"'{version}'"))


def test_a_local_version_is_checked_against_its_base_release(tree, cli, empty_cache):
    set_version(tree, f"{PRIMARY}+acme")
    add_after(tree, SYNC, SUM_LINE, "        acme_vendor_stmt = batch.seq_lens.numel()\n")
    result = cli("apply", tree)
    assert result.exit_code == 0, result.output
    assert empty_cache == [PRIMARY]
    assert (
        f"the vendor-code check compares with sglang {PRIMARY}: {PRIMARY}+acme is a local build of that release"
        in result.output
    )
    assert "skipped" not in result.output and "acme_vendor_stmt" in (tree / SYNC).read_text()


def test_a_local_version_still_refuses_vendor_code_it_would_remove(tree, cli, empty_cache):
    set_version(tree, f"{PRIMARY}+acme")
    add_after(tree, BATCH, EAGER_SUM, " + acme_vendor_bias")
    result = cli("apply", tree)
    assert result.exit_code == 1, result.output
    assert "refused" in result.output and "acme_vendor_bias" in result.output


def test_a_version_naming_no_release_refuses_in_one_line(tree, cli, empty_cache):
    set_version(tree, "acme-main")
    before = snapshot(tree)
    result = cli("apply", tree)
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if "cannot" in line]
    assert errors == [
        "patchkit: error: cannot run the vendor-code check: sglang 'acme-main' names no release to compare with; "
        "nothing was changed (--accept-vendor-code-risk to apply without the check)"
    ], result.output
    assert snapshot(tree) == before and empty_cache == []
    risked = cli("apply", "--accept-vendor-code-risk", tree)
    # Applied unchecked. Without a release to place the tree's reads by, the safety rule refuses
    # needs-cpu-seq-lens (exit 1), whatever an earlier apply of the same bytes with a release left in
    # the shared cache (its result is keyed by the release bytes it was given, too).
    assert risked.exit_code == 1 and "applied: min-new-tokens-no-sync" in risked.output, risked.output
    assert "not applied: needs-cpu-seq-lens" in risked.output, risked.output
    assert (
        "the vendor-code check was skipped (--accept-vendor-code-risk): sglang 'acme-main' names no release"
        in risked.output
    )
