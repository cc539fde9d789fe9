"""Test helpers for codemods and patch sets (patchkit's own and a vendor's).

Two levels, as in LibCST's ``CodemodTest`` and ``fixit.testing``:

**Snippets** (before/after pairs). A codemod runs the way the engine runs it:
detect, transform when TODO, add the imports it asked for, detect again.

- ``assert_codemod(cls, before, after)``: TODO on ``before``, the whole output
  is exactly ``after``, DONE on it (and on its reparse), and a second run
  changes nothing.
- ``assert_state(cls, src, state, detail=None)``: the detector says ``state``
  (``detail`` in its detail) and, unless TODO, running leaves ``src`` as it is.
- ``run``, ``apply``, ``detect``, ``run_all``: for tests that look at part of
  the output. Snippets are dedented (``code``).
- ``CodemodTest``: a ``unittest.TestCase`` base with ``TRANSFORM = cls``,
  ``assertCodemod(before, after)`` / ``assertState(src, state)``, and the
  pairs in ``EXAMPLES = [(before, after), ...]`` and ``LEFT_ALONE = [(src,
  State.DONE), ...]`` run by generated tests.
- ``set_codemod(folder, "module:Class")``: a codemod of a patch set folder,
  loaded as ``patchkit --patches folder`` loads it (no ``sys.path`` edits).

**A real release.** ``check_release(patch, version, workdir, patches=[folder])``
copies ``sglang==version`` (downloaded once into patchkit's cache,
``$PATCHKIT_CACHE_DIR``, default ``~/.cache/patchkit``; transforms of
patchkit's own codemods are cached there too), applies the patch through the
command line, verifies it, applies again (must change nothing), reverts, and
checks every file is byte for byte the release's; it returns what the apply
wrote (``ReleaseCheck.text(path)``). ``release_tree``, ``invoke`` and
``digests`` are its parts.

The names in ``__all__`` are the stable API. Failures raise ``AssertionError``
(also under ``python -O``). Nothing here imports pytest.
"""

from __future__ import annotations

import hashlib
import textwrap
import unittest
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Optional, Union

import libcst as cst
from libcst.codemod import CodemodContext

from patchkit.findings import Finding, State

if TYPE_CHECKING:
    from click.testing import Result

__all__ = [
    "CodemodTest",
    "Finding",
    "ReleaseCheck",
    "State",
    "apply",
    "assert_codemod",
    "assert_state",
    "check_release",
    "code",
    "detect",
    "digests",
    "invoke",
    "release_tree",
    "run",
    "run_all",
    "set_codemod",
]


def _check(ok: bool, message: object) -> None:
    if not ok:
        raise AssertionError(message)


# --- snippets -----------------------------------------------------------------------


def code(src: str) -> str:
    """A snippet written indented in a test, as file text."""
    return textwrap.dedent(src).lstrip("\n")


def detect(codemod: type, src: str, filename: Optional[str] = None) -> Finding:
    """The finding on ``src``; with ``filename``, as the engine names the file
    (messages then say FILE:LINE)."""
    return codemod(CodemodContext(filename=filename)).detect(cst.parse_module(code(src)))


def run(codemod: type, src: str) -> tuple[State, str, State]:
    """(state before, code after, state after), as the engine runs a codemod:
    detect, transform when TODO, add the imports it asked for, detect again."""
    from patchkit.codemods.common.primitives import add_needed_imports

    module = cst.parse_module(code(src))
    before = codemod().detect(module).state
    if before is State.TODO:
        context = CodemodContext()
        module = add_needed_imports(codemod(context).transform_module(module), context)
    return before, module.code, codemod().detect(module).state


def run_all(codemods: Sequence[type], src: str) -> tuple[str, list[State]]:
    """Several codemods of one file, as the engine runs them: each TODO one
    transforms in order, the imports are added once, then every one detects.
    Returns (code after, [state after of each])."""
    from patchkit.codemods.common.primitives import add_needed_imports

    module = cst.parse_module(code(src))
    context = CodemodContext()
    for codemod in codemods:
        if codemod().detect(module).state is State.TODO:
            module = codemod(context).transform_module(module)
    module = add_needed_imports(module, context)
    return module.code, [codemod().detect(module).state for codemod in codemods]


def apply(codemod: type, src: str) -> str:
    """The output of one TODO -> DONE run (DONE again on its reparse: idempotent)."""
    before, out, after = run(codemod, src)
    _check((before, after) == (State.TODO, State.DONE), (before, after))
    _check(codemod().detect(cst.parse_module(out)).state is State.DONE, "not DONE once reparsed")
    return out


def assert_codemod(codemod: type, before: str, after: str) -> None:
    """``before`` becomes exactly ``after`` (the whole file), which is DONE and
    stays as it is when run again."""
    out = apply(codemod, before)
    _check(out == code(after), "\n" + out)
    assert_state(codemod, out, State.DONE)


def assert_state(codemod: type, src: str, state: State, detail: Optional[str] = None) -> Finding:
    """The detector says ``state`` (and ``detail`` is in its detail); a
    codemod that is not TODO leaves the source as it is."""
    finding = detect(codemod, src)
    _check(finding.state is state, finding)
    if detail is not None:
        _check(detail in finding.detail, finding.detail)
    if state is not State.TODO:
        again, out, after = run(codemod, src)
        _check((again, after) == (state, state) and out == code(src), (again, after))
    return finding


