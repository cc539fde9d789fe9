"""Issue 57's sixth lease, second machine: the decode alone, patched 0.5.12.post1 against
upstream 0.5.17 at the 8B shape on one H200 (docs/results/gpu-decode-only-2026-11-27/,
docs/gpu.md "At a glance"). Every batch also timed the same prompts asking one token
(timed_calls.first_token_runs); the decode-only ratio is read beside the whole generate's.
Every committed figure is recomputed from the committed JSON. No GPU needed."""

from __future__ import annotations

import json
import statistics

from gpu_e2e import yardstick
from gpu_e2e.bundle import repo_root
from gpu_e2e.report import tree_digest

RUN = repo_root() / "docs" / "results" / "gpu-decode-only-2026-11-27"
GPU_MD = repo_root() / "docs" / "gpu.md"


def test_the_committed_tables_are_recomputed_from_the_json():
    assert yardstick.report(RUN)  # the whole report prints again (python -m gpu_e2e.yardstick FOLDER)
    decode = yardstick.decode_markdown(yardstick.rows(RUN))
    medians = decode.rstrip("\n").split("\n\n")[1]
    assert medians in GPU_MD.read_text(), "docs/gpu.md's decode-only table is not the one the JSON gives"


def test_the_decode_alone_is_at_or_above_0_98_in_every_cell():
    table = [r for r in yardstick.rows(RUN) if yardstick.decode_ratio(r) is not None]
    assert len(table) == 9 and all(r["same_machine"] for r in table)  # FA3 r1; Triton r1, r2
    for r in table:
        assert r["identical_requests"][0] == r["batch_size"]  # token for token, against 0.5.17
    medians = {k: statistics.median(yardstick.decode_ratio(r) for r in rs) for k, rs in yardstick.by_cell(table)}
    assert round(min(medians.values()), 3) == 0.981 and all(m >= 0.98 for m in medians.values())


def test_every_call_ran_the_tree_and_bundle_gpu_md_names():
    for path in sorted(RUN.glob("*-b1[27]/results.json")):
        data = json.loads(path.read_text())
        assert data["patchkit_commit"].startswith("c9a3e78") and data["device"].startswith("NVIDIA H200")
        if path.parent.name.endswith("b12"):
            files = data["trees"]["0.5.12.post1"]["patched_files_sha256"]
            assert tree_digest(files) == "f9d514b5bccb3c29", path
    text = GPU_MD.read_text()
    assert "c9a3e78" in text and "gpu-decode-only-2026-11-27" in text
