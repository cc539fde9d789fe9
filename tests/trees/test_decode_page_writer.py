"""fa3-spec-v2's cut of the fused decode page writer (sglang #32109): the
codemod on the kernels, then the real 0.5.13 kernels, pristine and patched,
run under Triton's interpreter on CPU (a subprocess: the flag is read at
import)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from patchkit.codemods import fa3_spec_v2 as fa3
from patchkit.fetch import fetch_tree
from patchkit.testing import apply

WRITER = "srt/layers/attention/triton_ops/metadata.py"
CUT = fa3.DecodePageWriterStopsAtLivePages


RUN = textwrap.dedent("""
    import sys, types, torch
    def load(path):
        module = types.ModuleType("writer")
        exec(compile(open(path).read(), path, "exec"), module.__dict__)
        return module
    pristine, patched = load(sys.argv[1]), load(sys.argv[2])
    req_to_token = torch.arange(4 * 512, dtype=torch.int32).reshape(4, 512)
    pool, seq_lens = torch.tensor([2, 0, 3]), torch.tensor([5, 300, 0])
    for page_size, delta in ((1, 2), (16, 1)):
        width = 512 // page_size
        tables = []
        for module in (pristine, patched):
            lens, cu = torch.zeros(3, dtype=torch.int32), torch.zeros(4, dtype=torch.int32)
            table = torch.full((3, width), -1, dtype=torch.int32)
            module.normal_decode_set_metadata(lens, cu, table, req_to_token, pool, torch.arange(0, 512, page_size),
                                              width, seq_lens, delta, page_size)
            assert lens.tolist() == [n + delta for n in seq_lens.tolist()]
            tables.append((table, lens, cu))
        (old, old_lens, old_cu), (new, new_lens, new_cu) = tables
        assert torch.equal(old_lens, new_lens) and torch.equal(old_cu, new_cu)
        assert (old != -1).all()  # pristine: every column of every row
        for row, n in enumerate(new_lens.tolist()):
            live = -(-n // page_size)
            assert torch.equal(new[row, :live], old[row, :live]), (page_size, row)
            assert (new[row, live:] == -1).all(), (page_size, row)
    print("same live columns")
""")


@pytest.mark.trees
def test_the_patched_013_kernels_under_the_interpreter(tmp_path):
    pytest.importorskip("triton")
    pristine = fetch_tree("0.5.13") / WRITER
    patched = tmp_path / "metadata.py"
    patched.write_text(apply(CUT, pristine.read_text()))
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run(
        [sys.executable, "-c", RUN, str(pristine), str(patched)], env=env, capture_output=True, text=True, timeout=400
    )
    assert done.returncode == 0 and "same live columns" in done.stdout, done.stderr[-3000:]
