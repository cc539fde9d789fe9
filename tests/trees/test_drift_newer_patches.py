"""Fork drift inside the anchors of the newer patches (FlashMLA, FA3, TRT-LLM
MHA, replay-no-stale-mirror), on copies of the real files of 0.5.12.post1 and
0.5.13 (where the patch applies there): the value an anchor is about spelled
another way (a local computed earlier, a cast, operands swapped, keyword or
positional, an alias), and the vendor's own equivalent change, which is left
as it is and said as a note.

Each variant runs the codemod on the forked real file (fast); the generic
drifts (black, comments, reordering, instrumentation, ...) run over every patch
in test_forks.py; the whole tree, with one fork of each file, runs once here.
"""

from __future__ import annotations

import re

import libcst as cst
import pytest
from libcst.codemod import CodemodContext
from support import NATIVE, PRIMARY, carried_states, patch_states, snapshot

from patchkit.codemods import fa3_spec_v2 as fa3
from patchkit.codemods import flashmla_spec_v2 as fm
from patchkit.codemods import replay_no_stale_mirror as rnsm
from patchkit.codemods import trtllm_mha_spec_v2 as mha
from patchkit.codemods.common.base import State
from patchkit.codemods.flashmla_spec_v2 import fixed_q
from patchkit.fetch import fetch_tree
from patchkit.testing import run

pytestmark = pytest.mark.trees

FLASHMLA = "srt/layers/attention/flashmla_backend.py"
FA3 = "srt/layers/attention/flashattention_backend.py"
TRTLLM_MHA = "srt/layers/attention/trtllm_mha_backend.py"
RUNNER = "srt/model_executor/cuda_graph_runner.py"
DRAFT_EXTEND_RUNNER = "srt/speculative/eagle_draft_extend_cuda_graph_runner.py"


def sub(pattern: str, replacement: str, text: str, count: int = 0, expected: int | None = None) -> str:
    """re.sub that must hit (``expected`` times, when given)."""
    new, hits = re.subn(pattern, replacement, text, count=count, flags=re.S)
    assert hits and (expected is None or hits == expected), (pattern, hits)
    return new


def finding(codemod: type, text: str, rel: str):
    return codemod(CodemodContext(filename=rel)).detect(cst.parse_module(text))


def line_of(text: str, needle: str) -> int:
    return next(i for i, t in enumerate(text.splitlines(), 1) if needle in t)


# -- FlashMLA forward_extend: the fixed-q kernel's cache_seqlens -------------------------------------

VERIFY_LENS = r"cache_seqlens=forward_batch\.seq_lens\.to\(torch\.int32\)\s*\+ self\.num_draft_tokens,"
FIRST_CALL = r"(\n( +)if self\.is_fp8_kvcache:\n)"


def in_method(name: str, edit):
    """``edit`` applied to the text of method ``name`` only (up to the next def or class)."""

    def run_edit(text: str) -> str:
        start = text.index(f"    def {name}(")
        end = min(
            i for i in (text.find("\n    def ", start + 1), text.find("\nclass ", start + 1), len(text)) if i != -1
        )
        return text[:start] + edit(text[start:end]) + text[end:]

    return run_edit


def _hoisted(value: str, name: str = "cache_seqlens"):
    """The verify lengths computed once, before the fp8 branch, in a local."""

    def edit(text: str) -> str:
        text = sub(FIRST_CALL, rf"\n\2{name} = {value}\1", text, count=1)
        return sub(VERIFY_LENS, f"cache_seqlens={name},", text, expected=2)

    return edit


def _positional(text: str) -> str:
    """q, k_cache, block_table and cache_seqlens passed by position."""
    return sub(
        r"q=(reshape_q(?:_fp8)?),\n( +)k_cache=(.*?),\n +block_table=(.*?),\n +" + VERIFY_LENS,
        r"\1,\n\2\3,\n\2\4,\n\2forward_batch.seq_lens.to(torch.int32) + self.num_draft_tokens,",
        text,
        expected=2,
    )


