"""The duel (issue 67): engines of several trees alive at once, their generates
interleaved round by round, the others frozen; on CPU with the stand-in Engine."""

from __future__ import annotations

import json

import pytest
from fake_engine_bundle import fake_bundle

from gpu_e2e import duel, duel_report


def test_the_order_reverses_every_round():
    assert duel.order_of(["a", "b", "c"], 0) == ["a", "b", "c"]
    assert duel.order_of(["a", "b", "c"], 1) == ["c", "b", "a"]


def test_an_engine_spec_names_its_bundle_release_and_tree():
    assert duel.parse_engine("upstream=/tmp/b17:0.5.17:upstream") == {
        "name": "upstream",
        "bundle": "/tmp/b17",
        "release": "0.5.17",
        "tree": "upstream",
    }
    for bad in ("patched", "x=.:0.5.12.post1", "=.:r:patched", "x=.::patched"):
        with pytest.raises(SystemExit):
            duel.parse_engine(bad)


def _call(r, bs, engine, elapsed, sha="s", tokens=100):
    return {
        "round": r,
        "batch_size": bs,
        "engine": engine,
        "elapsed_s": elapsed,
        "completion_tokens": tokens,
        "outputs_sha256": sha,
    }


def test_the_summary_pairs_engines_within_each_round():
    calls = [
        _call(1, 64, "pristine", 2.0),
        _call(1, 64, "patched", 1.0),
        _call(2, 64, "patched", 1.0),
        _call(2, 64, "pristine", 0.9),
        _call(3, 64, "pristine", 1.1),
        _call(3, 64, "patched", 1.0, sha="other"),
        _call(3, 8, "pristine", 1.0),
        {"round": 3, "batch_size": 8, "engine": "patched", "error": "boom"},
    ]
    rows = duel_report.summary(calls, [("pristine", "patched"), ("upstream", "patched")], eager_above=32)
    assert rows == [
        {
            "batch_size": 64,
            "eager": True,
            "pair": "pristine:patched",
            "rounds": 3,
            "ratios": [2.0, 0.9, 1.1],
            "median": 1.1,
            "min": 0.9,
            "max": 2.0,
            "tok_per_s": {"pristine": 90.9, "patched": 100.0},
            "identical": False,
        }
    ]
    assert "| 64 | eager | pristine:patched | 3 | 1.100 | 0.900 | 2.000 | 91 → 100 | differ |" in duel_report.markdown(
        {"summary": rows, "device": "cpu"}
    )
    with pytest.raises(SystemExit):
        duel_report.pairs_of("pristine")


@pytest.mark.slow
def test_the_duel_times_each_tree_in_turn_and_compares_them(tmp_path, monkeypatch):
    """Three engines (pristine, patched, patched again) up at once; two rounds over two
    batch sizes; every call answered, the pristine stand-in twice as slow, outputs
    identical, and each runner shut down."""
    pytest.importorskip("torch")  # the bundle's sitecustomize counts syncs in the runner
    monkeypatch.setenv("PK_FAKE_CALL_S", "0.05")
    b = fake_bundle(tmp_path)
    out = tmp_path / "out"
    rc = duel.main(
        [
            *("--out", str(out), "--work", str(tmp_path / "work")),
            *("--engine", f"pristine={b}:9.9:pristine", "--engine", f"patched={b}:9.9:patched"),
            *("--engine", f"patched-again={b}:9.9:patched"),
            *("--batch-sizes", "1,4", "--rounds", "2", "--max-new-tokens", "8", "--start-timeout", "240"),
            *("--engine-extra", '{"cuda_graph_max_bs": 2}', "--attention-backend", "triton"),
        ]
    )
    result = json.loads((out / "duel.json").read_text())
    assert rc == 0, [(out / f"engine-{n}.log").read_text()[-2000:] for n in result["engines"]]
    assert [(c["round"], c["batch_size"], c["engine"]) for c in result["calls"]] == [
        (1, 1, "pristine"),
        (1, 1, "patched"),
        (1, 1, "patched-again"),
        (1, 4, "pristine"),
        (1, 4, "patched"),
        (1, 4, "patched-again"),
        (2, 1, "patched-again"),
        (2, 1, "patched"),
        (2, 1, "pristine"),
        (2, 4, "patched-again"),
        (2, 4, "patched"),
        (2, 4, "pristine"),
    ]
    rows = {(r["batch_size"], r["pair"]): r for r in result["summary"]}
    assert set(rows) == {(bs, p) for bs in (1, 4) for p in ("pristine:patched", "patched:patched-again")}
    assert all(r["identical"] for r in rows.values())
    assert rows[(4, "pristine:patched")]["eager"] and not rows[(1, "pristine:patched")]["eager"]
    assert all(1.5 < x < 2.5 for bs in (1, 4) for x in rows[(bs, "pristine:patched")]["ratios"])
    for name, engine in result["engines"].items():
        assert engine["failure"] is None and engine["ready"]["variant"] == name
    ports = {json.loads((out / f"runner-{n}.json").read_text())["engine_kwargs"]["port"] for n in result["engines"]}
    assert len(ports) == 3
    assert "| 4 | eager | pristine:patched | 2 |" in (out / "duel.md").read_text()
