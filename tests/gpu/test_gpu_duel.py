"""The duel (issue 67): engines of several trees alive at once, their generates
interleaved round by round, the others frozen; on CPU with the stand-in Engine."""

from __future__ import annotations

import json
import os

import pytest
from fake_engine_bundle import fake_bundle

from gpu_e2e import decode_log, duel, duel_report


def test_the_order_reverses_every_round():
    assert duel.order_of(["a", "b", "c"], 0) == ["a", "b", "c"]
    assert duel.order_of(["a", "b", "c"], 1) == ["c", "b", "a"]


def test_rotated_rounds_put_every_engine_in_every_place():
    """--rotate (after 2026-11-29): over 2n rounds each of n engines runs in each place equally
    often, where ABBA keeps the middle engine in the middle; the first two rounds stay ABBA."""
    names = ["pristine", "patched", "patched-again", "upstream"]
    orders = [duel.order_of(names, r, rotate=True) for r in range(8)]
    assert orders[:2] == [names, names[::-1]] and orders[2] == ["patched", "patched-again", "upstream", "pristine"]
    for name in names:
        places = sorted(o.index(name) for o in orders)
        assert places == [0, 0, 1, 1, 2, 2, 3, 3], (name, places)
    assert all(duel.order_of(names, r) == (names if r % 2 == 0 else names[::-1]) for r in range(8))


def test_an_engine_spec_names_its_bundle_release_and_tree():
    assert duel.parse_engine("upstream=/tmp/b17:0.5.17:upstream") == {
        "name": "upstream",
        "bundle": "/tmp/b17",
        "release": "0.5.17",
        "tree": "upstream",
        "env": {},
    }
    assert duel.parse_engine("on=.:0.5.12.post1:patched:PATCHKIT_X=1,B=a:b")["env"] == {"PATCHKIT_X": "1", "B": "a:b"}
    for bad in ("patched", "x=.:0.5.12.post1", "=.:r:patched", "x=.::patched", "x=.:r:patched:1X=2", "x=.:r:p:"):
        with pytest.raises(SystemExit):
            duel.parse_engine(bad)


def test_the_decode_rate_is_the_steady_batch_of_each_scheduler():
    """Per scheduler (the log prefix): its first line dropped (it spans the frozen time
    before the call), then only the lines at its largest batch (prompts still coming in
    before); milliseconds in the stamp and an iteration count are read too."""
    line = "[2026-11-28 05:50:01{ms} {who}] Decode batch{it}, #running-req: {n}, #token: 5, gen throughput (token/s): {r}, #queue-req: 0"
    text = "\n".join(
        [
            line.format(ms="", who="TP0", it="", n=128, r="9999.00"),
            line.format(ms="", who="TP0", it="", n=100, r="1.00"),
            line.format(ms=".120", who="TP0", it=" [40]", n=128, r="300.00"),
            line.format(ms="", who="TP0", it="", n=128, r="320.00"),
            "[2026-11-28 05:50:01 TP0] Prefill batch, #new-seq: 28, gen throughput (token/s): 5.00",
            line.format(ms="", who="DP1 TP1", it="", n=32, r="50.00"),
            line.format(ms="", who="DP1 TP1", it="", n=32, r="80.00"),
        ]
    )
    assert sorted(decode_log.steady_rates(text)) == [80.0, 300.0, 320.0]
    assert decode_log.summary(text) == {"decode_tok_per_s": 300.0, "decode_lines": 3}
    assert decode_log.summary("no decode here") == {"decode_tok_per_s": None, "decode_lines": 0}
    gc = "\n".join(
        f"[2026-11-28 05:50:01 TP0] GC end: Time 1764300000.0 | Generation {g} | Duration: {d}s | Collected: 3 "
        f"| Uncollectable: 0 {tag}"
        for g, d, tag in ((0, "0.0010", ""), (2, "0.1500", "(LONG GC)"), (0, "0.0020", ""))
    )
    assert decode_log.summary(text + "\n" + gc)["gc"] == {"0": [2, 0.003], "2": [1, 0.15]}


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


