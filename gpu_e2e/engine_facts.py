"""What an engine actually ran with, read back from its own processes and its log.

The settings the harness passes are not the settings in force: ``ServerArgs``
fills in and overrides (piecewise CUDA graph turned off for some features, the
attention backend chosen per GPU when none is named), and graph runners exist or
not by the backend's and the draft's shape. So each scheduler process notes, at the
end of ``Scheduler.__init__`` (hooked as :mod:`.ranks` hooks it, in every process the
bundle's ``sitecustomize.py`` starts in), what it holds:

* ``server_args``: ``disable_piecewise_cuda_graph``, ``attention_backend`` (and the
  prefill / decode overrides), the load formats;
* the target model runner: its piecewise CUDA-graph runner's class (None: no
  piecewise graph), its decode CUDA-graph runner's and attention backend's classes,
  its context length;
* 0.5.17's graph runners, which replace the piecewise one: the target's and the draft's
  ``prefill_cuda_graph_runner`` (its backend, ``cuda_graph_config.prefill.backend``:
  ``breakable`` by default, ``tc_piecewise``, ``disabled``), the target's
  ``decode_cuda_graph_runner`` (spec's target verify), the draft worker's
  ``cuda_graph_runner`` (draft decode);
* the draft worker (spec v2's ``EagleDraftWorker`` inside ``EAGLEWorkerV2``, or v1's
  ``EAGLEWorker``): its model runner's piecewise runner (none expected: draft runners
  build no piecewise graphs), its draft-extend CUDA-graph runner's class (None: draft
  extend runs eagerly), its draft-extend attention backend's class, and the shape of its
  ``hot_token_id`` (None: the draft has no token map).

Nothing here reads a CUDA tensor's value (only classes and shapes), so nothing
here syncs. :func:`log_facts` adds the engine log's own lines (rank 0 logs them).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Optional

from . import ranks, syncs

NOTE = "engine"
SERVER_FIELDS = (
    "disable_piecewise_cuda_graph",
    "enforce_piecewise_cuda_graph",
    "enable_piecewise_cuda_graph",  # 0.5.4 … 0.5.9's only switch (off by default)
    "attention_backend",
    "prefill_attention_backend",
    "decode_attention_backend",
    "load_format",
    "speculative_draft_load_format",
    "disable_cuda_graph",
    "speculative_algorithm",
    # issue 44: MLA page size, tree drafts, the captured batch size
    "page_size",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "speculative_num_steps",
    "cuda_graph_max_bs",
    "max_running_requests",
    "moe_runner_backend",
    # 0.5.17's names for the piecewise switches and the captured batch size
    # (server_args_names.py)
    "cuda_graph_backend_prefill",
    "cuda_graph_max_bs_decode",
)
#: Engine log lines that show a graph being captured (sglang logs them on rank 0),
#: counted whatever their case (0.5.17 writes "CUDA graph" where 0.5.12 wrote "cuda graph").
LOG_LINES = {
    "piecewise_capture": "Capture piecewise CUDA graph begin",
    "draft_extend_capture": "Capture draft extend cuda graph begin",
    "cuda_graph_capture": "Capture cuda graph bs",
    "draft_load_format": "Using draft model load_format",
}
#: 0.5.17's capture lines name the role, the phase and the backend
#: (``model_runner_components/cuda_graph_setup.py``, ``eagle_worker_v2.py``):
#: "Capture target prefill CUDA graph begin. backend=breakable, ...".
_CAPTURE = re.compile(r"Capture (target|draft) (prefill|decode|verify|extend) CUDA graph begin\. backend=(\w+)")
#: 0.5.17's "Engine startup timings (s): ..., cuda_graph={prefill=3.70, decode=0.00, ...}, ...".
_STARTUP_GRAPHS = re.compile(r"Engine startup timings \(s\):.*?cuda_graph=\{([^}]*)\}")
_MARK = "__pk_e2e_engine_facts__"


def install() -> None:
    syncs.on_import(ranks.SCHEDULER_MODULE, _hook_scheduler)
    from . import tree_mask_probe

    tree_mask_probe.install()  # issue 44: which verify tree mask each draft step used


def _hook_scheduler(module: Any) -> None:
    cls = getattr(module, "Scheduler", None)
    original = getattr(cls, "__init__", None)
    if original is None or getattr(original, _MARK, False):
        return

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        try:
            syncs.note(NOTE, facts_of_scheduler(self))
        except Exception as exc:  # noqa: BLE001  a fact missed must not stop the engine
            syncs.note(NOTE, {"error": repr(exc)})

    setattr(init, _MARK, True)
    init.__pk_e2e_wrapped__ = getattr(original, "__pk_e2e_wrapped__", False)  # type: ignore[attr-defined]
    init.__name__, init.__qualname__, init.__doc__ = original.__name__, original.__qualname__, original.__doc__
    cls.__init__ = init  # type: ignore[misc]


def _cls(obj: Any) -> Optional[str]:
    return None if obj is None else type(obj).__name__


def facts_of_scheduler(scheduler: Any) -> dict:
    sa = scheduler.server_args
    out: dict = {f: _plain(getattr(sa, f, None)) for f in SERVER_FIELDS}
    out["tp_rank"] = ranks.process_tp_rank()
    runner = getattr(getattr(scheduler, "tp_worker", None), "model_runner", None)
    if runner is not None:
        out["piecewise_runner"] = _cls(getattr(runner, "piecewise_cuda_graph_runner", None))
        out["cuda_graph_runner"] = _cls(getattr(runner, "graph_runner", None))
        out["attn_backend"] = _cls(getattr(runner, "attn_backend", None))
        out["context_len"] = getattr(getattr(runner, "model_config", None), "context_len", None)
        out["model"] = _cls(getattr(runner, "model", None))
        out["prefill_graph_runner"] = _cls(getattr(runner, "prefill_cuda_graph_runner", None))  # 0.5.17
        out["decode_graph_runner"] = _cls(getattr(runner, "decode_cuda_graph_runner", None))
    config = getattr(sa, "cuda_graph_config", None)  # 0.5.17; None before
    for phase in ("prefill", "decode"):
        out[f"{phase}_graph_backend"] = _plain(getattr(getattr(config, phase, None), "backend", None))
    worker = getattr(scheduler, "draft_worker", None)
    inner = getattr(worker, "_draft_worker", worker)  # spec v2 wraps the draft worker
    if inner is not None:
        out["draft_worker"] = _cls(inner)
        draft_runner = next(
            (
                r
                for r in (getattr(inner, n, None) for n in ("draft_runner", "draft_model_runner", "model_runner"))
                if r is not None
            ),
            None,
        )
        out["draft_piecewise_runner"] = _cls(getattr(draft_runner, "piecewise_cuda_graph_runner", None))
        out["draft_extend_graph_runner"] = _cls(getattr(inner, "cuda_graph_runner_for_draft_extend", None))
        out["draft_prefill_graph_runner"] = _cls(getattr(draft_runner, "prefill_cuda_graph_runner", None))
        out["draft_decode_graph_runner"] = _cls(getattr(inner, "cuda_graph_runner", None))
        out["draft_extend_attn_backend"] = _cls(getattr(inner, "draft_extend_attn_backend", None))
        out["draft_model"] = _cls(getattr(draft_runner, "model", None))
        hot = getattr(inner, "hot_token_id", None)
        shape = getattr(hot, "shape", None)
        out["hot_token_id_shape"] = (
            None if hot is None else [int(n) for n in shape] if shape is not None else [len(hot)]
        )
    return out


def _plain(value: Any) -> Any:
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)


# ----------------------------------------------------------------- reading side


def from_dumps(dumps: Iterable[Mapping]) -> list[dict]:
    """Every scheduler process's facts, by TP rank."""
    got = [(d.get("notes") or {}).get(NOTE) for d in dumps]
    return sorted((f for f in got if f), key=lambda f: (f.get("tp_rank") is None, f.get("tp_rank") or 0))


