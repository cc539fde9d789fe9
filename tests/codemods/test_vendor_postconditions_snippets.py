"""Snippet tests of tests/trees/test_vendor_postconditions.py (no release read; the quick loop runs them)."""

from __future__ import annotations


def test_a_postcondition_that_cannot_be_loaded_is_one_line(cli, tmp_path):
    clash = tmp_path / "set"
    clash.mkdir()
    (clash / "mine.toml").write_text('id = "mine"\ntitle = "t"\npostconditions = ["nowhere:Check"]\n')
    listed = cli("--patches", clash, "list")
    assert listed.exit_code == 2 and listed.output.strip().splitlines() == [
        f"patchkit: error: patch mine: postcondition nowhere:Check cannot be loaded: no module nowhere in {clash}"
    ]
    (clash / "mine.toml").write_text('id = "mine"\ntitle = "t"\npostconditions = "checks:Check"\n')
    listed = cli("--patches", clash, "list")
    assert listed.exit_code == 2 and "postconditions must be a list" in listed.output
