"""One more generate of a batch under sglang's own profiler (issue 57, ``--profile-batch``).

Both 0.5.12.post1 and 0.5.17 take the same keywords in ``Engine.start_profile(**kwargs)``
(0.5.12.post1 hands them to ``TokenizerManager.start_profile``, 0.5.17 builds a
``ProfileReq`` of them): ``output_dir`` (else ``SGLANG_TORCH_PROFILER_DIR``, else /tmp),
``num_steps``, ``activities``, ``with_stack``, ``record_shapes``, ``profile_by_stage``.
With ``profile_by_stage`` and ``num_steps`` N, each scheduler profiles its prefill batches
into ``...-TP-<rank>-EXTEND.trace.json.gz``, then, from its first decode batch, N decode
batches into ``...-TP-<rank>-DECODE.trace.json.gz`` and stops by itself (one decode batch
is one speculative step: draft and verify). ``stop_profile`` afterwards then answers "not
in progress", which is how the stop is told apart from one by hand (fewer decode batches
than N: the trace has no stage suffix and its step count is not known).

Activities CPU and GPU (the host's events span the window, so idle lead-in and tail
count), no stacks, no shapes (both would slow the host under measurement). The profiler
still costs host time: busy fractions under it are lower bounds of the unprofiled ones.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from . import profile_trace

OPTIONS = {"activities": ["CPU", "GPU"], "with_stack": False, "record_shapes": False, "profile_by_stage": True}


def batch_sizes(spec) -> frozenset[int]:
    """``--profile-batch``'s batch sizes: ``"16"``, ``"8,16"`` (or an int); 0 or "" is none."""
    return frozenset(int(x) for x in str(spec).split(",") if x.strip() and int(x) > 0)


def steps_to_profile(asked: int, decode_steps: int | None, runs: int) -> int:
    """``asked`` decode steps, fewer when a timed generate had no more than ``asked`` + 2:
    the profile must stop by itself (the N+1-th decode batch) for its step count to hold."""
    per_call = (decode_steps or 0) // runs if runs else 0
    return max(1, min(asked, per_call - 2)) if per_call > 2 else asked


def profiled_generate(engine, generate, requests, trace_dir: Path, steps: int, label: str) -> dict:
    """Profile one ``generate(engine, requests)`` (see the module doc) into ``trace_dir``
    and summarize its decode traces, with a console ``line`` starting with ``label``. A
    profiler that fails is a note in the result, not an exception."""
    trace_dir = Path(trace_dir)
    if trace_dir.exists():
        shutil.rmtree(trace_dir)
    trace_dir.mkdir(parents=True)
    options = {**OPTIONS, "output_dir": str(trace_dir), "num_steps": steps}
    out: dict = {"options": options, "trace_dir": str(trace_dir)}
    try:
        engine.start_profile(**options)
        t = time.perf_counter()
        generate(engine, requests)
        out["elapsed_s"] = round(time.perf_counter() - t, 4)
    except Exception as exc:  # noqa: BLE001  the timed results stand without a profile
        out["error"] = (f"{type(exc).__name__}: {exc}".splitlines() or ["?"])[0]
        out["line"] = f"{label}: profile failed: {out['error']}"
        return out
    try:
        engine.stop_profile()
        out["stopped_by"] = "stop_profile"
    except RuntimeError as exc:  # "Profiling is not in progress": num_steps stopped it
        out["stopped_by"] = "num_steps" if "not in progress" in str(exc) else f"stop_profile: {exc}"
    known = steps if out["stopped_by"] == "num_steps" else None
    out.update(profile_trace.summarize_dir(trace_dir, steps=known))
    out["line"] = profile_trace.line(label, out)
    return out
