"""spec-v2-decode-copies (issue 53): spec-v2 prepare_for_decode's kv-lens
copies to the device, pinned and non_blocking: snippets, fork spellings,
upstream's shape, then the real trees (every copy non_blocking from a
pinned tensor, exact revert); and the runtime's pin decision."""

from __future__ import annotations

import ast
from unittest import mock

import pytest

from codemod_testing import apply, assert_codemod, assert_state, code, detect
from support import NATIVE, PRE_UPSTREAM, patch_states, snapshot
from patchkit.codemods.common.base import State
from patchkit.codemods.spec_v2_decode_copies import KvLensCopiesWithoutWait as CODEMOD
from patchkit.runtime import host_copies

PATCH = "spec-v2-decode-copies"
FILE = "srt/speculative/eagle_info_v2.py"

BEFORE = code('''
    import torch


    class EagleDraftInputV2Mixin:
        def prepare_for_decode(self, batch):
            cur_kv_lens_cpu = torch.tensor(cur_kv_lens, dtype=torch.int32, device="cpu")
            nxt_kv_lens_cpu = torch.tensor(nxt_kv_lens, dtype=torch.int32, device="cpu")
            if page_size == 1:
                out_cache_loc = alloc_token_slots(batch.tree_cache, num_needed_tokens)
            else:
                cur_kv_lens = cur_kv_lens_cpu.to(device=batch.device)
                nxt_kv_lens = nxt_kv_lens_cpu.to(device=batch.device)
            assign_req_to_token_pool_func(
                batch.req_pool_indices,
                cur_kv_lens_cpu.to(device=batch.device),
                nxt_kv_lens_cpu.to(device=batch.device),
            )
''')
PIN = ', pin_memory=pin_memory_for(batch.device))'
AFTER = (BEFORE.replace("import torch\n", "import torch\nfrom sglang.srt._patchkit.runtime import pin_memory_for\n")
         .replace('device="cpu")', 'device="cpu"' + PIN)
         .replace(".to(device=batch.device)", ".to(device=batch.device, non_blocking=True)"))
UPSTREAM = code('''
    class EagleDraftInputV2Mixin:
        def prepare_for_decode(self, batch):
            cur_kv_lens_cpu = torch.tensor(cur_kv_lens, dtype=torch.int32, device="cpu")
            cur_kv_lens_device = cur_kv_lens_cpu.to(device=batch.device, non_blocking=True)
''')


def test_every_copy_non_blocking_from_a_pinned_tensor():
    assert_codemod(CODEMOD, BEFORE, AFTER)


def test_upstreams_non_blocking_copies_are_done():
    assert_state(CODEMOD, UPSTREAM, State.DONE, "0.5.13")


def test_fork_spellings_positional_device_and_no_device_keyword():
    src = BEFORE.replace('dtype=torch.int32, device="cpu")', "dtype=torch.int32)").replace(
        ".to(device=batch.device)", ".to(batch.device)")
    out = apply(CODEMOD, src)
    assert out.count(".to(batch.device, non_blocking=True)") == 4
    assert out.count("dtype=torch.int32, pin_memory=pin_memory_for(batch.device))") == 2


def test_a_copy_already_non_blocking_is_kept_and_a_device_tensor_is_not_touched():
    src = BEFORE.replace("nxt_kv_lens_cpu.to(device=batch.device),", "nxt_kv_lens_cpu.to(device=batch.device, non_blocking=True),")
    src = src.replace("        nxt_kv_lens_cpu = ", "        x = torch.tensor(y, device=batch.device)\n        nxt_kv_lens_cpu = ", 1)
    out = apply(CODEMOD, src)
    assert "x = torch.tensor(y, device=batch.device)\n" in out
    assert out.count("non_blocking=True") == 4 and out.count("pin_memory=") == 2


def test_lengths_kept_on_the_device_are_superseded_and_an_unknown_copy_is_missing():
    """0.5.4, 0.5.5: no host tensor at all; a host tensor copied in a shape
    this change does not know is a missing anchor."""
    src = code('''
        class EagleDraftInputV2Mixin:
            def prepare_for_decode(self, batch):
                new_allocate_lens = batch.seq_lens + self.ALLOC_LEN_PER_DECODE
    ''')
    assert_state(CODEMOD, src, State.SUPERSEDED, "on the device")
    other = src.replace("new_allocate_lens = batch", "lens = torch.tensor(x)\n        copy_to(lens)\n        new_allocate_lens = batch")
    finding = detect(CODEMOD, other)
    assert finding.state is State.MISSING and "host tensor" in finding.detail


