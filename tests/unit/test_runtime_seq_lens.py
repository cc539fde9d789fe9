"""patchkit.runtime.seq_lens: the decision and the None-aware helpers the
needs-cpu-seq-lens patch makes sglang call (CPU; torch where a helper needs it)."""

from __future__ import annotations

import logging
import subprocess
import sys
from types import SimpleNamespace

import pytest

import patchkit.runtime as rt
from patchkit.runtime import seq_lens as impl


@pytest.fixture(autouse=True)
def restore_decision():
    yield
    rt.set_needs_cpu_seq_lens(True)


def args(tbo=False, disable_pcg=True, **extra):
    return SimpleNamespace(enable_two_batch_overlap=tbo, disable_piecewise_cuda_graph=disable_pcg, **extra)


TRITON = SimpleNamespace(needs_cpu_seq_lens=False)
FLASHINFER = SimpleNamespace(needs_cpu_seq_lens=True)
UNDECLARED = SimpleNamespace()  # a fork's backend without the flag


# -- decide_needs_cpu_seq_lens: the truth table -----------------------------------------------


@pytest.mark.parametrize(
    "server_args, backends, expected",
    [
        (args(tbo=True), [TRITON], True),  # two-batch overlap reads the mirror
        (args(disable_pcg=False), [TRITON], True),  # piecewise CUDA graph on
        (SimpleNamespace(), [TRITON], True),  # no PCG attribute: PCG counts as on
        (args(), [TRITON], False),
        (args(), [TRITON, TRITON, TRITON], False),
        (args(), [TRITON, None, None], False),  # unset slots are skipped (#26738)
        (args(), [None, TRITON], False),
        (args(), [TRITON, FLASHINFER], True),  # any backend that reads it wins
        (args(), [TRITON, UNDECLARED], True),  # no attribute counts as True (#26738)
        (args(), [UNDECLARED], True),
        (args(), [None], False),  # like upstream: nothing to ask
        (args(), [], False),
    ],
)
def test_decide_truth_table(server_args, backends, expected):
    assert rt.decide_needs_cpu_seq_lens(server_args, backends) is expected


@pytest.mark.parametrize(
    "server_args, backends, expected",
    [
        (args(disable_pcg=False), [TRITON], False),  # sglang #28633: the runners only hand it through
        (SimpleNamespace(), [TRITON], False),
        (args(disable_pcg=False), [TRITON, FLASHINFER], True),  # the backends still decide
        (args(tbo=True, disable_pcg=False), [TRITON], True),  # two-batch overlap still reads it
    ],
)
def test_piecewise_cuda_graph_no_longer_forces_the_mirror(server_args, backends, expected):
    """What piecewise-no-forced-mirror's ``piecewise_reads_mirror=False`` asks for."""
    assert rt.decide_needs_cpu_seq_lens(server_args, backends, piecewise_reads_mirror=False) is expected


def test_decide_accepts_any_iterable():
    assert rt.decide_needs_cpu_seq_lens(args(), (b for b in [TRITON, None])) is False


# -- configure: the scheduler's one call ----------------------------------------------------------


def worker(*backends):
    return SimpleNamespace(spec_v2_attn_backends=tuple(backends))


def tp(mrope=False):
    return SimpleNamespace(model_runner=SimpleNamespace(attn_backend=TRITON, model_is_mrope=mrope))


def test_configure_stores_the_decision_for_the_sync_owner(caplog):
    assert rt.needs_cpu_seq_lens() is True  # default: legacy behaviour
    with caplog.at_level(logging.INFO, logger="patchkit.runtime.seq_lens"):
        assert rt.configure_needs_cpu_seq_lens(args(), worker(TRITON, TRITON, None, TRITON), tp()) is False
    assert rt.needs_cpu_seq_lens() is False
    assert "skipped" in caplog.text
    assert rt.configure_needs_cpu_seq_lens(args(), worker(TRITON, FLASHINFER), tp()) is True
    assert rt.needs_cpu_seq_lens() is True


@pytest.mark.parametrize(
    "draft_worker, tp_worker, why",
    [
        (None, tp(), "no speculative decoding"),
        (SimpleNamespace(), tp(), "worker does not list its backends (e.g. multi-layer EAGLE)"),
        (worker(TRITON), tp(mrope=True), "mrope reads seq_lens_cpu on the draft extend"),
    ],
)
def test_configure_keeps_the_mirror_when_unsure(draft_worker, tp_worker, why):
    rt.set_needs_cpu_seq_lens(False)
    assert rt.configure_needs_cpu_seq_lens(args(), draft_worker, tp_worker) is True, why
    assert rt.needs_cpu_seq_lens() is True