def test_a_burst_of_repeats_counts_as_its_median():
    """--repeats (after 2026-11-28g): a round's time of an engine is the median of its burst;
    every repeat's outputs are compared; a run without repeats reads as before."""
    calls = [
        *(_call(1, 64, "pristine", t) | {"repeat": k} for k, t in enumerate((4.0, 2.0, 2.2), 1)),
        *(_call(1, 64, "patched", t) | {"repeat": k} for k, t in enumerate((1.0, 1.1, 5.0), 1)),
        _call(2, 64, "pristine", 2.0),
        _call(2, 64, "patched", 1.0),
    ]
    (row,) = duel_report.summary(calls, [("pristine", "patched")], eager_above=32)
    assert row["ratios"] == [2.2 / 1.1, 2.0] and row["rounds"] == 2 and row["identical"]
    calls[4] = _call(1, 64, "patched", 5.0, sha="other") | {"repeat": 3}
    assert not duel_report.summary(calls, [("pristine", "patched")], eager_above=32)[0]["identical"]


def test_an_engine_starts_with_no_earlier_duels_dumps(tmp_path, monkeypatch):
    """A lane's --work outlives its duels: 2026-11-28d's FlashInfer counted engines read the
    FA3 duel's dumps under the same engine name as their own facts."""
    stale = tmp_path / "work" / "syncs" / "patched-count"
    stale.mkdir(parents=True)
    (stale / "rank0.json").write_text("{}")
    seen = {}
    monkeypatch.setattr(duel.launch, "runner_env", lambda **kw: seen.update(kw) or {})
    monkeypatch.setattr(duel.subprocess, "Popen", lambda *a, **kw: type("P", (), {"pid": 1})())
    args = duel.parser().parse_args(["--out", str(tmp_path), "--work", str(tmp_path / "work"), "--engine", "x=.:r:p"])
    where = {
        "trees": {"patched": tmp_path},
        "site_rel": tmp_path,
        "site_common": tmp_path,
        "bundle": tmp_path,
        "info": {},
    }
    spec = duel.parse_engine("patched-count=.:0.5.12.post1:patched:PK_E2E_COUNTERS_OFF=")
    duel.start(spec, where, args, 0, tmp_path / "work", tmp_path)
    assert seen["sync_dir"] == stale and not stale.exists()


def test_an_engine_that_dies_mid_call_is_recorded_and_the_duel_goes_on(tmp_path):
    """2026-11-28e: DSA pristine died in its first generate; the driver raised EOFError and
    the duel ended with no engine timed."""

    class Gone:
        def send(self, message):
            pass

        def poll(self, timeout):
            return True

        def recv(self):
            raise EOFError

    e = duel.Engine("pristine", type("P", (), {"pid": -1})(), tmp_path / "s", b"", tmp_path / "engine-pristine.log")
    e.conn = Gone()  # type: ignore[assignment]
    e.signal = lambda sig: None  # type: ignore[method-assign]
    assert e.call({"op": "generate", "batch_size": 1}, 1.0) == {
        "error": "engine gone (EOFError); see engine-pristine.log"
    }


def test_the_counted_engines_say_what_they_ran_with():
    facts = {"attn_backend": "NativeSparseAttnBackend", "draft_extend_graph_runner": "EAGLEDraftExtendCudaGraphRunner"}
    result = {
        "engines": {
            "patched": {"ready": {"engine_facts": []}},
            "patched-count": {
                "ready": {"engine_facts": [facts], "ranks_startup": [{"decisions": [False], "tp_rank": 0}]}
            },
            "pristine-count": {
                "ready": {"engine_facts": [{**facts, "draft_extend_graph_runner": None}], "ranks_startup": []}
            },
        }
    }
    assert duel_report.ran_with(result) == [
        {
            "engine": "patched-count",
            "schedulers": 1,
            "attn_backend": ["NativeSparseAttnBackend"],
            "draft_extend_graph_runner": ["EAGLEDraftExtendCudaGraphRunner"],
            "needs_cpu_seq_lens": [False],
        },
        {
            "engine": "pristine-count",
            "schedulers": 1,
            "attn_backend": ["NativeSparseAttnBackend"],
            "draft_extend_graph_runner": ["None"],
            "needs_cpu_seq_lens": [],
        },
    ]
    md = duel_report.markdown(result)
    assert "| patched-count | 1 | NativeSparseAttnBackend | EAGLEDraftExtendCudaGraphRunner | [False] |" in md