_FORWARD_EXTEND_FORKS = {
    # The value the verify path hands the kernel, spelled another way.
    "local-variable": _hoisted("forward_batch.seq_lens.to(torch.int32) + self.num_draft_tokens"),
    "to-device-operands-swapped": lambda t: sub(
        VERIFY_LENS, "cache_seqlens=self.num_draft_tokens + forward_batch.seq_lens.to(q.device),", t
    ),
    "int32-cast-of-the-sum": lambda t: sub(
        VERIFY_LENS, "cache_seqlens=(forward_batch.seq_lens + self.num_draft_tokens).to(torch.int32),", t
    ),
    "draft-tokens-in-a-local": lambda t: sub(
        VERIFY_LENS,
        "cache_seqlens=forward_batch.seq_lens.int() + num_draft,",
        sub(FIRST_CALL, r"\n\2num_draft = self.num_draft_tokens\1", t, count=1),
    ),
    "seq-lens-cast-in-a-local": lambda t: sub(
        VERIFY_LENS,
        "cache_seqlens=seq_lens_i32 + self.num_draft_tokens,",
        sub(FIRST_CALL, r"\n\2seq_lens_i32 = forward_batch.seq_lens.to(dtype=torch.int32)\1", t, count=1),
    ),
    "torch-add": lambda t: sub(
        VERIFY_LENS, "cache_seqlens=torch.add(forward_batch.seq_lens, self.num_draft_tokens).to(torch.int32),", t
    ),
    "positional": _positional,
}
# The vendor already hands the draft extend its own K lengths: left alone, a note.
_VENDOR_K_LENS = {
    "conditional-expression": _hoisted(
        "(self.forward_metadata.vendor_k_lens if forward_batch.forward_mode.is_draft_extend_v2() "
        "else forward_batch.seq_lens.to(torch.int32) + self.num_draft_tokens)"
    ),
    "if-else-locals": lambda t: sub(
        VERIFY_LENS,
        "cache_seqlens=k_lens,",
        sub(
            FIRST_CALL,
            r"\n\2if forward_batch.forward_mode == ForwardMode.DRAFT_EXTEND_V2:\n\2    k_lens = self._vendor_draft_k_lens(forward_batch)\n"
            r"\2else:\n\2    k_lens = forward_batch.seq_lens.to(torch.int32) + self.num_draft_tokens\1",
            t,
            count=1,
        ),
    ),
}
FORWARD_EXTEND_FORKS = {k: in_method("forward_extend", v) for k, v in _FORWARD_EXTEND_FORKS.items()}
VENDOR_K_LENS = {k: in_method("forward_extend", v) for k, v in _VENDOR_K_LENS.items()}
# 0.5.13 routes DRAFT_EXTEND_V2 to the parent; a fork may spell that test another way.
ROUTED_0_5_13 = r"forward_batch\.forward_mode in \(\n +ForwardMode\.EXTEND,\n +ForwardMode\.DRAFT_EXTEND,\n +ForwardMode\.DRAFT_EXTEND_V2,\n +\)"
ROUTES = {
    "or-chain": "(forward_batch.forward_mode == ForwardMode.EXTEND or forward_batch.forward_mode == ForwardMode.DRAFT_EXTEND\n"
    "            or forward_batch.forward_mode.is_draft_extend_v2())",
    "set-literal": "forward_batch.forward_mode in {ForwardMode.DRAFT_EXTEND_V2, ForwardMode.EXTEND, ForwardMode.DRAFT_EXTEND}",
}


def _cache_seqlens_values(text: str) -> list[str]:
    """The code of each fixed-q kernel call's cache_seqlens, through one local."""
    fn = next(
        n
        for n in cst.parse_module(text).visit(cst.CSTTransformer()).body
        if isinstance(n, cst.ClassDef) and n.name.value == fm.BACKEND
    )
    method = next(s for s in fn.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "forward_extend")
    local = fixed_q.Locals(method)
    out = []
    for kernel in fm.primitives.find_all(method, fixed_q.KERNEL_CALL):
        value = fixed_q.cache_seqlens(kernel).value
        out += [rnsm.code_of(v) for v in local.values(value)]
    return out


