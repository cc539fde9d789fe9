"""Under tensor parallelism every rank runs its own scheduler and takes its own
``needs_cpu_seq_lens`` decision (``configure_needs_cpu_seq_lens``, a
per-process flag). Ranks cannot disagree when the decision reads only what
every rank sees alike: the server args of the run and the classes of the
attention backends, never a rank's own values (its rank, GPU, port)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import patchkit.runtime as rt

# What a rank's scheduler holds that differs between ranks of one run.
RANK_FIELDS = {"tp_rank", "pp_rank", "dp_rank", "gpu_id", "nccl_port", "moe_ep_rank", "attn_tp_rank", "device"}


class Recorder:
    """Wraps an object and records every attribute read through it."""

    def __init__(self, name: str, target: object, reads: list[str]) -> None:
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_reads", reads)

    def __getattr__(self, attr: str):
        self._reads.append(f"{self._name}.{attr}")
        value = getattr(self._target, attr)
        if isinstance(value, (SimpleNamespace, Backend)):
            return Recorder(f"{self._name}.{attr}", value, self._reads)
        if isinstance(value, (list, tuple)):
            return type(value)(
                Recorder(f"{self._name}.{attr}[]", v, self._reads) if v is not None else None for v in value
            )
        return value


class Backend:
    def __init__(self, flag: bool, rank: int) -> None:
        self.needs_cpu_seq_lens = flag
        self.device = f"cuda:{rank}"  # rank-specific, as real backends hold


def rank_view(rank: int, pcg_off: bool, flags: tuple[bool, ...], mrope: bool = False):
    """What one rank's scheduler hands to ``configure_needs_cpu_seq_lens``."""
    server_args = SimpleNamespace(
        enable_two_batch_overlap=False,
        disable_piecewise_cuda_graph=pcg_off,
        tp_size=2,
        **{f: rank for f in RANK_FIELDS - {"device"}},
    )
    backends = [Backend(f, rank) for f in flags] + [None]  # e.g. no draft-extend backend
    draft_worker = SimpleNamespace(spec_v2_attn_backends=backends, tp_rank=rank, gpu_id=rank)
    tp_worker = SimpleNamespace(
        model_runner=SimpleNamespace(model_is_mrope=mrope, tp_rank=rank, gpu_id=rank), tp_rank=rank, gpu_id=rank
    )
    return server_args, draft_worker, tp_worker


@pytest.fixture(autouse=True)
def restore_decision():
    yield
    rt.set_needs_cpu_seq_lens(True)


@pytest.mark.parametrize("pcg_off", [True, False])
@pytest.mark.parametrize("flags", [(False, False, False), (False, True, False), (True,)])
@pytest.mark.parametrize("mrope", [False, True])
def test_the_decision_reads_nothing_rank_specific(pcg_off, flags, mrope):
    decisions, reads_per_rank = [], []
    for rank in (0, 1):
        reads: list[str] = []
        server_args, draft_worker, tp_worker = rank_view(rank, pcg_off, flags, mrope)
        decisions.append(
            rt.configure_needs_cpu_seq_lens(
                Recorder("server_args", server_args, reads),
                Recorder("draft_worker", draft_worker, reads),
                Recorder("tp_worker", tp_worker, reads),
            )
        )
        reads_per_rank.append(reads)
    assert decisions[0] == decisions[1]
    touched = {name.rsplit(".", 1)[-1] for name in reads_per_rank[0] + reads_per_rank[1]}
    assert not touched & RANK_FIELDS, f"the decision read rank-specific {touched & RANK_FIELDS}"
    assert reads_per_rank[0] == reads_per_rank[1]  # the same reads, in the same order, on every rank


def test_the_decision_is_the_same_function_of_the_shared_inputs():
    """Rank views that agree on server args and backend classes give one
    decision, whatever their rank-specific fields hold."""
    expected = {}
    for pcg_off in (True, False):
        for flags in ((False, False), (False, True), (True, True)):
            per_rank = {rt.configure_needs_cpu_seq_lens(*rank_view(rank, pcg_off, flags)) for rank in range(8)}
            assert len(per_rank) == 1
            expected[(pcg_off, flags)] = per_rank.pop()
    assert expected[(True, (False, False))] is False  # every backend opts out, PCG off: mirror dropped
    assert expected[(False, (False, False))] is True  # piecewise CUDA graph reads the mirror
    assert expected[(True, (False, True))] is True