def test_pin_memory_for_pins_only_cuda_with_a_driver():
    assert host_copies.pin_memory_for("cpu") is False
    with mock.patch("torch.cuda.is_available", return_value=True):
        assert host_copies.pin_memory_for("cuda") is True
        assert host_copies.pin_memory_for("cuda:1") is True
        assert host_copies.pin_memory_for("cpu") is False
    with mock.patch("torch.cuda.is_available", return_value=False):
        assert host_copies.pin_memory_for("cuda") is False


# --- real trees --------------------------------------------------------------------------


def kv_copies(source: str) -> list[tuple[bool, bool]]:
    """(non_blocking, source pinned) of each ``*_kv_lens_cpu.to(...)`` in prepare_for_decode."""
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "EagleDraftInputV2Mixin")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "prepare_for_decode")
    pinned = {a.targets[0].id: any(k.arg == "pin_memory" for k in a.value.keywords)
              for a in ast.walk(fn) if isinstance(a, ast.Assign) and isinstance(a.targets[0], ast.Name)
              and isinstance(a.value, ast.Call) and ast.unparse(a.value.func) == "torch.tensor"}
    return [(any(k.arg == "non_blocking" and ast.unparse(k.value) == "True" for k in c.keywords), pinned[c.func.value.id])
            for c in ast.walk(fn) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr == "to"
            and isinstance(c.func.value, ast.Name) and c.func.value.id.endswith("kv_lens_cpu")]


@pytest.mark.trees
@pytest.mark.parametrize("version", [*PRE_UPSTREAM, "0.5.7"])
def test_release_apply_verify_idempotent_and_exact_revert(make_tree, cli, version):
    tree = make_tree(version)
    before = snapshot(tree)
    assert kv_copies((tree / FILE).read_text()) == [(False, False)] * 4
    assert patch_states(cli, tree, PATCH)[PATCH]["state"] == "absent"
    assert cli("apply", tree, PATCH).exit_code == 0
    assert kv_copies((tree / FILE).read_text()) == [(True, True)] * 4
    assert patch_states(cli, tree, PATCH)[PATCH]["state"] == "applied"
    assert cli("verify", tree, PATCH).exit_code == 0
    after = snapshot(tree)
    assert cli("apply", tree, PATCH, "--check").exit_code == 0 and snapshot(tree) == after
    assert cli("revert", tree, PATCH).exit_code == 0 and snapshot(tree) == before


@pytest.mark.trees
def test_with_every_patch_on_the_primary_release(make_tree, cli):
    tree = make_tree("0.5.12.post1")
    assert cli("apply", tree).exit_code == 0
    assert kv_copies((tree / FILE).read_text()) == [(True, True)] * 4
    assert cli("verify", tree).exit_code == 0


@pytest.mark.trees
@pytest.mark.parametrize("version, state", [(NATIVE, "native"), ("0.5.16", "native"), ("0.5.23", "native"), ("0.5.4.post3", "not-applicable")])
def test_upstream_releases_are_left_alone(make_tree, cli, version, state):
    tree = make_tree(version)
    before = snapshot(tree)
    report = patch_states(cli, tree, PATCH)[PATCH]
    assert report["state"] == state and report["ok"]
    assert cli("apply", tree, PATCH).exit_code == 0 and snapshot(tree) == before


def test_the_moved_function_upstreams_copies_are_done_a_forks_blocking_ones_are_carried():
    """0.5.15+: upstream moved the method to eagle_utils.eagle_prepare_for_decode."""
    from patchkit.codemods.spec_v2_decode_copies import MovedKvLensCopiesWithoutWait as MOVED

    upstream = code('''
        def eagle_prepare_for_decode(batch):
            cur_kv_lens_cpu = torch.tensor(cur_kv_lens, dtype=torch.int32, device="cpu")
            cur_kv_lens_device = cur_kv_lens_cpu.to(device=batch.device, non_blocking=True)
    ''')
    assert_state(MOVED, upstream, State.DONE, "0.5.13+")
    fork = upstream.replace(", non_blocking=True", "")
    out = apply(MOVED, fork)
    assert "cur_kv_lens_cpu.to(device=batch.device, non_blocking=True)" in out and PIN in out
    assert_state(MOVED, "def other():\n    pass\n", State.SUPERSEDED, "eagle_info_v2.py")