@pytest.mark.parametrize("release", [PRIMARY, NATIVE])
@pytest.mark.parametrize("variant", sorted(FORWARD_EXTEND_FORKS))
def test_flashmla_forward_extend_spelled_another_way(release, variant):
    text = (fetch_tree(release) / FLASHMLA).read_text()
    forked = FORWARD_EXTEND_FORKS[variant](text)
    compile(forked, FLASHMLA, "exec")
    before, after, again = run(fm.ForwardExtendFixedQDraftExtend, forked)
    assert (before, again) == (State.TODO, State.DONE)
    values = _cache_seqlens_values(after)
    assert values and all(
        v.startswith("fixed_q_cache_seqlens(forward_batch, self.forward_metadata, ") for v in values
    ), values
    assert "from sglang.srt._patchkit.backends.flashmla import fixed_q_cache_seqlens" in after
    assert "ForwardMode.DRAFT_EXTEND_V2" not in after.split("def forward_extend", 1)[1].split("\nclass ", 1)[0]
    assert run(fm.ForwardExtendFixedQDraftExtend, after) == (State.DONE, after, State.DONE)


@pytest.mark.parametrize("release", [PRIMARY, NATIVE])
@pytest.mark.parametrize("variant", sorted(VENDOR_K_LENS))
def test_flashmla_forward_extend_vendor_k_lengths_are_a_note(release, variant):
    text = (fetch_tree(release) / FLASHMLA).read_text()
    forked = VENDOR_K_LENS[variant](text)
    if release == NATIVE:  # the fork also stopped handing the draft extend to the parent
        forked = sub(r"\n +ForwardMode\.DRAFT_EXTEND_V2,\n", "\n", forked, expected=1)
    compile(forked, FLASHMLA, "exec")
    found = finding(fm.ForwardExtendFixedQDraftExtend, forked, FLASHMLA)
    assert found.state is State.DONE and found.by_tree, found
    needle = (
        "self.forward_metadata.vendor_k_lens"
        if variant == "conditional-expression"
        else "k_lens = self._vendor_draft_k_lens"
    )
    assert f"the draft extend's own K lengths at {FLASHMLA}:{line_of(forked, needle)}" in found.detail
    assert run(fm.ForwardExtendFixedQDraftExtend, forked) == (State.DONE, forked, State.DONE)


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_flashmla_forward_extend_routing_spelled_another_way(route):
    text = (fetch_tree(NATIVE) / FLASHMLA).read_text()
    forked = sub(ROUTED_0_5_13, ROUTES[route], text, expected=1)
    forked = FORWARD_EXTEND_FORKS["local-variable"](forked)
    before, after, again = run(fm.ForwardExtendFixedQDraftExtend, forked)
    assert (before, again) == (State.TODO, State.DONE)
    body = after.split("def forward_extend", 1)[1].split("\nclass ", 1)[0]
    assert "DRAFT_EXTEND_V2" not in body and "is_draft_extend_v2" not in body
    assert "ForwardMode.EXTEND" in body and "ForwardMode.DRAFT_EXTEND" in body
    compile(after, FLASHMLA, "exec")


def test_flashmla_forward_extend_unknown_cache_seqlens_names_file_line_and_shape():
    forked = sub(
        VERIFY_LENS, "cache_seqlens=self._vendor_lengths(forward_batch),", (fetch_tree(PRIMARY) / FLASHMLA).read_text()
    )
    found = finding(fm.ForwardExtendFixedQDraftExtend, forked, FLASHMLA)
    assert found.state is State.MISSING
    assert found.detail.startswith(
        f"{FLASHMLA}:{line_of(forked, 'self._vendor_lengths(forward_batch)')}: the fixed-q kernel's cache_seqlens is `self._vendor_lengths(forward_batch)`"
    )


# -- replay-no-stale-mirror: the pinned buffer handed at replay -----------------------------------

REPLAY_FILES = {PRIMARY: [RUNNER, DRAFT_EXTEND_RUNNER], NATIVE: [RUNNER, DRAFT_EXTEND_RUNNER]}