def test_spec_v2_attn_backends_of():
    assert rt.spec_v2_attn_backends_of(None) is None
    assert rt.spec_v2_attn_backends_of(SimpleNamespace()) is None
    assert rt.spec_v2_attn_backends_of(SimpleNamespace(spec_v2_attn_backends=[TRITON])) == (TRITON,)


# -- None-aware arithmetic ---------------------------------------------------------------------


def test_add_or_none():
    assert rt.add_or_none(10, 3) == 13
    assert rt.add_or_none(None, 3) is None
    assert rt.add_or_none(10, None) is None


def test_index_or_none():
    assert rt.index_or_none([5, 6, 7], 1) == 6
    assert rt.index_or_none(None, [0, 2]) is None


def test_host_list_or_none():
    lens = [1, 2]
    assert rt.host_list_or_none(lens) is lens
    assert rt.host_list_or_none(None) is None
    assert rt.host_list_or_none(object()) is None  # a device tensor


def test_upper_bounds():
    assert rt.seq_lens_sum_or_bound(17, 4, 100) == 17
    assert rt.seq_lens_sum_or_bound(0, 4, 100) == 0
    assert rt.seq_lens_sum_or_bound(None, 4, 100) == 400
    assert rt.prefix_lens_sum_or_bound([3, 4], 2, 100) == 7
    assert rt.prefix_lens_sum_or_bound(None, 2, 100) == 200


def test_max_of_extend_lens_prefers_the_host_list():
    device = SimpleNamespace(max=lambda: pytest.fail("no device read when the list is there"))
    assert rt.max_of_extend_lens([3, 1, 4], device) == 4
    assert rt.max_of_extend_lens(None, SimpleNamespace(max=lambda: 9)) == 9


def test_tree_mask_seq_lens_sum():
    backend = SimpleNamespace(max_context_len=1000)
    seq_lens = SimpleNamespace(shape=(3,))
    assert rt.tree_mask_seq_lens_sum(42, None, seq_lens, backend) == 42  # mirror: exact
    assert rt.tree_mask_seq_lens_sum(42, object(), seq_lens, backend) == 42
    assert rt.tree_mask_seq_lens_sum(None, object(), seq_lens, backend) == 0  # preallocated mask
    assert rt.tree_mask_seq_lens_sum(None, None, seq_lens, backend) == 3000  # bs * max_context_len


# -- decode metrics -------------------------------------------------------------------------------------


class FakeMirror(list):
    def sum(self):
        return SimpleNamespace(item=lambda: sum(self))


def test_decode_metrics_from_the_mirror_or_the_requests():
    reqs = [SimpleNamespace(seqlen=5), SimpleNamespace(seqlen=7)]
    with_mirror = SimpleNamespace(seq_lens_cpu=FakeMirror([6, 8]), reqs=reqs)
    without = SimpleNamespace(seq_lens_cpu=None, reqs=reqs)
    assert rt.decode_total_seq_lens(with_mirror) == 14
    assert rt.decode_total_seq_lens(without) == 12
    assert list(rt.decode_seq_lens(with_mirror)) == [6, 8]
    assert list(rt.decode_seq_lens(without)) == [5, 7]


# -- with torch ---------------------------------------------------------------------------------------


def test_torch_helpers():
    torch = pytest.importorskip("torch")
    a, b = torch.tensor([3, 4]), torch.tensor([5])
    assert rt.cat_or_none(a, b).tolist() == [3, 4, 5]
    assert rt.cat_or_none(a, None) is None and rt.cat_or_none(None, b) is None
    assert rt.index_or_none(torch.tensor([5, 6, 7]), [0, 2]).tolist() == [5, 7]
    mirror = torch.tensor([10, 20], dtype=torch.int64)
    assert rt.decode_total_seq_lens(SimpleNamespace(seq_lens_cpu=mirror, reqs=[])) == 30
    assert rt.max_of_extend_lens(None, torch.tensor([2, 9, 4], dtype=torch.int32)) == 9


def test_draft_extend_prefix_lens_matches_the_mirror_path():
    torch = pytest.importorskip("torch")
    before = torch.tensor([11, 30, 7], dtype=torch.int64)  # seq_lens before the draft tokens
    after = before + 4  # batch.seq_lens once advanced by num_draft_tokens
    host = rt.draft_extend_prefix_lens(before.clone(), after, 4)
    gpu_only = rt.draft_extend_prefix_lens(None, after, 4)
    assert host == [11, 30, 7]
    assert gpu_only.dtype == torch.int32 and gpu_only.device == after.device
    assert gpu_only.tolist() == host