@pytest.mark.slow
def test_the_duel_times_each_tree_in_turn_and_compares_them(tmp_path, monkeypatch):
    """Three engines (pristine, patched, patched again) up at once; two rounds over two
    batch sizes (the third engine, with a variable of its own, in the first only); every
    call answered, the pristine stand-in twice as slow, outputs identical, and each runner
    shut down."""
    pytest.importorskip("torch")  # the bundle's sitecustomize counts syncs in the runner
    monkeypatch.setenv("PK_FAKE_CALL_S", "0.1")
    b = fake_bundle(tmp_path)
    out = tmp_path / "out"
    rc = duel.main(
        [
            *("--out", str(out), "--work", str(tmp_path / "work")),
            *("--engine", f"pristine={b}:9.9:pristine", "--engine", f"patched={b}:9.9:patched"),
            *(
                "--engine",
                f"patched-again={b}:9.9:patched:PK_FAKE_MARK=again,SGLANG_LOG_GC=1",
                "--once",
                "patched-again",
            ),
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
        (2, 1, "patched"),
        (2, 1, "pristine"),
        (2, 4, "patched"),
        (2, 4, "pristine"),
    ]
    rows = {(r["batch_size"], r["pair"]): r for r in result["summary"]}
    assert set(rows) == {(bs, p) for bs in (1, 4) for p in ("pristine:patched", "patched:patched-again")}
    assert all(r["identical"] for r in rows.values())
    assert rows[(4, "pristine:patched")]["eager"] and not rows[(1, "pristine:patched")]["eager"]
    # wall time on a loaded CI machine only shows the direction (the stand-in sleeps 0.2 s
    # against 0.1 s); the exact figure is the rate the scheduler's log gave (100 against 200)
    assert all(x > 1 for bs in (1, 4) for x in rows[(bs, "pristine:patched")]["ratios"])
    assert all(rows[(bs, "pristine:patched")]["decode"]["ratios"] == [2.0, 2.0] for bs in (1, 4))
    again = result["engines"]["patched-again"]
    assert again["env"] == {"PK_FAKE_MARK": "again", "SGLANG_LOG_GC": "1"} and again["env_ok"], again
    # its garbage collections as sglang logs them, per call; the other engines log none
    assert duel_report.collections(result["calls"]) == [
        {"engine": "patched-again", "batch_size": bs, "gc_s": [0.05], "gen2": [1], "decode_tok_per_s": [200.0]}
        for bs in (1, 4)
    ]
    assert "env" not in result["engines"]["patched"]
    for name, engine in result["engines"].items():
        assert engine["failure"] is None and engine["ready"]["variant"] == name
    kwargs = [json.loads((out / f"runner-{n}.json").read_text())["engine_kwargs"] for n in result["engines"]]
    assert len({k["port"] for k in kwargs}) == 3 and all(k["nccl_port"] == k["port"] + 50 for k in kwargs)
    assert "| 4 | eager | pristine:patched | 2 |" in (out / "duel.md").read_text()
    assert "| identical | open |" in (out / "duel.md").read_text()  # 2 rounds decide nothing (duel_stats.verdict)
    # sglang's logged decode rate: the first line of each call (its interval reaches back over
    # the frozen time) left out; the steady 100 and 200 tok/s give exactly 2
    assert all(c["decode_tok_per_s"] in (100.0, 200.0) and c["decode_lines"] == 2 for c in result["calls"])
    assert rows[(4, "pristine:patched")]["decode"]["ratios"] == [2.0, 2.0]
    assert rows[(4, "patched:patched-again")]["rounds"] == 1
    # the counters on: every call's decode steps (8 new tokens) and host waits by torch's count (none here)
    waits = duel_report.waits(result["calls"])
    assert {(w["engine"], w["batch_size"], w["decode_steps"], w["per_step"]) for w in waits} >= {
        ("pristine", 4, 16, 0.0),
        ("patched", 1, 16, 0.0),
        ("patched-again", 1, 8, 0.0),
    }
    assert "decode only" in (out / "duel.md").read_text()
    # what /proc says of each call: the engine's own CPU time and the host's (host_usage.py)
    assert all(c["host"]["engine_cpu_s"] >= 0 and c["host"]["host_idle_s"] >= 0 for c in result["calls"])
    assert all(c["host"]["engine_processes"] >= 1 for c in result["calls"])  # the runner at least
    assert "the host a call (/proc)" in (out / "duel.md").read_text()


def test_repeats_run_back_to_back_while_the_engine_is_thawed(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setenv("PK_FAKE_CALL_S", "0.02")
    b = fake_bundle(tmp_path)
    out = tmp_path / "out"
    sent = []
    real = duel.Engine.signal
    monkeypatch.setattr(duel.Engine, "signal", lambda self, sig: (sent.append((self.name, sig)), real(self, sig)))
    rc = duel.main(
        [
            *("--out", str(out), "--work", str(tmp_path / "work")),
            *("--engine", f"pristine={b}:9.9:pristine", "--engine", f"patched={b}:9.9:patched"),
            *("--batch-sizes", "4", "--rounds", "1", "--repeats", "3", "--max-new-tokens", "8"),
            *("--engine-extra", '{"cuda_graph_max_bs": 2}', "--attention-backend", "triton", "--start-timeout", "240"),
        ]
    )
    result = json.loads((out / "duel.json").read_text())
    assert rc == 0
    assert [(c["engine"], c["repeat"]) for c in result["calls"]] == [
        ("pristine", 1),
        ("pristine", 2),
        ("pristine", 3),
        ("patched", 1),
        ("patched", 2),
        ("patched", 3),
    ]
    (row,) = [r for r in result["summary"] if r["pair"] == "pristine:patched"]
    assert row["rounds"] == 1 and row["identical"]
    # in the round, each engine thawed three times and frozen once, after its last repeat
    signals = "".join("c" if s == duel.signal.SIGCONT else "s" for n, s in sent if n == "pristine")
    assert "scccs" in signals and "cc" not in signals.replace("scccs", "s|s")


def test_min_rounds_start_past_the_deadline(tmp_path, monkeypatch):
    """--min-rounds (2026-11-28h): a deadline that falls inside the start-up still lets the
    first rounds run; the rounds after them keep to it."""
    pytest.importorskip("torch")
    monkeypatch.setenv("PK_FAKE_CALL_S", "0.02")
    b = fake_bundle(tmp_path)
    out = tmp_path / "out"
    rc = duel.main(
        [
            *("--out", str(out), "--work", str(tmp_path / "work")),
            *("--engine", f"pristine={b}:9.9:pristine", "--engine", f"patched={b}:9.9:patched"),
            *("--batch-sizes", "4", "--rounds", "3", "--max-new-tokens", "8", "--deadline-s", "1"),
            *("--min-rounds", "2", "--engine-extra", '{"cuda_graph_max_bs": 2}', "--attention-backend", "triton"),
            *("--cpus", str(min(os.sched_getaffinity(0)))),
        ]
    )
    result = json.loads((out / "duel.json").read_text())
    assert rc == 0 and sorted({c["round"] for c in result["calls"]}) == [1, 2]
    # --cpus: each engine's threads held to the CPU asked once it was up
    for engine in result["engines"].values():
        assert engine["pinned"]["cpus"] == str(min(os.sched_getaffinity(0))) and engine["pinned"]["threads"] >= 1
    assert f"- patched: held to CPUs {min(os.sched_getaffinity(0))} (" in (out / "duel.md").read_text()
