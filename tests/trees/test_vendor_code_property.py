"""Property: random vendor insertions (an extra statement, keyword argument or
tuple member) inside the regions every patch changes either survive the
transform or are refused with their line (issue 29 §1). Seeded, and bounded:
a few files per release, every region of each file in one transform."""

from __future__ import annotations

import ast
import difflib
import random
import re
import time
from pathlib import Path

import pytest

from patchkit import fetch, registry, transform
from patchkit.errors import PatchkitError
from patchkit.findings import State
from patchkit.transform import vendor_code

FILES_PER_RELEASE = 3
BUDGET_S = 40.0


def _codemods(rel: str, source: bytes, path: Path) -> list:
    module = transform.parse(source, path)
    refs = []
    for patch in registry.all_patches():
        for target in patch.targets:
            if target.file != rel:
                continue
            found = [transform.detect(rel, source, lambda: module, registry.load_codemod(r)) for r in target.refs]
            if all(f.state is not State.MISSING for f in found):
                refs += list(target.refs)
    return [registry.load_codemod(r) for r in refs]


def _run(rel: str, source: bytes, pristine: bytes) -> bytes:
    path = Path("/fork") / rel
    module = transform.parse(source, path)
    return transform.run(rel, path, module, _codemods(rel, source, path), (), source, pristine).new


def _regions(rel: str, pristine: bytes) -> list[tuple[int, int]]:
    """Line ranges of the release's file that the patches change."""
    new = _run(rel, pristine, pristine)
    a, b = pristine.decode().splitlines(), new.decode().splitlines()
    out = []
    for tag, i1, i2, _, _ in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag in ("replace", "delete"):
            out.append((i1 + 1, i2))
        elif tag == "insert":
            out.append((max(1, i1), i1 + 1))
    return out


def _candidates(tree: ast.Module, lo: int, hi: int, shape: str) -> list[ast.AST]:
    def overlaps(node):
        return node.lineno <= hi and node.end_lineno >= lo

    if shape == "statement":
        return [
            s
            for node in ast.walk(tree)
            for f in ("body", "orelse", "finalbody")
            if isinstance(getattr(node, f, None), list)
            for s in getattr(node, f)
            if isinstance(s, ast.stmt) and overlaps(s)
        ]
    kind = ast.Call if shape == "keyword" else ast.Tuple
    return [n for n in ast.walk(tree) if isinstance(n, kind) and overlaps(n)]


def _insert(lines: list[str], node: ast.AST, shape: str, token: str) -> list[str]:
    if shape == "statement":
        return lines[: node.end_lineno] + [" " * node.col_offset + f"{token} = 1\n"] + lines[node.end_lineno :]
    line = lines[node.end_lineno - 1]
    col = len(line.encode()[: node.end_col_offset].decode())
    head, tail = line[:col], line[col:]
    item = f"{token}=1" if shape == "keyword" else token
    if not head.endswith(")"):  # a bare tuple: `a, b`
        return lines[: node.end_lineno - 1] + [f"{head}, {item}{tail}"] + lines[node.end_lineno :]
    inner = head[:-1]
    before = ("".join(lines[node.lineno - 1 : node.end_lineno - 1]) + inner).rstrip()
    if before.endswith("("):
        add = item + ("," if shape == "member" else "")
    elif before.endswith(","):
        add = f" {item},"
    else:
        add = f", {item}"
    return lines[: node.end_lineno - 1] + [f"{inner}{add}){tail}"] + lines[node.end_lineno :]


def _fork(pristine: str, regions: list[tuple[int, int]], rng: random.Random, skip: set[str]) -> tuple[str, list[str]]:
    """The file with one insertion per region (bottom up, so line numbers
    above stay put), the tokens inserted."""
    tree = ast.parse(pristine)
    lines = pristine.splitlines(keepends=True)
    tokens, floor = [], float("inf")
    for k, (lo, hi) in sorted(enumerate(regions), key=lambda item: -item[1][0]):
        shape = rng.choice(["statement", "keyword", "member"])
        token = f"acme_{shape}_{k}"
        nodes = [n for n in _candidates(tree, lo, hi, shape) if n.end_lineno < floor]
        rng.shuffle(nodes)
        for node in nodes[:3]:
            if token in skip:
                break
            new = _insert(lines, node, shape, token)
            try:
                ast.parse("".join(new))
            except SyntaxError:
                continue
            lines, floor = new, node.lineno
            tokens.append(token)
            break
    return "".join(lines), tokens


@pytest.mark.parametrize("version,seed", [("0.5.11", 11), ("0.5.12.post1", 12)])
def test_random_vendor_insertions_survive_or_are_refused(version, seed):
    from patchkit.fetch import fetch_tree

    fetch_tree(version)
    rng = random.Random(seed)
    files = sorted({t.file for p in registry.all_patches() for t in p.targets})
    files = [f for f in files if fetch.pristine_source(version, f)]
    start = time.monotonic()
    checked = refused = 0
    for rel in rng.sample(files, min(FILES_PER_RELEASE, len(files))):
        if time.monotonic() - start > BUDGET_S:
            break
        pristine = fetch.pristine_source(version, rel)
        regions = _regions(rel, pristine)
        if not regions:
            continue
        skip: set[str] = set()
        while time.monotonic() - start < BUDGET_S:
            source, tokens = _fork(pristine.decode(), regions, random.Random(f"{seed}{rel}"), skip)
            if not tokens:
                break
            lines = source.splitlines()
            try:
                new = _run(rel, source.encode(), pristine).decode()
            except vendor_code.VendorCodeLost as exc:
                line = int(re.search(r"^refused: [^:]+:(\d+): ", str(exc)).group(1))
                hit = [t for t in tokens if t in lines[line - 1]]
                assert hit, f"{rel}:{line} refused, but none of the vendor's tokens is there: {exc}"
                skip.update(hit)
                refused += 1
                continue
            except PatchkitError:
                break  # an insertion hid an anchor: the whole file is refused, nothing changed
            missing = [t for t in tokens if t not in new]
            assert not missing, f"{rel}: vendor tokens silently lost: {missing}"
            checked += len(tokens)
            break
    assert checked + refused > 0