def log_facts(text: str) -> dict:
    """How often each line of :data:`LOG_LINES` appears in one engine's log; where the
    release logs them (0.5.17), ``graph_captures`` (``"target prefill": "breakable"``,
    one per capture line) and ``graph_startup_s`` (the startup timings' ``cuda_graph``)."""
    lower = text.lower()
    out: dict = {key: lower.count(line.lower()) for key, line in LOG_LINES.items()}
    captures = {f"{role} {phase}": backend for role, phase, backend in _CAPTURE.findall(text)}
    if captures:
        out["graph_captures"] = captures
    timings = _STARTUP_GRAPHS.search(text)
    if timings:
        out["graph_startup_s"] = {
            k.strip(): float(v) for k, _, v in (item.partition("=") for item in timings.group(1).split(",")) if v
        }
    return out


def _piecewise_switched_off(facts: Mapping) -> bool:
    """Whether the server arguments turned piecewise CUDA graph off: 0.5.10+ name
    ``disable_piecewise_cuda_graph``; 0.5.4 … 0.5.9 have only ``enable_…`` (off unless set)."""
    if facts.get("disable_piecewise_cuda_graph") is not None:
        return bool(facts["disable_piecewise_cuda_graph"])
    return not facts.get("enable_piecewise_cuda_graph")