def set_codemod(folder: Union[str, Path], ref: str) -> type:
    """The codemod ``module:Class`` of the patch set in ``folder``, loaded as
    ``patchkit --patches folder`` loads it."""
    from patchkit.registry.definitions import load_codemod
    from patchkit.registry.sets import folder_set

    patch_set = folder_set(Path(folder).expanduser().resolve(), "patchkit.testing.set_codemod")
    return load_codemod(patch_set.ref(ref, ref))


class CodemodTest(unittest.TestCase):
    """As LibCST's ``CodemodTest``: set ``TRANSFORM`` to the codemod class and
    call ``self.assertCodemod(before, after)``; list before/after pairs in
    ``EXAMPLES`` and (source, state) pairs in ``LEFT_ALONE`` to have them
    checked by ``test_examples`` / ``test_left_alone`` (as fixit's VALID and
    INVALID). Runs under pytest and unittest."""

    __test__ = False  # this base: no tests of its own
    TRANSFORM: ClassVar[Optional[type]] = None
    EXAMPLES: ClassVar[Sequence[tuple[str, str]]] = ()
    LEFT_ALONE: ClassVar[Sequence[tuple[str, State]]] = ()

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls.__test__ = True

    def _codemod(self) -> type:
        if self.TRANSFORM is None:
            raise TypeError(f"{type(self).__name__}: set TRANSFORM to the codemod class under test")
        return self.TRANSFORM

    def assertCodemod(self, before: str, after: str) -> None:  # noqa: N802 - unittest's naming
        assert_codemod(self._codemod(), before, after)

    def assertState(self, src: str, state: State, detail: Optional[str] = None) -> Finding:  # noqa: N802
        return assert_state(self._codemod(), src, state, detail)

    def test_examples(self) -> None:
        for i, (before, after) in enumerate(self.EXAMPLES):
            with self.subTest(example=i):
                self.assertCodemod(before, after)

    def test_left_alone(self) -> None:
        for i, (src, state) in enumerate(self.LEFT_ALONE):
            with self.subTest(left_alone=i):
                self.assertState(src, state)


# --- a real release ---------------------------------------------------------------


def release_tree(version: str, workdir: Union[str, Path], layout: str = "package") -> Path:
    """A private copy of sglang==``version`` under ``workdir``, as the path a
    user passes to patchkit. The release is downloaded once into patchkit's
    cache and copied from there. layout: ``package`` (workdir/sglang),
    ``python`` or ``checkout`` (workdir/python/sglang)."""
    from patchkit.fetch import copy_tree

    return copy_tree(version, Path(workdir), layout)


def invoke(*args: object, patches: Iterable[Union[str, Path]] = ()) -> "Result":
    """Run the ``patchkit`` command line in this process (``--patches`` for
    each folder); its exceptions other than exit propagate."""
    from click.testing import CliRunner

    from patchkit.cli import main

    options = [part for folder in patches for part in ("--patches", str(folder))]
    return CliRunner().invoke(main, [*options, *map(str, args)], catch_exceptions=False)


def digests(folder: Union[str, Path]) -> dict[str, str]:
    """sha256 of every file under ``folder`` by relative path (patchkit's
    ``.patchkit`` state and bytecode caches aside)."""
    folder = Path(folder)
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not {".patchkit", "__pycache__"} & set(p.relative_to(folder).parts)
    }


@dataclass(frozen=True)
class ReleaseCheck:
    """What ``check_release`` saw: the tree (reverted again), and the bytes
    of every file the apply changed or added, by path in the package."""

    version: str
    tree: Path
    written: dict[str, bytes] = field(repr=False)

    def text(self, path: str) -> str:
        """A file as the apply left it (``srt/...``, relative to ``sglang/``)."""
        _check(path in self.written, f"{path}: the apply did not write it (it wrote {sorted(self.written)})")
        return self.written[path].decode("utf-8")


def check_release(
    patch: Union[str, Sequence[str]],
    version: str,
    workdir: Union[str, Path],
    *,
    patches: Iterable[Union[str, Path]] = (),
    layout: str = "package",
) -> ReleaseCheck:
    """Apply ``patch`` (an id or several) to a copy of sglang==``version``
    through the command line, then: ``verify`` passes, a second ``apply``
    changes nothing, ``revert`` gives every file back byte for byte. Patch
    sets outside patchkit are named by ``patches`` (folders)."""
    from patchkit.tree import find_tree

    ids = [patch] if isinstance(patch, str) else list(patch)
    patches = list(patches)
    tree = release_tree(version, workdir, layout)
    package = find_tree(tree).package
    pristine = digests(package)

    def ok(*args: object) -> None:
        result = invoke(*args, patches=patches)
        _check(result.exit_code == 0, f"patchkit {' '.join(map(str, args))}: exit {result.exit_code}\n{result.output}")

    ok("apply", tree, *ids)
    patched = digests(package)
    written = {rel: (package / rel).read_bytes() for rel, sha in patched.items() if pristine.get(rel) != sha}
    ok("verify", tree, *ids)
    ok("apply", tree, *ids)
    _check(digests(package) == patched, "a second apply changed the tree")
    ok("revert", tree, *ids)
    now = digests(package)
    changed = sorted(rel for rel in pristine.keys() | now.keys() if pristine.get(rel) != now.get(rel))
    _check(not changed, f"revert is not exact: {changed}")
    return ReleaseCheck(version, tree, written)