class _HoistKwarg(cst.CSTTransformer):
    """``f(..., seq_lens_cpu=<pinned>)`` -> ``<local> = <pinned>`` on the line
    before and ``seq_lens_cpu=<local>``, in functions taking a forward_batch."""

    def __init__(self, local: str, vendor_fix: bool = False, instrument: bool = False) -> None:
        self.local, self.vendor_fix, self.instrument, self.depth, self.pending = local, vendor_fix, instrument, 0, []

    def visit_FunctionDef(self, node):
        self.depth += "forward_batch" in {p.name.value for p in node.params.params}

    def leave_FunctionDef(self, original, updated):
        self.depth -= "forward_batch" in {p.name.value for p in original.params.params}
        return updated

    def leave_Arg(self, original, updated):
        if self.depth and cst.ensure_type(updated, cst.Arg).keyword is not None and m.matches(updated, rnsm.RAW_KWARG):
            value = rnsm.code_of(updated.value)
            if self.vendor_fix:
                return updated.with_changes(
                    value=cst.parse_expression(f"({value} if forward_batch.seq_lens_cpu is not None else None)")
                )
            self.pending.append(cst.parse_statement(f"{self.local} = {value}\n"))
            if self.instrument:
                self.pending.append(cst.parse_statement(f"logger.debug('fork: replay with %s', {self.local}.shape)\n"))
            return updated.with_changes(value=cst.Name(self.local))
        return updated

    def leave_SimpleStatementLine(self, original, updated):
        if not self.pending:
            return updated
        added, self.pending = self.pending, []
        return cst.FlattenSentinel([*added, updated])


import libcst.matchers as m  # noqa: E402

REPLAY_FORKS = {
    "buffer-held-elsewhere": lambda t: sub(
        r"seq_lens_cpu=buffers\.seq_lens_cpu", "seq_lens_cpu=self.graph_buffers.seq_lens_cpu", t
    ),
    "pinned-buffer-in-a-local": lambda t: cst.parse_module(t).visit(_HoistKwarg("pinned_seq_lens")).code,
    "instrumented-and-in-a-local": lambda t: cst.parse_module(t).visit(_HoistKwarg("host_lens", instrument=True)).code,
}


@pytest.mark.parametrize("release", [PRIMARY, NATIVE])
@pytest.mark.parametrize("variant", sorted(REPLAY_FORKS))
def test_replay_buffer_spelled_another_way(release, variant):
    for rel in REPLAY_FILES[release]:
        forked = REPLAY_FORKS[variant]((fetch_tree(release) / rel).read_text())
        compile(forked, rel, "exec")
        before, after, again = run(rnsm.ReplayPassesNoStaleMirror, forked)
        assert (before, again) == (State.TODO, State.DONE), rel
        assert "mirror_or_none(forward_batch.seq_lens_cpu, " in after
        assert run(rnsm.ReplayPassesNoStaleMirror, after) == (State.DONE, after, State.DONE)


@pytest.mark.parametrize("release", [PRIMARY, NATIVE])
def test_replay_vendor_own_none_is_a_note(release):
    for rel in REPLAY_FILES[release]:
        forked = cst.parse_module((fetch_tree(release) / rel).read_text()).visit(_HoistKwarg("", vendor_fix=True)).code
        compile(forked, rel, "exec")
        found = finding(rnsm.ReplayPassesNoStaleMirror, forked, rel)
        assert found.state is State.DONE and found.by_tree, found
        line = line_of(forked, "if forward_batch.seq_lens_cpu is not None else None")
        assert (
            found.detail
            == f"this tree already hands the backend None without the batch's mirror at {rel}:{line}; patchkit leaves it as it is"
        )
        assert run(rnsm.ReplayPassesNoStaleMirror, forked) == (State.DONE, forked, State.DONE)


# -- FA3 and TRT-LLM MHA: the host max of the mirror, spelled another way ------------------------

HOST_MAX = r"forward_batch\.seq_lens_cpu\.max\(\)\.item\(\)"
HOST_MAX_FORKS = {
    "int-of-max": "int(forward_batch.seq_lens_cpu.max())",
    "torch-max-item": "torch.max(forward_batch.seq_lens_cpu).item()",
}


@pytest.mark.parametrize("variant", sorted(HOST_MAX_FORKS))
@pytest.mark.parametrize(
    "rel, codemod", [(FA3, fa3.EagerMetadataWithoutMirror), (TRTLLM_MHA, mha.EagerMetadataWithoutMirror)]
)
def test_eager_host_max_spelled_another_way(rel, codemod, variant):
    forked = sub(HOST_MAX, HOST_MAX_FORKS[variant], (fetch_tree(PRIMARY) / rel).read_text(), count=1)
    before, after, again = run(codemod, forked)
    assert (before, again) == (State.TODO, State.DONE)
    assert (
        HOST_MAX_FORKS[variant] not in after
        and "host_max_seq_len(forward_batch.seq_lens_cpu, self.max_context_len, forward_batch)" in after
    )


