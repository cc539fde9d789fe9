"""gpu_e2e's host-wait counter on CUDA (issue 53): snippets known to block the host are
counted at their line, snippets known not to block are not (skips cleanly without CUDA).

Each snippet runs in a fresh interpreter with the counter installed before CUDA starts,
as the bundle's sitecustomize installs it in every sglang process; the snippets live in
a file under ``sglang/`` so that their counts carry their own line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU test: no CUDA device"),
]

SNIPPETS = """
import torch

D = "cuda"

def setup():
    global dev, pinned, pageable, lst
    dev = torch.arange(64, device=D)
    pinned = torch.arange(64).pin_memory()
    pageable = torch.arange(64)
    lst = list(range(64))
    torch.cuda.synchronize()

# ---- known to block the host
def item():
    return dev.sum().item()
def tensor_from_list():
    return torch.tensor(lst, device=D)
def pageable_blocking():
    return pageable.to(D)
def pageable_non_blocking():
    return pageable.to(D, non_blocking=True)
def nonzero():
    return dev.nonzero()
def mask_index():
    return dev[dev > 3]
def d2h():
    return dev.cpu()
def stream_sync():
    torch.cuda.current_stream().synchronize()

# ---- known not to block
def pinned_non_blocking():
    return pinned.to(D, non_blocking=True)
def device_math():
    return (dev * 2 + 1).cumsum(0)
def device_copy():
    out = torch.empty_like(dev)
    out.copy_(dev, non_blocking=True)
    return out
def index_select():
    return dev.index_select(0, torch.arange(4, device=D))

# ---- reported: which counter sees it
def event_sync():
    e = torch.cuda.Event()
    e.record()
    e.synchronize()
"""

#: The checkout (the device runs this file with --noconftest: no patchkit imports).
ROOT = Path(__file__).resolve().parents[2]

BLOCKING = (
    "item",
    "tensor_from_list",
    "pageable_blocking",
    "pageable_non_blocking",
    "nonzero",
    "mask_index",
    "d2h",
    "stream_sync",
)
FREE = ("pinned_non_blocking", "device_math", "device_copy", "index_select")

RUN = """
import json, sys
sys.path[:0] = [{root!r}, {tree!r}]
from gpu_e2e import syncs, host_waits
syncs.install({dump!r})
import torch
assert not torch.cuda.is_initialized()  # armed before CUDA started, as in sglang's processes
from sglang.srt import snippets as s
s.setup()
before = syncs.snapshot()["counts"]
for name in {names!r}:
    getattr(s, name)()
counts = syncs.delta(syncs.snapshot()["counts"], before)  # before this script's own waits below
torch.cuda.synchronize()
print(json.dumps({{"counts": counts, "mode": torch.cuda.get_sync_debug_mode()}}))
"""


def _counts(tmp_path, names):
    tree = tmp_path / "tree"
    pkg = tree / "sglang" / "srt"
    pkg.mkdir(parents=True, exist_ok=True)
    for p in (tree / "sglang", pkg):
        (p / "__init__.py").write_text("")
    (pkg / "snippets.py").write_text(SNIPPETS)
    script = RUN.format(root=str(ROOT), tree=str(tree), dump=str(tmp_path / "dump"), names=list(names))
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"},
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["mode"] == 1  # "warn"
    return out["counts"]


def _by_function(counts, kinds):
    out: dict[str, int] = {}
    for key, n in counts.items():
        kind, site = key.split("|", 1)
        if kind in kinds:
            func = site.rsplit(":", 2)[1]
            out[func] = out.get(func, 0) + n
    return out


def test_known_blocking_snippets_are_counted_at_their_line(tmp_path):
    from gpu_e2e import host_waits

    counts = _counts(tmp_path, BLOCKING)
    waits = {}
    for key, n in counts.items():
        kind, site = key.split("|", 1)
        if kind in host_waits.KINDS:
            func = site.rsplit(":", 2)[1]
            waits.setdefault(func, {})[kind] = waits.get(func, {}).get(kind, 0) + n
    print(json.dumps(waits, indent=1, sort_keys=True))
    for name in BLOCKING:
        assert host_waits.blocking_count(waits.get(name, {})) >= 1, (name, waits.get(name))
    # the pageable check sees what torch does not: a non_blocking copy from pageable memory
    assert waits["pageable_non_blocking"].get("h2d-nb") == 1
    assert waits["pageable_blocking"].get("h2d") == 1 and waits["pageable_blocking"].get("sync", 0) >= 1
    assert waits["tensor_from_list"].get("h2d") == 1 and waits["tensor_from_list"].get("sync", 0) >= 1


def test_known_free_snippets_are_not_counted(tmp_path):
    from gpu_e2e import host_waits

    counts = _counts(tmp_path, FREE)
    assert _by_function(counts, host_waits.KINDS) == {}
    assert _by_function(counts, ("cpu", "item", "tolist", "wait")) == {}


def test_event_synchronize_is_the_wrapper_counters(tmp_path):
    """torch does not instrument cudaEventSynchronize: the wrapper's ``wait`` counts it."""
    counts = _counts(tmp_path, ["event_sync"])
    print(json.dumps(counts, indent=1, sort_keys=True))
    assert _by_function(counts, ("wait",)) == {"event_sync": 1}
