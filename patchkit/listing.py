"""``patchkit list``: the patches, as text, JSON or the Markdown table of the README.

Each patch is described once, in its TOML definition (``title``, ``upstream``,
``summary``, ``proven_on``); the README's patch table is this module's Markdown,
pasted between its ``patches`` markers, and a test fails when the two drift.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from patchkit.output import patch_dict
from patchkit.registry import Patch

TABLE_HEADER = ("| patch | upstream | what it changes | proven on |", "|---|---|---|---|")


def list_json(patches) -> str:
    return json.dumps([patch_dict(p) for p in patches], indent=2)


def list_text(patches) -> str:
    """One line per patch; a patch from a set outside patchkit names it."""
    width = max((len(p.id) for p in patches), default=0)
    lines = []
    for p in patches:
        req = f"  (requires {', '.join(p.requires)})" if p.requires else ""
        origin = f"  [from {p.origin}]" if p.origin != "patchkit" else ""
        lines.append(f"{p.id:<{width}}  {', '.join(p.upstream) or '-':<24} {p.title}{req}{origin}")
    return "\n".join(lines)


def _upstream_cell(patch: Patch) -> str:
    """``sglang#26128`` -> ``#26128``, ``sglang 0.5.23`` -> ``0.5.23``: the table is about sglang."""
    refs = [u.removeprefix("sglang").strip() for u in patch.upstream]
    return " ".join(refs) or "-"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def list_markdown(patches: Sequence[Patch]) -> str:
    """The patch table: one row per patch, from its definition (the title where it has no summary)."""
    lines = list(TABLE_HEADER)
    for p in patches:
        lines.append(
            f"| `{p.id}` | {_cell(_upstream_cell(p))} | {_cell(p.summary or p.title)} | {_cell(p.proven_on) or '-'} |"
        )
    return "\n".join(lines)