# -- the whole tree, once -------------------------------------------------------------------------


def test_forked_tree_applies_verifies_and_reverts_exactly(make_tree, cli):
    """One fork of each file above (and a metrics mixin that no longer reads
    the mirror) on 0.5.12.post1: every patch applies, the vendor's own changes
    are notes, verify passes and revert restores the fork byte for byte."""
    from test_vendor_forks import METRICS, fork_dropped_metric_reads

    tree = make_tree(PRIMARY)
    edits = {
        FLASHMLA: FORWARD_EXTEND_FORKS["draft-tokens-in-a-local"],
        FA3: lambda t: sub(HOST_MAX, HOST_MAX_FORKS["int-of-max"], t, count=1),
        TRTLLM_MHA: lambda t: sub(HOST_MAX, HOST_MAX_FORKS["torch-max-item"], t, count=1),
        RUNNER: REPLAY_FORKS["pinned-buffer-in-a-local"],
        DRAFT_EXTEND_RUNNER: lambda t: cst.parse_module(t).visit(_HoistKwarg("", vendor_fix=True)).code,
        METRICS: fork_dropped_metric_reads,
    }
    for rel, edit in edits.items():
        (tree / rel).write_text(edit((tree / rel).read_text()))
    forked = snapshot(tree)

    applied = cli("apply", tree)
    assert applied.exit_code == 0, applied.output
    states = patch_states(cli, tree)
    assert carried_states({pid: p["state"] for pid, p in states.items()}) == {"applied"}
    assert any("reads no CPU seq_lens mirror here" in n for n in states["needs-cpu-seq-lens"]["notes"])
    assert any(
        "hands the backend None without the batch's mirror" in n for n in states["replay-no-stale-mirror"]["notes"]
    )
    assert "fixed_q_cache_seqlens(forward_batch, self.forward_metadata, num_draft)" in (tree / FLASHMLA).read_text()
    verified = cli("verify", tree)
    assert verified.exit_code == 0 and "verify: OK" in verified.output, verified.output
    assert cli("apply", tree).exit_code == 0

    assert cli("revert", tree).exit_code == 0
    assert snapshot(tree) == forked


# -- TRT-LLM MHA: the eager page table (sglang #28106's eager half) --------------------------------

STRIDE_BLOCK = r"\n        if self\.page_size > 1:\n            self\.strided_indices = .*?// self\.page_size\n                \)\n"
EAGER_FORKS = {
    # the striding moved into a helper of the fork's own
    "striding-in-a-helper": lambda t: sub(
        STRIDE_BLOCK, "\n        metadata.page_table = self._pages_of(metadata.page_table)\n", t, expected=1
    ),
    # the SWA switch spelled as 0.5.13 does, the translator called by keyword
    "swa-switch-and-keyword": lambda t: sub(
        r"if not self\.use_sliding_window_kv_pool:\n            return None\n        shape",
        "if self._swa_kv_pool is None:\n            return None\n        shape",
        sub(
            r"self\._maybe_translate_swa\(metadata\.page_table\)",
            "self._maybe_translate_swa(token_indices=metadata.page_table)",
            t,
            expected=1,
        ),
        expected=1,
    ),
}


@pytest.mark.parametrize("variant", sorted(EAGER_FORKS))
def test_eager_page_table_on_forked_real_file(variant):
    forked = EAGER_FORKS[variant]((fetch_tree(PRIMARY) / TRTLLM_MHA).read_text())
    before, after, again = run(mha.EagerPageTableOnDevice, forked)
    assert (before, again) == (State.TODO, State.DONE)
    compile(after, TRTLLM_MHA, "exec")
    switch = (
        "self._swa_kv_pool is None" if variant == "swa-switch-and-keyword" else "not self.use_sliding_window_kv_pool"
    )
    assert f"        page_table_on_device = {switch}\n" in after
    assert after.count("if not page_table_on_device:") == 5  # four gathers and the striding
    assert "eager_page_table(forward_batch.req_to_token_pool.req_to_token, forward_batch.req_pool_indices, " in after
