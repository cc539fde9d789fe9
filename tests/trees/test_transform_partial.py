"""patchkit/transform/partial.py: a file parsed only where its codemods read,
the rest kept verbatim, generates the file's own bytes, and transforms to the
very bytes and findings a whole parse gives (on real trees: the primary
release here; every known release's bytes in tests/trees/test_patched_digests.py,
recorded from whole parses)."""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

import libcst as cst
import pytest
from support import PRIMARY, pristine

from patchkit import known_releases, registry, transform
from patchkit.codemods.common.reads import Methods
from patchkit.findings import State
from patchkit.transform import partial


def _transformed(rel: str, source: bytes, module: cst.Module, codemods: list) -> tuple:
    found = [transform.detect(rel, source, lambda: module, c) for c in codemods]
    effective = [(c, f) for c, f in zip(codemods, found) if f.state is not State.MISSING]
    result = transform.run(rel, Path(rel), module, [c for c, _ in effective], [f for _, f in effective], source)
    return result.new, {k: f.as_list() for k, f in result.after.items()}, [f.as_list() for f in found]


def test_primary_files_transform_alike_parsed_whole_or_in_part():
    """The proof of every codemod's declaration of what it reads
    (``reads.Methods``) on the primary release: the files a partial parse is
    used on transform to the same bytes and findings parsed whole or in part.
    On every known release, the bytes are proven by
    tests/trees/test_patched_digests.py (recorded from whole parses)."""
    root = pristine(PRIMARY)
    files: dict[str, list] = {}
    for patch in registry.all_patches():
        for target in patch.targets:
            if (root / target.file).is_file():
                files.setdefault(target.file, []).extend(registry.load_codemod(r) for r in target.refs)
    in_part = 0
    for rel, codemods in files.items():
        source = (root / rel).read_bytes()
        module = transform.parse_for(rel, source, root / rel, codemods)
        assert module.bytes == source
        if any(type(s) is partial.Verbatim for s in module.body) or _has_verbatim_method(module):
            in_part += 1
            assert _transformed(rel, source, module, codemods) == _transformed(
                rel, source, transform.parse(source, root / rel), codemods
            ), rel
    assert in_part >= 5  # scheduler.py, schedule_batch.py, the metrics mixin, ...


@pytest.mark.parametrize("version", sorted(known_releases._table()[0]))
def test_real_files_parse_in_part_to_their_bytes(version):
    """On each release patchkit knows, every target file's partial parse gives
    its bytes back, and at least five parse in part. That they transform alike
    parsed whole or in part: the bytes on every release by
    tests/trees/test_patched_digests.py (the digests are recorded from whole
    parses; this test transformed each such file both ways before), bytes and
    findings on the primary release above."""
    root = pristine(version)
    files: dict[str, list] = {}
    for patch in registry.all_patches():
        for target in patch.targets:
            if (root / target.file).is_file():
                files.setdefault(target.file, []).extend(registry.load_codemod(r) for r in target.refs)
    in_part = 0
    for rel, codemods in files.items():
        source = (root / rel).read_bytes()
        # Releases share many files byte for byte: the same bytes under the
        # same codemods were parsed for an earlier release of this run.
        key = (rel, hashlib.sha256(source).hexdigest(), tuple(registry.codemod_name(c) for c in codemods))
        if key not in _PARSED:
            module = transform.parse_for(rel, source, root / rel, codemods)
            assert module.bytes == source, (version, rel)
            _PARSED[key] = any(type(s) is partial.Verbatim for s in module.body) or _has_verbatim_method(module)
        in_part += _PARSED[key]
    assert in_part >= 5  # scheduler.py, schedule_batch.py, the metrics mixin, ...


#: (file, sha256 of its bytes, codemods) -> parsed in part.
_PARSED: dict[tuple, bool] = {}


def _has_verbatim_method(module: cst.Module) -> bool:
    return any(
        type(s) is cst.ClassDef
        and isinstance(s.body, cst.IndentedBlock)
        and any(type(i) is partial.Verbatim for i in s.body.body)
        for s in module.body
    )


def test_every_module_of_the_attention_and_speculative_packages_round_trips():
    """Every class and method left out at once: the skeleton's parse must give
    the bytes back (it is how the libcst comment quirk above was found)."""
    root = pristine(PRIMARY) / "srt"
    checked = 0
    for folder in ("layers/attention", "speculative", "managers", "model_executor"):
        for path in sorted((root / folder).rglob("*.py")):
            source = path.read_bytes()
            classes = {c.name: Methods() for c in ast.parse(source).body if isinstance(c, ast.ClassDef)}
            for reads in ({}, classes):
                module = partial.parse(source, reads)
                if module is not None:
                    checked += 1
                    assert module.bytes == source, path
    assert checked > 50
