"""scripts/test_profile.py: the suite's time per file, kind of work, release and
worker, from what tests/profiling.py writes; and the order it gives the run."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Loaded by path: scripts/ on sys.path would make `gpu_e2e` resolve to scripts/gpu_e2e.py
# for every test module collected after this one.
_SPEC = importlib.util.spec_from_file_location("test_profile_script", ROOT / "scripts" / "test_profile.py")
assert _SPEC and _SPEC.loader
test_profile = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(test_profile)


def write_worker(folder: Path, name: str, spent: dict, span: dict) -> None:
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps({"spent": spent, "span": span}))


def test_report_adds_up_files_kinds_releases_and_workers(tmp_path):
    write_worker(
        tmp_path,
        "gw0",
        {"tests/test_a.py::t[0.5.10]": {"cli apply": 6.0, "copy tree": 1.0}},
        {"tests/test_a.py::t[0.5.10]": [100.0, 110.0], "tests/test_a.py::u": [110.0, 112.0]},
    )
    write_worker(
        tmp_path,
        "gw1",
        {"tests/test_b.py::v[0.5.12.post1-x]": {"cli apply": 2.0}},
        {"tests/test_b.py::v[0.5.12.post1-x]": [100.0, 104.0]},
    )
    text = test_profile.report(tmp_path, top=5)
    assert text.startswith("3 tests, 16 s of test time over 12 s of wall time")
    assert "| gw1 | 4 | 0 | 4 | 8 |" in text  # busy 4 s, idle the last 8 s
    assert "| `tests/test_a.py` | 2 | 12 | 75.0% |" in text
    assert "| cli apply | 8 | 50.0% |" in text and "| other (the tests' own work) | 7 | 43.8% |" in text
    assert "| 0.5.10 | 1 | 10 |" in text and "| 0.5.12.post1 | 1 | 4 |" in text
    assert test_profile.file_seconds(tmp_path) == {"tests/test_a.py": 12.0, "tests/test_b.py": 4.0}


def test_durations_name_only_test_files_that_exist():
    """tests/durations.json orders the run (conftest: longest files first);
    a renamed file left in it would only lose its place, but say so here."""
    seconds = json.loads((ROOT / "tests" / "durations.json").read_text())
    assert seconds and all((ROOT / name).is_file() for name in seconds), [
        n for n in seconds if not (ROOT / n).is_file()
    ]
