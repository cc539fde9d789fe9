"""One file, its codemods, and nothing else: parse, detect, transform.

Pure functions of their arguments (bytes in, bytes and findings out): the
session calls them for the serial path, and ``patchkit.transform.parallel`` calls them
in worker processes, so neither climbs back up to whoever asked.

The package's public face: the pools (``interruptible_pool``) are reached
here too, never in ``patchkit.transform.parallel`` itself.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from patchkit import python_ast
from patchkit.errors import PatchkitError, failure_in
from patchkit.findings import Finding, State

if TYPE_CHECKING:  # libcst is imported only when a file must be parsed
    import libcst as cst

    from patchkit.codemods.common.base import PatchCodemod


def parse(source: bytes, path: Path) -> "cst.Module":
    """One file's libcst tree; what cannot be parsed is one line naming the file."""
    import libcst as cst

    try:
        return cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        raise PatchkitError(f"{path}:{exc.raw_line}: syntax error, cannot patch ({exc.message})") from None
    except UnicodeDecodeError as exc:
        line = source[: exc.start].count(b"\n") + 1
        raise PatchkitError(
            f"{path}:{line}: byte 0x{source[exc.start]:02x} is not {exc.encoding.upper()}, cannot patch "
            "(fix the byte, or declare the file's encoding in a coding line; nothing was changed)"
        ) from None


def parse_for(
    rel: str, source: bytes, path: Path, codemods: Sequence[type["PatchCodemod"]], pristine: Optional[bytes] = None
) -> "cst.Module":
    """``source`` (the file ``rel``) parsed for ``codemods``: the parts none
    of them reads left unparsed (``patchkit.transform.partial``) where the
    bytes are a known release's own (``known_releases.ships``: tests prove
    each codemod's declaration of what it reads on every such release),
    unless the vendor-code check will read the whole tree (``source`` is not
    the tree's release's ``pristine`` bytes)."""
    from patchkit import known_releases
    from patchkit.transform import partial

    whole = (pristine is not None and pristine != source) or not known_releases.ships(rel, source)
    module = None if whole else partial.parse(source, partial.names_read(codemods))
    return module if module is not None else parse(source, path)


def detect(rel: str, source: bytes, module: Callable[[], "cst.Module"], codemod: type["PatchCodemod"]) -> Finding:
    """``codemod``'s finding on the file ``rel``; ``module`` parses it, and
    is not called when the bytes lack the codemod's REQUIRED_TEXT."""
    from libcst.codemod import CodemodContext

    for needle in codemod.REQUIRED_TEXT:
        if needle.encode() not in source:
            return Finding.missing(needle, f"{needle} does not occur in the file")
    # The file name lets a finding say where it is (``PatchCodemod.where``).
    with _running(codemod, rel):
        return codemod(CodemodContext(filename=rel)).detect(module())


def _running(codemod: type["PatchCodemod"], rel: str) -> failure_in:
    """A codemod that raises (a patch set's may, any way): one line naming it and the file."""
    return failure_in(f"codemod {codemod.name()} on {rel}")


@dataclass
class Transformed:
    new: bytes
    after: dict[str, Finding]  # codemod name -> its finding on ``new`` (the postcondition)
    transformed: list[str] = field(default_factory=list)  # codemods that changed the file, in order
    notes: list[str] = field(default_factory=list)  # vendor code a codemod replaces on purpose (one line each)


# Indented comment lines ending a file (blank lines between them and after):
# after a top-level statement, libcst's parser drops them, so they must be
# found at the end of what the transform writes.
_TRAILING_COMMENTS = re.compile(rb"(?:\n[ \t]+#[^\n]*)(?:\n[ \t]*(?:#[^\n]*)?)*\n?\Z")


def _trailing_comments_kept(source: bytes, new: bytes) -> Optional[int]:
    """None where ``new`` keeps the indented comments ending ``source``, else
    the 1-based line where the first of them is."""
    found = _TRAILING_COMMENTS.search(source[-65536:])
    if found is None or new.rstrip().endswith(found.group().rstrip()):
        return None
    return source.count(b"\n", 0, len(source) - len(found.group())) + 2


