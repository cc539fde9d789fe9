"""docs/results/ kept small (issue 70): gpu_e2e.evidence's compact results and trimmed logs
read back the same, and what is committed is kept that way."""

from __future__ import annotations

import json
import subprocess

import pytest

from gpu_e2e import engine_facts, evidence, tables
from gpu_e2e.bundle import repo_root

RESULTS = repo_root() / "docs" / "results"
#: docs/results/ in bytes, at most (2.0 MB after issue 70; the repository's budget is below).
BUDGET = 4_000_000
#: Issue 70: the tracked files of the whole repository at most 10 MiB, each counted in the
#: 4 KiB blocks it takes on disk.
REPOSITORY = 10 * 1024 * 1024
BLOCK = 4096

LOG = """[2026-11-27 01:00:00] starting
===== 0.5.17/small/default/r1/upstream =====
[2026-11-27 01:00:01] Capture target prefill CUDA graph begin. backend=breakable, bs=[1]
[2026-11-27 01:00:02] noise line 1
[2026-11-27 01:00:03] Capture cuda graph bs [1, 8]
[2026-11-27 01:00:04] Engine startup timings (s): total=9.1, cuda_graph={prefill=3.70, decode=0.00}, x=1
===== 0.5.12.post1/small/default/r1/patched =====
[2026-11-27 01:00:05] Scheduler hit an exception: Traceback (most recent call last):
  File "scheduler.py", line 1, in <module>
ImportError: DeepEP is not installed.
[2026-11-27 01:00:06] noise line 2
[runner] engine failed: RuntimeError: Rank 0 scheduler died during initialization
"""


def test_compact_hashes_each_request_and_keeps_which_are_equal(tmp_path):
    data = {"runs": {"a": {"batches": [{"output_ids": [[1, 2], [1, 2], [3]], "tok_per_s": 1.5}]}}, "args": {"x": 1}}
    path = tmp_path / "results.json"
    path.write_text(json.dumps(data, indent=1))
    before, after = evidence.compact(path)
    assert after < before
    got = json.loads(path.read_text())
    ids = got["runs"]["a"]["batches"][0]["output_ids"]
    assert ids[0] == ids[1] != ids[2] and all(len(r) == 1 and len(r[0]) == 16 for r in ids)
    assert got["runs"]["a"]["batches"][0]["tok_per_s"] == 1.5 and got["args"] == {"x": 1}
    text = path.read_text()
    evidence.compact(path)
    assert path.read_text() == text  # a second pass changes nothing


def test_compact_packs_a_duels_calls_into_one_table_read_back_as_written(tmp_path):
    calls = [
        {"round": 1, "engine": "patched", "elapsed_s": 0.25, "host": {"engine_cpu_s": 0.3, "host_steal_s": 0.0}},
        {"round": 1, "engine": "pristine", "error": "RuntimeError: died", "decode_tok_per_s": None},
    ]
    duel = {"engines": {}, "summary": [], "calls": calls}
    path = tmp_path / "duel.json"
    path.write_text(json.dumps(duel))
    evidence.compact(path)
    table = json.loads(path.read_text())["calls_table"]
    assert table["fields"] == [
        "round",
        "engine",
        "elapsed_s",
        "host.engine_cpu_s",
        "host.host_steal_s",
        "error",
        "decode_tok_per_s",
    ]
    assert table["rows"][1] == [1, "pristine", "~", "~", "~", "RuntimeError: died", None]
    assert evidence.read_json(path) == duel
    text = path.read_text()
    evidence.compact(path)
    assert path.read_text() == text
    # an empty host would not come back: those calls stay records
    path.write_text(json.dumps({**duel, "calls": [{"round": 1, "host": {}}]}))
    evidence.compact(path)
    assert json.loads(path.read_text())["calls"] == [{"round": 1, "host": {}}]


def test_compact_keeps_of_a_duel_engines_ready_record_what_is_read(tmp_path):
    ready = {"engine_facts": [], "size": "8b", "engine_kwargs": {"port": 1}, "sglang_file": "/tmp/x"}
    path = tmp_path / "duel.json"
    path.write_text(json.dumps({"engines": {"patched": {"failure": None, "ready": ready}}}))
    evidence.compact(path)
    engine = json.loads(path.read_text())["engines"]["patched"]
    assert engine == {"failure": None, "ready": {"engine_facts": [], "size": "8b"}}


