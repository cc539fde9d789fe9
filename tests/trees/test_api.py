"""patchkit.api: each command as a function returning a value, printing
nothing; the CLI prints what it returns."""

from __future__ import annotations

import json

import pytest
from support import NOT_ON_PRIMARY, PRIMARY, pristine_snapshot, snapshot

from patchkit import api
from patchkit.errors import PatchkitError

pytestmark = pytest.mark.trees


def test_apply_verify_revert_as_values(make_tree, capsys):
    tree = make_tree(PRIMARY)
    said: list[str] = []

    before = api.status(str(tree), say=said.append)
    carried = {r.state for r in before.reports if r.patch.id not in NOT_ON_PRIMARY}
    assert carried == {"absent"} and not before.ok and before.runtime is None

    dry = api.apply(str(tree), dry_run=True, say=said.append)
    assert dry.dry and dry.outcome.changed and snapshot(tree) == pristine_snapshot(PRIMARY)
    assert dry.counts().startswith(
        f"{sum(1 for o, n in dry.outcome.changed.values() if o is not None)} file(s) would change"
    )

    applied = api.apply(str(tree), say=said.append)
    assert applied.outcome.changed.keys() == dry.outcome.changed.keys()
    assert applied.outcome.done == dry.outcome.done and applied.vendor_line is None

    verified = api.verify(str(tree), say=said.append)
    assert verified.ok and verified.audit_problems == 0 and verified.runtime["mode"] == "vendored"
    assert set(verified.recorded_files) == set(applied.outcome.changed)

    assert [p.patch.id for p in api.export(str(tree), say=said.append).series.patches] == applied.outcome.done
    assert {d.rel for d in api.diff(str(tree)).diffs} == set(applied.outcome.changed)

    reverted = api.revert(str(tree), say=said.append)
    assert sorted(reverted.outcome.done) == sorted(applied.outcome.done)
    assert snapshot(tree) == pristine_snapshot(PRIMARY)
    assert capsys.readouterr() == ("", "")  # the API prints nothing


def test_the_cli_prints_what_the_api_returns(make_tree, cli):
    tree = make_tree(PRIMARY)
    assert cli("apply", tree, "needs-cpu-seq-lens").exit_code == 0
    printed = json.loads(cli("status", tree, "--format", "json").stdout)
    returned = api.status(str(tree))
    assert {p["id"]: p["state"] for p in printed["patches"]} == {r.patch.id: r.state for r in returned.reports}
    assert printed["ok"] == returned.ok


def test_errors_raise_one_line_and_change_nothing(make_tree, tmp_path):
    tree = make_tree(PRIMARY)
    with pytest.raises(PatchkitError, match="no-such-patch"):
        api.apply(str(tree), ["no-such-patch"])
    with pytest.raises(PatchkitError):
        api.status(str(tmp_path / "nowhere"))
    assert snapshot(tree) == pristine_snapshot(PRIMARY)


def test_show_with_a_diff_reads_the_tree_and_writes_nothing(make_tree):
    tree = make_tree(PRIMARY)
    shown = api.show("trtllm-mha-overlap-hook", str(tree), with_diff=True)
    assert shown.patch.id == "trtllm-mha-overlap-hook" and shown.codemods and shown.diff.startswith("--- a/")
    assert snapshot(tree) == pristine_snapshot(PRIMARY)


def test_a_cold_apply_tells_its_progress_a_warm_one_nothing(make_tree, tmp_path, monkeypatch):
    monkeypatch.setenv("PATCHKIT_TRANSFORM_CACHE", str(tmp_path / "cache"))
    cold: list[tuple] = []
    api.apply(str(make_tree(PRIMARY)), progress=lambda *done: cold.append(done))
    assert cold[0] == (0, cold[-1][1]) and cold[-1][0] == cold[-1][1] > 1  # every file to transform, once
    warm: list[tuple] = []
    api.apply(str(make_tree(PRIMARY)), progress=lambda *done: warm.append(done))
    assert warm == []  # all from the transform cache: no bar to draw


def test_a_warm_apply_does_not_audit_the_tree_again(make_tree, monkeypatch):
    """The vendor audit line's count is kept with the session's findings, by the
    audited files' bytes: an apply that changes nothing reads it back."""
    from patchkit import audit

    tree = make_tree(PRIMARY)
    first = api.apply(str(tree))
    audits = []
    real = audit.audit_tree
    monkeypatch.setattr(audit, "audit_tree", lambda package, **kw: audits.append(package) or real(package, **kw))
    again = api.apply(str(tree))
    assert not again.outcome.changed and again.vendor_line == first.vendor_line and audits == []
    (tree / "srt" / "vendor_reads.py").write_text(
        "def f(forward_batch):\n    return forward_batch.seq_lens_cpu.max()\n"
    )
    api.apply(str(tree))
    assert len(audits) == 1  # a changed module under srt/: audited afresh


def test_the_vendor_audit_count_is_shared_by_copies_of_one_tree(make_tree, monkeypatch, tmp_path):
    """Like a transform, the count is a function of bytes: a fresh copy of the
    same release, patched alike, reads it from the shared cache."""
    from patchkit import audit

    monkeypatch.setenv("PATCHKIT_TRANSFORM_CACHE", str(tmp_path / "shared"))
    first = api.apply(str(make_tree(PRIMARY)))
    audits = []
    real = audit.audit_tree
    monkeypatch.setattr(audit, "audit_tree", lambda package, **kw: audits.append(package) or real(package, **kw))
    second = api.apply(str(make_tree(PRIMARY)))
    assert second.outcome.changed and second.vendor_line == first.vendor_line and audits == []
