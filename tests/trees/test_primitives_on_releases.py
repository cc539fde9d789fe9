"""The edit primitives agree with libcst on real release files (on snippets:
tests/unit/test_primitives.py)."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m
import pytest
from support import libcst_add_imports, pristine

from patchkit import registry
from patchkit.codemods.common import primitives as p


@pytest.mark.trees
def test_find_all_agrees_with_libcst_findall_on_a_real_tree():
    """find_all is a fast m.findall: same nodes, same (source) order."""
    matchers = [
        m.Attribute(attr=m.Name("seq_lens_cpu")),
        m.Name("seq_lens_sum") | m.Name("self"),
        m.Call(func=m.Name("isinstance")),
        m.SimpleStatementLine(body=[m.Assign()]),
        m.If(),
        m.FunctionDef(),
        m.Name(),
    ]
    srt = pristine("0.5.12.post1") / "srt"
    attention = srt / "layers" / "attention"
    paths = sorted((srt / "speculative").glob("eagle*.py")) + [
        attention / "trtllm_mla_backend.py",
        attention / "triton_backend.py",
    ]
    for path in paths:
        module = cst.parse_module(path.read_bytes())
        for matcher in matchers:
            expected = list(m.findall(module, matcher))
            got = p.find_all(module, matcher)
            assert [id(n) for n in got] == [id(n) for n in expected], (path.name, matcher)


@pytest.mark.trees
@pytest.mark.parametrize("version", ["0.5.10", "0.5.11", "0.5.12.post1"])
def test_add_imports_matches_libcst_on_real_target_files(version):
    tree = pristine(version)
    wanted = [
        ("patchkit.runtime", "needs_cpu_seq_lens"),
        ("patchkit.runtime", "add_or_none"),
        ("sglang.srt.model_executor.forward_batch_info", "ForwardMode"),
    ]
    files = sorted({t.file for patch in registry.all_patches() for t in patch.targets if (tree / t.file).exists()})
    assert files
    for rel in files:
        module = cst.parse_module((tree / rel).read_bytes())
        assert p.add_imports(module, wanted).code == libcst_add_imports(module, wanted).code, rel