# -- the import contract --------------------------------------------------------------------------------


def test_import_is_cheap_and_standalone():
    """Patched sglang imports patchkit.runtime: stdlib only, no torch at import
    time, never libcst or click."""
    probe = (
        "import sys, patchkit.runtime as rt; "
        "bad = sorted(m for m in ('torch', 'libcst', 'click', 'patchkit.codemods', 'patchkit.cli') if m in sys.modules); "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_public_names():
    """The package's names are its modules' public ones (seq_lens, host_bound, host_copies, streams,
    grouped_copies): what each defines, not what it imports; each the same object."""
    import types

    from patchkit.runtime import grouped_copies, host_bound, host_copies, streams

    def defined(module, name):
        value = getattr(module, name)
        return (
            not isinstance(value, types.ModuleType) and getattr(value, "__module__", module.__name__) == module.__name__
        )

    modules = (impl, host_bound, host_copies, streams, grouped_copies)
    public = {
        name: module for module in modules for name in dir(module) if not name.startswith("_") and defined(module, name)
    }
    assert set(rt.__all__) - {"RUNTIME_API"} == set(public) - {"annotations", "TYPE_CHECKING"}
    assert isinstance(rt.RUNTIME_API, int)
    for name in set(rt.__all__) - {"RUNTIME_API"}:
        assert getattr(rt, name) is getattr(public[name], name)


# -- on a GPU ----------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_only_path_helpers_never_sync_the_host():
    """With no CPU mirror, the helpers the patched decode / draft / draft-extend
    paths call must not wait for the GPU (torch's sync debug mode raises on any
    host sync, as the .cpu() the patch skips would)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    seq_lens = torch.tensor([11, 30, 7], device="cuda") + 4  # advanced by 4 draft tokens
    backend = SimpleNamespace(max_context_len=1024)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError):
            seq_lens.cpu()  # the D2H copy the decision skips: a sync
        prefix = rt.draft_extend_prefix_lens(None, seq_lens, 4)
        bound = rt.tree_mask_seq_lens_sum(None, None, seq_lens, backend)
        assert rt.tree_mask_seq_lens_sum(None, torch.empty(8, device="cuda"), seq_lens, backend) == 0
        assert rt.add_or_none(None, 4) is None and rt.cat_or_none(None, seq_lens) is None
        assert rt.index_or_none(None, seq_lens) is None and rt.host_list_or_none(seq_lens) is None
        assert rt.seq_lens_sum_or_bound(None, seq_lens.shape[0], 1024) == 3072
        assert rt.prefix_lens_sum_or_bound(None, seq_lens.shape[0], 1024) == 3072
        extend_lens = torch.as_tensor(prefix, dtype=torch.int32).to("cuda", non_blocking=True)
        assert extend_lens is prefix  # init_new's as_tensor keeps device lens as they are
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert bound == 3 * 1024
    assert prefix.device.type == "cuda" and prefix.dtype == torch.int32
    assert prefix.tolist() == [11, 30, 7]


def test_piecewise_is_read_by_each_releases_own_switch():
    """0.5.10+: on unless disable_piecewise_cuda_graph; 0.5.4 .. 0.5.9: off unless
    enable_piecewise_cuda_graph (no disable field there: a missing one is not 'on');
    server args with neither switch count as on (the mirror kept)."""
    on = impl._piecewise_cuda_graph_on
    assert on(SimpleNamespace(disable_piecewise_cuda_graph=False)) is True
    assert on(SimpleNamespace(disable_piecewise_cuda_graph=True)) is False
    assert on(SimpleNamespace(enable_piecewise_cuda_graph=False)) is False
    assert on(SimpleNamespace(enable_piecewise_cuda_graph=True)) is True
    assert on(SimpleNamespace()) is True
    opted_out = [SimpleNamespace(needs_cpu_seq_lens=False)]
    old_release = SimpleNamespace(enable_two_batch_overlap=False, enable_piecewise_cuda_graph=False)
    assert impl.decide_needs_cpu_seq_lens(old_release, opted_out) is False
    assert (
        impl.decide_needs_cpu_seq_lens(
            SimpleNamespace(enable_two_batch_overlap=False, enable_piecewise_cuda_graph=True), opted_out
        )
        is True
    )
