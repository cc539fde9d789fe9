"""Tensor parallel runs: which TP rank each process is, and what each rank decided.

With ``tp_size=N`` every rank runs its own scheduler process, counts its own host
syncs (:mod:`.syncs`, through the bundle's ``sitecustomize.py``) and takes its own
``needs_cpu_seq_lens`` decision. Process side (:func:`install`, next to the sync
counter), in every process and with no change to what sglang does:

* ``Scheduler.__init__`` is wrapped to note the process's ``tp_rank`` (and
  ``pp_rank``, ``dp_rank``, ``gpu_id``): from its arguments before it runs, so a
  rank that fails while starting is still named, then from the attributes it set.
  The same class and signature on pristine and patched trees (0.5.10 …
  0.5.12.post1); where neither gives a rank, ``torch.distributed``'s rank at the
  decision is taken.
* the runtime's ``configure_needs_cpu_seq_lens`` (the scheduler's one call that
  takes the decision) is wrapped to note the flag it returns. Wrapped in its own
  module right after that is imported, before the package re-exports it and the
  scheduler imports it by name. Not ``set_needs_cpu_seq_lens``: the harness's own
  mirror switch (:mod:`.mirror_control`) calls that, and is no decision of the tree.
  Patched code imports the runtime from the tree (``sglang.srt._patchkit.runtime``,
  see patchkit/state/vendoring.py) and, in package mode, that forwards to
  ``patchkit.runtime``: both are hooked; a pristine tree has neither and notes none.

Reading side: the per-process dumps, grouped by rank (:func:`by_rank`), as the
runner records them per batch (:func:`batch_per_rank`) and per run
(:func:`run_per_rank`); lists of ``{"tp_rank": r, ...}`` so they survive JSON.

Also here: the engine settings and environment of a TP run (:func:`engine_kwargs`,
:data:`MULTICAST_OFF`).
"""

from __future__ import annotations

import inspect
import subprocess
from collections.abc import Iterable, Mapping
from typing import Any, Optional

from . import syncs, worker_steps

SCHEDULER_MODULE = "sglang.srt.managers.scheduler"
#: Where ``configure_needs_cpu_seq_lens`` lives: the tree's vendored runtime
#: (patchkit.state.vendoring.import_path("runtime.seq_lens")) and the installed
#: runtime it forwards to in package mode.
RUNTIME_MODULES = ("sglang.srt._patchkit.runtime.seq_lens", "patchkit.runtime.seq_lens")
RANK_FIELDS = ("tp_rank", "pp_rank", "dp_rank", "attn_tp_rank", "gpu_id")
#: Rank fields the Scheduler sets on itself but takes no parameter for (DP attention:
#: a rank's place inside its attention TP group; 0.5.10 … 0.5.12.post1).
ATTRIBUTE_ONLY_FIELDS = ("attn_tp_rank",)
DECISION_NOTE = "needs_cpu_seq_lens"
RANK_NOTE = "rank"

#: NVLink multicast stays off on the lent multi-GPU machines (a program using it
#: can take the host's shared GPUs out of service): set again in every engine's
#: environment, whatever the caller's holds.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def engine_kwargs(
    tp_size: int, dp_size: int = 1, dp_attention: bool = False, tbo: bool = False, moe_a2a_backend: Optional[str] = None
) -> dict:
    """What a run with ``tp_size`` adds to the Engine's settings. Beyond one GPU,
    every all-reduce path that could use multicast is named off (these are
    sglang's defaults for Llama, except the FlashInfer fusion, which sglang
    switches on by itself for some models); fields of ServerArgs in 0.5.10 and
    0.5.12.post1.

    Issue 58, as DeepSeek is served at scale: ``dp_size`` with ``dp_attention``
    (``--dp N --enable-dp-attention``), two-batch overlap (``tbo``) and the MoE
    all-to-all backend, each passed only when asked, so the release decides the
    rest (and refuses what it refuses: TBO with no a2a backend, ServerArgs'
    ``check_server_args``)."""
    kwargs: dict = {"tp_size": tp_size}
    if tp_size > 1:
        kwargs.update(
            enable_nccl_nvls=False,
            enable_symm_mem=False,
            enable_torch_symm_mem=False,
            enforce_disable_flashinfer_allreduce_fusion=True,
        )
    if dp_size > 1:
        kwargs["dp_size"] = dp_size
    if dp_attention:
        kwargs["enable_dp_attention"] = True
    if tbo:
        kwargs["enable_two_batch_overlap"] = True
    if moe_a2a_backend:
        kwargs["moe_a2a_backend"] = moe_a2a_backend
    return kwargs


def gpus_visible() -> Optional[int]:
    """How many GPUs ``nvidia-smi -L`` lists (None: no nvidia-smi)."""
    try:
        q = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return sum(1 for line in q.stdout.splitlines() if line.startswith("GPU "))


# ----------------------------------------------------------------- process side

_rank: dict = {}
_decisions: list = []


def install() -> None:
    """Hook the scheduler and the runtime in this process (after :func:`syncs.install`)."""
    syncs.on_import(SCHEDULER_MODULE, _label_scheduler)
    worker_steps.install()  # every step, busy or idle, of each rank's spec-v2 worker
    for name in RUNTIME_MODULES:
        syncs.on_import(name, _record_decision)