def test_compact_cuts_a_duel_calls_digest_and_drops_its_unread_fields(tmp_path):
    call = {"engine": "patched", "outputs_sha256": "ab" * 32, "accept_length": 1.0, "verify_ct": 8, "decode_lines": 1}
    path = tmp_path / "duel.json"
    path.write_text(json.dumps({"calls": [call, dict(call, outputs_sha256="cd" * 32)]}))
    evidence.compact(path)
    calls = json.loads(path.read_text())["calls"]
    assert calls == [
        {"engine": "patched", "outputs_sha256": "ab" * 8, "accept_length": 1.0},
        {"engine": "patched", "outputs_sha256": "cd" * 8, "accept_length": 1.0},
    ]
    text = path.read_text()
    evidence.compact(path)
    assert path.read_text() == text


def test_trim_log_keeps_what_is_read_back(tmp_path):
    path = tmp_path / "engine.log"
    path.write_text(LOG)
    evidence.trim_log(path)
    text = path.read_text()
    assert "noise" not in text and evidence.read_back(text) == evidence.read_back(LOG)
    patched = text.split("===== 0.5.12.post1/small/default/r1/patched =====")[1]
    assert engine_facts.failure_line(patched) == "ImportError: DeepEP is not installed."
    upstream = engine_facts.log_facts(text.split("=====")[2])
    assert upstream["graph_captures"] == {"target prefill": "breakable"} and upstream["cuda_graph_capture"] == 1


def test_trim_log_refuses_to_drop_a_line_read_back(tmp_path, monkeypatch):
    monkeypatch.setattr(evidence, "KEEP", [])  # the capture lines would go
    path = tmp_path / "engine.log"
    path.write_text(LOG)
    with pytest.raises(SystemExit, match="left as it was"):
        evidence.trim_log(path)
    assert path.read_text() == LOG


def test_committed_results_are_compact_and_within_the_budget():
    total = 0
    for path in sorted(p for p in RESULTS.rglob("*") if p.is_file()):
        total += path.stat().st_size
        if path.suffix != ".json" or path.name == "plan-args.json":
            continue
        raw = path.read_text(encoding="utf-8")
        assert "\n " not in raw, f"{path}: indented (python -m gpu_e2e.evidence compact)"
        assert evidence.hash_output_ids(json.loads(raw)) == json.loads(raw), f"{path}: output ids not hashed"
        assert evidence.pack_calls(json.loads(raw)) == json.loads(raw), f"{path}: a duel's calls not packed"
        assert evidence.pack_digests(json.loads(raw)) == json.loads(raw), f"{path}: a tree's digests written twice"
    assert total <= BUDGET, total


def test_the_tracked_files_stay_within_the_repository_budget():
    root = repo_root()
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=False)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    paths = [root / name for name in listed.stdout.decode().split("\0") if name]
    total = sum(-(-p.stat().st_size // BLOCK) * BLOCK for p in paths if p.is_file())
    assert total <= REPOSITORY, total


def test_no_committed_table_is_a_copy_of_its_json(capsys):
    """table.md, speed.md and ranks.md that ``gpu_e2e.tables`` prints again from the
    results.json beside them are copies: not committed (docs/results/README.md). Those
    left are runs whose JSON was compacted before the printer could print them again."""
    assert [str(p.relative_to(RESULTS)) for p in tables.copies(RESULTS)] == []
    step = RESULTS / "gpu-hw-2026-11-26" / "s12-fa3"
    assert not (step / "table.md").exists()
    assert tables.main([str(step)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# table.md\n\n| release |") and "# speed.md\n" in out
    assert tables.main([str(RESULTS)]) == 2 and "usage" in capsys.readouterr().err


def test_settings_are_one_file_a_run():
    """Each step's settings table is a section of its run's settings.md (one file, not one a
    step: a file a step cost a 4 KiB block for some 500 bytes)."""
    assert [str(p.relative_to(RESULTS)) for p in RESULTS.glob("*/*/**/settings.md")] == []
    for path in RESULTS.glob("*/settings.md"):
        assert path.read_text().count("\n## ") >= 1, path


def test_an_engine_with_an_earlier_engines_tree_names_it_and_reads_back_whole(tmp_path):
    tree = {"srt/a.py": "aa", "srt/b.py": "bb"}
    duel = {
        "engines": {},
        "summary": [],
        "calls": [],
        "patched_files_sha256": {"pristine": {}, "patched": tree, "again": dict(tree), "other": {"srt/a.py": "cc"}},
    }
    path = tmp_path / "duel.json"
    path.write_text(json.dumps(duel, indent=1))
    evidence.compact(path)
    packed = json.loads(path.read_text())["patched_files_sha256"]
    assert packed == {"pristine": {}, "patched": tree, "again": "=patched", "other": {"srt/a.py": "cc"}}
    assert evidence.read_json(path) == duel
    text = path.read_text()
    evidence.compact(path)
    assert path.read_text() == text
