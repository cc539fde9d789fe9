"""seq-lens-host-bound (issue 67): the scheduler's host-side bound of the lengths, carried to the
backends; its codemods on snippets, and the runtime on CPU values."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from patchkit.backends.mirror_reads import host_max_seq_len
from patchkit.codemods import seq_lens_host_bound as hb
from patchkit.codemods.common.base import State
from patchkit.runtime import host_bound as rt
from patchkit.runtime.seq_lens import prefix_lens_sum_or_bound, seq_lens_sum_or_bound, tree_mask_seq_lens_sum
from patchkit.testing import apply, assert_codemod, assert_state, code

IMPORT = "from sglang.srt._patchkit.runtime import "

WORKER_BATCH = code("""
    @dataclasses.dataclass
    class ModelWorkerBatch:
        forward_mode: ForwardMode
        seq_lens_cpu: Optional[torch.Tensor]
        rids: Optional[List[str]] = None

        def helper(self):
            pass
""")


def test_the_worker_batch_declares_the_field_after_its_last_one():
    assert_codemod(
        hb.AddWorkerBatchField,
        WORKER_BATCH,
        IMPORT
        + "SeqLensBound\n"
        + WORKER_BATCH.replace(
            "rids: Optional[List[str]] = None\n",
            "rids: Optional[List[str]] = None\n"
            "    seq_lens_host_bound: Optional[SeqLensBound] = None  # patchkit (issue 67): host-side bound, no mirror\n",
        ),
    )


GET_WORKER_BATCH = code("""
    class ScheduleBatch:
        def get_model_worker_batch(self, seq_lens_cpu_cache=None):
            seq_lens_cpu = seq_lens_cpu_cache if seq_lens_cpu_cache is not None else self.seq_lens_cpu
            return ModelWorkerBatch(
                forward_mode=self.forward_mode,
                seq_lens_cpu=seq_lens_cpu,
                rids=[req.rid for req in self.reqs],
            )
""")


def test_the_worker_batch_is_built_with_the_requests_bound():
    assert_codemod(
        hb.FillWorkerBatchBound,
        GET_WORKER_BATCH,
        IMPORT
        + "seq_lens_host_bound\n"
        + GET_WORKER_BATCH.replace(
            "rids=[req.rid for req in self.reqs],\n",
            "rids=[req.rid for req in self.reqs],\n"
            "            seq_lens_host_bound=seq_lens_host_bound(self.reqs, seq_lens_cpu),\n",
        ),
    )


def test_a_fork_that_hands_its_mirror_under_another_name_gets_that_name():
    fork = GET_WORKER_BATCH.replace("seq_lens_cpu=seq_lens_cpu,", "seq_lens_cpu=self.host_lens,")
    assert "seq_lens_host_bound=seq_lens_host_bound(self.reqs, self.host_lens)" in apply(hb.FillWorkerBatchBound, fork)


def test_a_worker_batch_without_the_mirror_keyword_is_a_missing_anchor():
    fork = GET_WORKER_BATCH.replace("seq_lens_cpu=seq_lens_cpu,\n", "")
    assert_state(hb.FillWorkerBatchBound, fork, State.MISSING, "gets no seq_lens_cpu=")


def test_upstreams_init_new_without_get_model_worker_batch_makes_the_patch_moot():
    finding = assert_state(hb.FillWorkerBatchBound, "class ScheduleBatch:\n    pass\n", State.SUPERSEDED)
    assert finding.moots_patch and "0.5.13+" in finding.detail


INIT_NEW = code("""
    class ForwardBatch:
        batch_size: int
        rids: Optional[List[str]] = None

        @classmethod
        def init_new(cls, batch, model_runner):
            ret = cls(
                forward_mode=batch.forward_mode,
                seq_lens=batch.seq_lens,
            )
            return ret
