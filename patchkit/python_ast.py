"""One ``ast`` parse of a file's bytes, shared within a process: the
transform's compile check parses the bytes it wrote, and the safety rule's
audit (``patchkit.audit.facts``) reads the same bytes right after, in the
same worker (``patchkit.checks.mirror_reads.MirrorReadsGuarded.head_start``)."""

from __future__ import annotations

import ast
import re
from collections import OrderedDict

# A PEP 263 encoding declaration, in either of the first two lines.
_COOKIE = re.compile(rb"\A(?:[^\n]*\n)?[ \t\f]*#[^\n]*?coding[:=]")

_RECENT: "OrderedDict[bytes, ast.Module]" = OrderedDict()  # the last few parsed, by their bytes
_KEEP = 4


def parse(data: bytes, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse(data)``, remembered for the next caller of the same bytes
    (ast trees are only read: none of patchkit's callers changes one)."""
    tree = _RECENT.get(data)
    if tree is not None:
        _RECENT.move_to_end(data)
        return tree
    tree = ast.parse(data, filename)
    _RECENT[data] = tree
    if len(_RECENT) > _KEEP:
        _RECENT.popitem(last=False)
    return tree


def plain_utf8(data: bytes) -> bool:
    """Whether ``data`` parses alike as bytes and as its UTF-8 text: no
    byte-order mark, no encoding declaration, valid UTF-8."""
    if data.startswith(b"\xef\xbb\xbf") or _COOKIE.match(data):
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