def graph_setup(run: Mapping) -> Optional[dict]:
    """0.5.17's graphs, ``{"target prefill": "breakable", "draft decode": "full", ...}``:
    from the engine log's capture lines, else from the runners the schedulers noted
    (``prefill_graph_backend`` for the prefill backend). None on a release before 0.5.17,
    whose piecewise runner :func:`in_force` reads instead."""
    captures = (run.get("engine_log") or {}).get("graph_captures")
    if captures is not None:
        return dict(captures)
    procs = run.get("engine_facts") or []
    if not procs or any(p.get("prefill_graph_backend") is None for p in procs):
        return None
    p = procs[0]
    runners = {
        "target prefill": "prefill_graph_runner",
        "target verify": "decode_graph_runner",
        "draft prefill": "draft_prefill_graph_runner",
        "draft decode": "draft_decode_graph_runner",
        "draft extend": "draft_extend_graph_runner",
    }
    return {
        phase: p["prefill_graph_backend" if phase.endswith("prefill") else "decode_graph_backend"]
        for phase, key in runners.items()
        if "CudaGraph" in str(p.get(key))
    }


def _graphs_text(graphs: Mapping, seconds: Mapping) -> str:
    """``target prefill breakable 3.70 s, ...``: each capture with its startup time."""

    def took(phase: str) -> str:
        role, _, step = phase.partition(" ")
        s = seconds.get(step if role == "target" and step in ("prefill", "decode") else f"{role}_{step}")
        return "" if s is None else f" {s:.2f} s"

    return ", ".join(f"{phase} {backend}{took(phase)}" for phase, backend in graphs.items()) or "none"


def _prefill_graph_in_force(graphs: Mapping) -> str:
    """0.5.17's target prefill graph, the piecewise one's successor (``--disable-piecewise-
    cuda-graph`` sets its backend to ``disabled``): ``on (breakable)``, or ``off``."""
    backend = graphs.get("target prefill")
    return f"on ({backend})" if backend and backend != "disabled" else "off"


def in_force(run: Mapping) -> dict:
    """One run's settings in force, over its scheduler processes: a value all agree
    on, or ``"mixed: a, b"``; ``"?"`` where no process noted facts. On 0.5.17
    (:func:`graph_setup`), piecewise is its target prefill graph and the piecewise runners
    are its prefill graph runners ("?" where the schedulers did not note them)."""
    procs = run.get("engine_facts") or []
    log = run.get("engine_log") or {}
    graphs = graph_setup(run)

    def agreed(key: str) -> Any:
        values = sorted({str(p.get(key)) for p in procs})
        return "?" if not values else values[0] if len(values) == 1 else "mixed: " + ", ".join(values)

    def runner(before: str, since_017: str) -> Any:
        if graphs is None:
            return agreed(before)
        return agreed(since_017) if procs and all(since_017 in p for p in procs) else "?"

    return {
        "processes": len(procs),
        "piecewise": (
            _prefill_graph_in_force(graphs)
            if graphs is not None
            else "?"
            if not procs
            else "on"
            if all(not _piecewise_switched_off(p) and p.get("piecewise_runner") for p in procs)
            else "off"
            if all(_piecewise_switched_off(p) and not p.get("piecewise_runner") for p in procs)
            else "mixed"
        ),
        "piecewise_runner": runner("piecewise_runner", "prefill_graph_runner"),
        "draft_piecewise_runner": runner("draft_piecewise_runner", "draft_prefill_graph_runner"),
        "graphs": "–" if graphs is None else _graphs_text(graphs, log.get("graph_startup_s") or {}),
        "attention_backend": agreed("attention_backend"),
        "attn_backend": agreed("attn_backend"),
        "draft_extend_graph_runner": agreed("draft_extend_graph_runner"),
        "hot_token_id_shape": agreed("hot_token_id_shape"),
        "context_len": agreed("context_len"),
        "page_size": agreed("page_size"),
        "topk": agreed("speculative_eagle_topk"),
        "model": agreed("model"),
        "draft_model": agreed("draft_model"),
        "log_piecewise_capture": log.get("piecewise_capture"),
        "log_draft_extend_capture": log.get("draft_extend_capture"),
    }