""")


def test_init_new_hands_the_bound_on_through_the_check():
    assert_codemod(
        hb.HandOnBound,
        INIT_NEW,
        IMPORT
        + "checked_host_bound\n"
        + INIT_NEW.replace(
            "seq_lens=batch.seq_lens,\n",
            "seq_lens=batch.seq_lens,\n"
            "            seq_lens_host_bound=checked_host_bound(batch.seq_lens_host_bound, batch.seq_lens),\n",
        ),
    )


@pytest.mark.parametrize(
    "init, moot",
    [
        ("self.kv_committed_len = 0\n        self.kv_allocated_len = 0", False),
        ("self.kv_committed_len = 0", True),
    ],
)
def test_requests_without_a_host_allocation_make_the_patch_moot(init, moot):
    src = f"class Req:\n    def __init__(self):\n        {init}\n"
    assert assert_state(hb.RequestsKeepHostAllocation, src, State.SUPERSEDED).moots_patch is moot


# -- the runtime ---------------------------------------------------------------------------------------


def reqs(*allocated: int) -> list:
    return [SimpleNamespace(kv_allocated_len=n) for n in allocated]


def test_the_bound_is_the_requests_allocations_and_only_without_the_mirror(monkeypatch):
    monkeypatch.delenv(rt.OFF_SWITCH, raising=False)
    assert rt.seq_lens_host_bound(reqs(10, 30, 20), None) == rt.SeqLensBound(30, 60)
    assert rt.seq_lens_host_bound(reqs(10), seq_lens_cpu=[9]) is None  # the mirror: exact values
    assert rt.seq_lens_host_bound([SimpleNamespace()], None) is None  # 0.5.5: no host allocation
    assert rt.seq_lens_host_bound([], None) is None  # an idle batch (DP attention) keeps the static bound
    monkeypatch.setenv(rt.OFF_SWITCH, "static")
    assert rt.seq_lens_host_bound(reqs(10), None) is None


def test_the_consumers_take_the_bound_at_most_the_static_one():
    batch = SimpleNamespace(seq_lens_host_bound=rt.SeqLensBound(700, 1200))
    assert host_max_seq_len(None, 131072, batch) == 700
    assert host_max_seq_len(None, 512, batch) == 512
    assert host_max_seq_len(None, 131072) == 131072  # no batch: the static bound, as before
    assert host_max_seq_len(None, 131072, SimpleNamespace()) == 131072  # a batch the patch did not reach
    assert seq_lens_sum_or_bound(None, 2, 131072, batch) == 1400  # rows of the longest: top-k rows included
    assert seq_lens_sum_or_bound(1234, 2, 131072, batch) == 1234  # the mirror's sum wins
    assert prefix_lens_sum_or_bound(None, 4, 131072, batch) == 2800
    assert prefix_lens_sum_or_bound([3, 4], 2, 131072, batch) == 7
    seq_lens = SimpleNamespace(shape=(3,))
    backend = SimpleNamespace(max_context_len=131072)
    assert tree_mask_seq_lens_sum(None, None, seq_lens, backend, batch) == 2100
    assert tree_mask_seq_lens_sum(None, object(), seq_lens, backend, batch) == 0


def test_the_debug_check_raises_when_the_device_passes_the_bound(monkeypatch):
    torch = pytest.importorskip("torch")
    bound = rt.SeqLensBound(10, 15)
    monkeypatch.delenv(rt.CHECK_SWITCH, raising=False)
    assert rt.checked_host_bound(bound, torch.tensor([11, 2])) is bound  # off: no device read
    monkeypatch.setenv(rt.CHECK_SWITCH, "1")
    assert rt.checked_host_bound(bound, torch.tensor([10, 5])) is bound
    with pytest.raises(RuntimeError, match="device max 11 > 10"):
        rt.checked_host_bound(bound, torch.tensor([11, 2]))
    with pytest.raises(RuntimeError, match="sum 16 > 15"):
        rt.checked_host_bound(bound, torch.tensor([8, 8]))
    assert rt.checked_host_bound(None, torch.tensor([99])) is None


# -- the bound holds: sglang's spec-v2 allocation, stepped with the overlap scheduler's lag ---------------


class Request:
    """One request as 0.5.6.post2 .. 0.5.12.post1's spec-v2 decode keeps it: the host's
    committed and allocated lengths, and the device length the GPU has moved on to."""

    def __init__(self, prompt: int) -> None:
        self.kv_committed_len = self.kv_allocated_len = self.device_len = prompt
        self.unresolved: list[int] = []  # accepts the host has not read yet (the overlap lag)


def prepare_for_decode(batch: list[Request], alloc_len: int) -> None:
    """``EagleDraftInput.prepare_for_decode``: reserve two steps past the committed
    length (never shrink), and pre-claim the bonus slot."""
    for r in batch:
        r.kv_allocated_len = max(r.kv_allocated_len, r.kv_committed_len + 2 * alloc_len)
        r.kv_committed_len += 1


def resolve(r: Request) -> None:
    """The host reads a verify's accept length one step late; resolve gives the pre-claim back."""
    r.kv_committed_len += r.unresolved.pop(0) - 1


@pytest.mark.parametrize("seed", range(40))
def test_every_row_the_step_touches_lies_under_the_bound(seed):
    """Every accept pattern (all accepted, none, random), requests joining after a chunked
    prefill (merge), finishing or retracted (filter), idle steps: the verify writes
    ``device_len .. device_len + num_draft_tokens`` of each request, and every one of those
    positions, the longest row and the sum, lie under the bound the host computed."""
    rng = random.Random(seed)
    steps, topk = rng.choice([(1, 1), (3, 1), (5, 1), (3, 4)])
    num_draft = steps + 1 if topk == 1 else rng.choice([4, 8])
    alloc_len = max(steps * topk, num_draft)  # get_alloc_len_per_decode
    pattern = rng.choice(["all", "none", "random"])
    batch = [Request(rng.randint(1, 4000)) for _ in range(rng.randint(0, 8))]
    for _ in range(60):
        for r in batch:  # the previous step's result, read now (overlap: one step late)
            while len(r.unresolved) > 1:
                resolve(r)
        event = rng.random()
        if event < 0.1 and batch:  # finished or retracted: filter_batch
            batch.pop(rng.randrange(len(batch)))
        elif event < 0.2:  # a chunked prefill joins: merge_batch
            batch.append(Request(rng.randint(1, 4000)))
        prepare_for_decode(batch, alloc_len)
        bound = rt.seq_lens_host_bound(batch, None)
        if not batch:
            assert bound is None  # idle: the static bound
            continue
        assert bound is not None
        for r in batch:
            assert r.device_len + num_draft <= r.kv_allocated_len <= bound.max_len
        assert sum(r.device_len for r in batch) <= bound.total
        for r in batch:  # the verify accepts 1 .. num_draft tokens on the device
            accepted = {"all": num_draft, "none": 1}.get(pattern) or rng.randint(1, num_draft)
            r.device_len += accepted
            r.unresolved.append(accepted)