def _reads_unchanged(codemod: "PatchCodemod", before: "cst.Module", after: "cst.Module") -> bool:
    """Whether the top-level statements ``codemod`` reads (``PatchCodemod.reads``)
    are the very nodes in both modules: its detection on ``before`` holds."""
    from patchkit.codemods.common.reads import EVERY

    reads = codemod.reads()
    if reads is None or EVERY in reads:
        return False

    def named(module: "cst.Module") -> list:
        return [s for s in module.body if getattr(getattr(s, "name", None), "value", None) in reads]

    old, new = named(before), named(after)
    return len(old) == len(new) and all(a is b for a, b in zip(old, new))


def _owners(rel: str, names: Sequence[str]) -> dict[str, str]:
    """Which patch each codemod named is of, for the file ``rel`` (the first patch that lists it there)."""
    from patchkit import registry

    found: dict[str, str] = {}
    for patch in registry.all_patches():
        for target in patch.targets:
            if target.file == rel:
                for name in target.names:
                    if name in names:
                        found.setdefault(name, patch.id)
    return found


def run(
    rel: str,
    path: Path,
    module: "cst.Module",
    codemods: Sequence[type["PatchCodemod"]],
    known: Sequence[Optional[Finding]] = (),
    source: Optional[bytes] = None,
    pristine: Optional[bytes] = None,
    owners: Optional[Mapping[str, str]] = None,
) -> Transformed:
    """Run ``codemods`` over ``module`` (the file ``rel``); each one that
    finds its change still to do makes it, and every one must find it done
    (or superseded) on the result, which must compile. ``known``: findings
    already detected on ``module`` as given (None: detect here); they hold
    only until a codemod changes the tree. ``source``: ``module``'s bytes;
    ``pristine``: the file as the tree's release ships it (None: unknown):
    given both, code the vendor added must survive (``patchkit.transform.vendor_code``;
    ``owners``: codemod name -> patch id, for its message)."""
    from libcst.codemod import CodemodContext

    from patchkit.codemods.common.primitives import add_needed_imports

    context = CodemodContext(filename=rel)
    instances = [codemod(context) for codemod in codemods]
    transformed: list[str] = []
    original = module
    for i, inst in enumerate(instances):
        given = known[i] if i < len(known) else None
        with _running(type(inst), rel):
            if given is not None and (not transformed or _reads_unchanged(inst, original, module)):
                state = given.state  # what it reads is as it was detected
            else:
                state = inst.state_of(module)
            if state is State.MISSING:
                finding = inst.detect(module)  # again, with its lines, for the message
                raise PatchkitError(f"{path}: anchor {finding.anchor} missing: {finding.detail}")
            if state is State.TODO:
                module = inst.transform_module(module)
                transformed.append(inst.name())
    module = add_needed_imports(module, context)
    new = module.bytes
    lost = None if source is None else _trailing_comments_kept(source, new)
    if lost is not None:  # never the user's lines lost: refused, nothing written
        raise PatchkitError(
            f"{path}:{lost}: the indented comments that end this file would be lost "
            "(libcst drops them after a top-level statement); dedent or move them, then apply again"
        )
    after = {}
    for inst in instances:
        with _running(type(inst), rel):
            finding = inst.detect(module)
        if finding.state not in (State.DONE, State.SUPERSEDED):
            raise PatchkitError(
                f"{path}: {inst.name()} did not reach its postcondition ({finding.anchor}: {finding.detail})"
            )
        after[inst.name()] = finding
    try:  # one parse, shared: the vendor-code check and the safety rule's audit read the tree too
        tree = python_ast.parse(new, str(path))
        compile(tree, str(path), "exec", dont_inherit=True)
    except SyntaxError as exc:  # a codemod bug, never the user's input
        raise PatchkitError(f"{path}:{exc.lineno}: patched code does not compile: {exc.msg}") from None
    notes: list[str] = []
    if pristine is not None and source is not None and source != pristine and transformed:
        from patchkit.transform import vendor_code

        # The file named as the tree names it (relative), once; each codemod by its patch.
        notes = vendor_code.check(
            Path(rel),
            source,
            pristine,
            new,
            tree,
            original,
            instances,
            transformed,
            owners if owners is not None else _owners(rel, transformed),
        )
    return Transformed(new, after, transformed, notes)


def interruptible_pool(workers: int) -> AbstractContextManager:
    """A pool of ``workers`` processes for work that forks pools of its own
    (the matrix: one release's apply each), whose workers end at once, with
    what they forked, when the block raises (``patchkit.transform.parallel``)."""
    from patchkit.transform import parallel

    return parallel.interruptible_pool(workers)