def backend_in_force(run: Mapping, asked: str) -> str:
    """The attention backend the run's schedulers used (``asked`` when none noted)."""
    value = in_force(run)["attention_backend"]
    return asked if value in ("?", "None") or value.startswith("mixed") else value


SETTINGS_HEADER = (
    "| run | piecewise in force | piecewise runner (target / draft) | `attention_backend` in force "
    '| attention backend class | draft-extend graph runner | "Capture piecewise" / '
    '"Capture draft extend" log lines | `hot_token_id` | context '
    "| graphs captured (0.5.17: role, phase, backend) |"
)
SETTINGS_RULE = "|---|---|---|---|---|---|---|---|---:|---|"


def settings_markdown(runs: Mapping[str, Mapping]) -> str:
    lines = [SETTINGS_HEADER, SETTINGS_RULE]
    for key, run in sorted(runs.items()):
        if not run.get("engine_facts") and not run.get("engine_log"):
            continue
        f = in_force(run)
        lines.append(
            f"| {key} | {f['piecewise']} | {f['piecewise_runner']} / {f['draft_piecewise_runner']} "
            f"| {f['attention_backend']} "
            f"| {f['attn_backend']} | {f['draft_extend_graph_runner']} "
            f"| {f['log_piecewise_capture']} / {f['log_draft_extend_capture']} "
            f"| {f['hot_token_id_shape']} | {f['context_len']} | {f['graphs']} |"
        )
    return "\n".join(lines) + "\n"


def problems(key: str, run: Mapping) -> list[str]:
    """A checkpoint EAGLE3 draft must come with its token map (else it ran like the old
    draft). DeepSeek's MTP layer (scenario mtp) drafts over the whole vocabulary: no map."""
    if run.get("draft") != "checkpoint" or run.get("scenario", "eagle3") != "eagle3" or not run.get("engine_facts"):
        return []
    shape = in_force(run)["hot_token_id_shape"]
    return [] if shape.startswith("[") else [f"{key}: the checkpoint draft has no hot_token_id ({shape})"]


#: The runner's own line when ``Engine(...)`` raised in its process (ServerArgs' checks).
FAILURE_PREFIX = "[runner] engine failed: "
#: The last line of a Python traceback: ``ValueError: ...``, ``deep_ep.X: ...``.
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt)\b(?::.*)?$")


#: The log line that opens a scheduler's traceback, before sglang kills the process tree.
_SCHEDULER_TRACEBACK = "hit an exception: Traceback"


def _scheduler_exception(lines: list[str]) -> Optional[str]:
    """The exception line of the first traceback a scheduler logged: the root cause,
    which the runner only sees wrapped ("Rank 0 scheduler died during initialization").
    A chained traceback names the first exception first."""
    for i, line in enumerate(lines):
        if _SCHEDULER_TRACEBACK not in line:
            continue
        for later in lines[i + 1 :]:
            if _EXCEPTION_LINE.match(later):
                return later
            if later.startswith("["):  # the next log line: this traceback named no exception
                break
    return None


def failure_line(log_text: str) -> Optional[str]:
    """Why an engine did not run, as its log says it (issue 58: a release refusing a
    setting, a package the image lacks): a scheduler's own exception if one logged a
    traceback (the runner's line then only says the scheduler died), else the runner's
    line if it caught the error (ServerArgs' checks, in its own process), else the last
    exception line of any traceback. None when the log names none."""
    lines = [line.strip() for line in log_text.splitlines()]
    root = _scheduler_exception(lines)
    if root is not None:
        return root
    for line in reversed(lines):
        if line.startswith(FAILURE_PREFIX):
            return line[len(FAILURE_PREFIX) :]
    return next((line for line in reversed(lines) if _EXCEPTION_LINE.match(line)), None)
