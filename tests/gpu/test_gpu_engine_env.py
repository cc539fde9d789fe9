"""--engine-env (issue 67): variables for every engine process, read back from each scheduler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_e2e import call_options, engine_env, launch, ranks, syncs

ROOT = Path(__file__).resolve().parents[2]
ASKED = {"PATCHKIT_CHECK_SEQ_LEN_BOUND": "1", "PATCHKIT_SEQ_LEN_BOUND": "static"}


def test_the_option_repeats_and_parses_into_a_mapping():
    args = call_options.parser().parse_args(
        ["--engine-env", "PATCHKIT_CHECK_SEQ_LEN_BOUND=1", "--engine-env", "PATCHKIT_SEQ_LEN_BOUND=static"]
    )
    assert engine_env.parse(args.engine_env) == ASKED
    assert engine_env.parse(call_options.parser().parse_args([]).engine_env) == {}
    assert engine_env.parse(["A=x=y"]) == {"A": "x=y"}  # the first = splits
    for bad in ("NOVALUE", "=1", "1A=2", "A B=1"):
        with pytest.raises(SystemExit):
            engine_env.parse([bad])


def test_the_runner_env_gets_the_variables_and_their_keys():
    assert engine_env.for_runner({}) == {}
    assert engine_env.for_runner(ASKED) == {
        **ASKED,
        engine_env.ENV_KEYS: "PATCHKIT_CHECK_SEQ_LEN_BOUND,PATCHKIT_SEQ_LEN_BOUND",
    }


def test_the_orchestrator_puts_them_in_every_runners_environment_and_checks_them():
    src = (ROOT / "gpu_e2e" / "orchestrate.py").read_text()
    assert "asked_env = engine_env.parse(args.engine_env)" in src
    assert "engine_env.problems(key, asked_env, res)" in src
    # launch.runner_env builds every runner's environment (orchestrate's and duel's)
    env = launch.runner_env(
        tree=Path("/t/patched"),
        tree_name="patched",
        site_rel=Path("/s/rel"),
        site_common=Path("/s/common"),
        bundle=Path("/b"),
        info={"runtime_mode": "package", "env": {"X_RELEASE": "1"}},
        sync_dir=Path("/w/syncs"),
        asked_env=ASKED,
    )
    assert {k: env[k] for k in ASKED} == ASKED
    assert env["PYTHONPATH"].split(os.pathsep) == ["/t/patched", "/b/runtime", "/s/rel", "/s/common", "/b/e2e"]
    assert env["X_RELEASE"] == "1" and env["SGLANG_ENABLE_SPEC_V2"] == "1"
    assert "engine_env.seen(ranks.read(sync_dir), ranks.rank_of)" in (ROOT / "gpu_e2e" / "runner.py").read_text()


def test_a_child_process_with_the_bundles_sitecustomize_notes_what_it_sees(tmp_path):
    """A fresh interpreter, as sglang's scheduler is: the sync recorder (counters off, as the
    speed runs) notes the asked variables in its dump."""
    site = tmp_path / "e2e"
    pkg = site / "pk_gpu_e2e"
    pkg.mkdir(parents=True)
    for f in (ROOT / "gpu_e2e").glob("*.py"):
        (pkg / f.name).write_text(f.read_text())
    (site / "sitecustomize.py").write_text((ROOT / "gpu_e2e" / "sitecustomize.py.in").read_text())
    sync_dir = tmp_path / "syncs"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PK_E2E") and k != "PYTHONPATH"}
    env.update(
        PYTHONPATH=str(site),
        PK_E2E_SYNC_DIR=str(sync_dir),
        PK_E2E_COUNTERS_OFF="1",
        **engine_env.for_runner(ASKED),
    )
    proc = subprocess.run(
        [sys.executable, "-c", "import pk_gpu_e2e.syncs as s; s.flush(True)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    dumps = syncs.read_dir(str(sync_dir))
    assert [d["notes"][engine_env.NOTE] for d in dumps] == [ASKED]


def _dump(rank, env, pid):
    notes = {} if env is None else {engine_env.NOTE: env}
    if rank is not None:
        notes[ranks.RANK_NOTE] = {"tp_rank": rank}
    return {"pid": pid, "notes": notes}


def test_seen_names_schedulers_by_rank_the_rest_by_pid_and_problems_name_who_saw_otherwise():
    dumps = [_dump(None, ASKED, 10), _dump(0, ASKED, 11), _dump(1, {**ASKED, "PATCHKIT_SEQ_LEN_BOUND": None}, 12)]
    dumps.append(_dump(None, None, 13))  # a process that noted nothing (started before the recorder)
    got = engine_env.seen(dumps, ranks.rank_of)
    assert set(got) == {"pid 10", "rank 0", "rank 1"}
    run = {"batches": [{}], "engine_env_seen": got}
    (problem,) = engine_env.problems("0.5.12.post1/small/fa3/patched", ASKED, run)
    assert "rank 1 saw" in problem and "'PATCHKIT_SEQ_LEN_BOUND': None" in problem
    json.dumps(got)  # results.json keeps it


def test_with_the_counters_off_the_processes_appear_by_pid_and_two_must_have_noted():
    """Counters off (the speed runs): no rank is noted, so the processes appear by pid."""
    got = engine_env.seen([_dump(None, ASKED, 10), _dump(None, ASKED, 11)], ranks.rank_of)
    assert got == {"pid 10": ASKED, "pid 11": ASKED}
    assert engine_env.problems("k", ASKED, {"batches": [{}], "engine_env_seen": got}) == []
    only_runner = {"batches": [{}], "engine_env_seen": {"pid 10": ASKED}}
    assert "1 process(es) noted" in engine_env.problems("k", ASKED, only_runner)[0]
    assert "0 process(es) noted" in engine_env.problems("k", ASKED, {"batches": [{}]})[0]
    assert engine_env.problems("k", {}, {"batches": [{}]}) == []  # nothing asked, nothing checked
    assert engine_env.problems("k", ASKED, {"batches": []}) == []  # an engine that did not run says so itself