def _note_rank(fields: Mapping[str, Any], source: str) -> None:
    known = {k: v for k, v in fields.items() if k in RANK_FIELDS and isinstance(v, int)}
    if "tp_rank" not in known:
        return
    _rank.update(known, source=source)
    syncs.note(RANK_NOTE, dict(_rank))


def _label_scheduler(module: Any) -> None:
    cls = getattr(module, "Scheduler", None)
    original = getattr(cls, "__init__", None)
    if original is None or getattr(original, "__pk_e2e_wrapped__", False):
        return
    signature = inspect.signature(original)

    def init(self, *args, **kwargs):
        try:
            _note_rank(signature.bind_partial(self, *args, **kwargs).arguments, "Scheduler.__init__ arguments")
        except TypeError:
            pass  # another signature: the attributes below still name the rank
        original(self, *args, **kwargs)
        _note_rank({k: getattr(self, k, None) for k in RANK_FIELDS}, "Scheduler attributes")

    init.__pk_e2e_wrapped__ = True  # type: ignore[attr-defined]
    init.__name__, init.__qualname__, init.__doc__ = original.__name__, original.__qualname__, original.__doc__
    cls.__init__ = init  # type: ignore[misc]


def _record_decision(module: Any) -> None:
    original = getattr(module, "configure_needs_cpu_seq_lens", None)
    if original is None or getattr(original, "__pk_e2e_wrapped__", False):
        return  # package mode: the forwarder re-exports the one already wrapped

    def configure_needs_cpu_seq_lens(*args, **kwargs):
        flag = original(*args, **kwargs)
        _decisions.append(bool(flag))
        syncs.note(DECISION_NOTE, list(_decisions))
        if not _rank:
            _note_rank({"tp_rank": _rank_from_torch_distributed()}, "torch.distributed")
        return flag

    configure_needs_cpu_seq_lens.__pk_e2e_wrapped__ = True  # type: ignore[attr-defined]
    configure_needs_cpu_seq_lens.__name__ = original.__name__
    configure_needs_cpu_seq_lens.__qualname__ = original.__qualname__
    configure_needs_cpu_seq_lens.__doc__ = original.__doc__
    module.configure_needs_cpu_seq_lens = configure_needs_cpu_seq_lens


def process_tp_rank() -> Optional[int]:
    """This process's TP rank once its Scheduler started (None elsewhere: the
    engine's own process and the detokenizer import the scheduler module too)."""
    return _rank.get("tp_rank")


def _rank_from_torch_distributed() -> Optional[int]:
    try:
        import torch.distributed as dist

        return dist.get_rank() if dist.is_available() and dist.is_initialized() else None
    except Exception:  # noqa: BLE001
        return None


# ----------------------------------------------------------------- reading side


def read(sync_dir: Optional[str]) -> list[dict]:
    """Every process's latest dump (none when sync counting is off)."""
    return syncs.read_dir(sync_dir) if sync_dir else []


def rank_of(dump: Mapping) -> Optional[int]:
    """The TP rank a process noted (None: not a scheduler, e.g. the engine or detokenizer)."""
    return (dump.get("notes") or {}).get(RANK_NOTE, {}).get("tp_rank")


def by_rank(dumps: Iterable[Mapping]) -> dict[int, list[Mapping]]:
    out: dict[int, list[Mapping]] = {}
    for dump in dumps:
        rank = rank_of(dump)
        if rank is not None:
            out.setdefault(rank, []).append(dump)
    return dict(sorted(out.items()))


def batch_per_rank(after: Iterable[Mapping], before: Iterable[Mapping]) -> list[dict]:
    """Per rank, what its processes counted between two reads: syncs by site,
    decode steps (calls of ``prepare_for_decode``: busy ones only) and every step
    of its spec-v2 worker by kind (:mod:`.worker_steps`: idle DP ranks too)."""
    prior = by_rank(before)
    out = []
    for rank, dumps in by_rank(after).items():
        timed = syncs.delta(syncs.aggregate(dumps), syncs.aggregate(prior.get(rank, [])))
        out.append(
            {
                "tp_rank": rank,
                "syncs": syncs.syncs_only(timed),
                "decode_steps": syncs.calls_of(timed, "prepare_for_decode"),
                "worker_steps": worker_steps.steps_of(timed),
            }
        )
    return out


def run_per_rank(dumps: Iterable[Mapping]) -> list[dict]:
    """Per rank over the processes' whole life: pids, every decision noted (in
    order; a pristine tree notes none), the last one, and the syncs by site."""
    out = []
    for rank, group in by_rank(dumps).items():
        decisions = [flag for d in group for flag in (d.get("notes") or {}).get(DECISION_NOTE, [])]
        out.append(
            {
                "tp_rank": rank,
                "pids": sorted((d.get("pid") for d in group), key=lambda p: (p is None, p or 0)),
                "rank_source": sorted(
                    {(d.get("notes") or {}).get(RANK_NOTE, {}).get("source") for d in group} - {None}
                ),
                "decisions": decisions,
                DECISION_NOTE: decisions[-1] if decisions else None,
                "syncs_whole_run": syncs.syncs_only(syncs.aggregate(group)),
            }
        )
    return out


def decisions(run: Mapping) -> dict[int, Optional[bool]]:
    """``{tp_rank: last needs_cpu_seq_lens}`` of a runner result."""
    return {r["tp_rank"]: r[DECISION_NOTE] for r in run.get("ranks", [])}
