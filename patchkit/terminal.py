"""What patchkit shows only to a person at a terminal: colour on state words,
errors and warnings.

Colour is added with ``click.style`` and written with ``click.echo``, which
drops it where the stream is not a terminal; ``NO_COLOR`` (https://no-color.org)
drops it everywhere (``color()``). Only words are coloured, never added: the
text with the colour stripped is the text without it, byte for byte.
"""

from __future__ import annotations

import os
import re
from typing import Optional

import click

# Each state a patch can be in (and a verdict), by how it reads for the user:
# done (green), to do or out of date (yellow), broken (red), not for this tree (cyan).
COLOURS = {
    "applied": "green", "native": "green", "OK": "green", "reverted": "green",
    "absent": "yellow", "stale": "yellow", "warning": "yellow",
    "partial": "red", "FAILED": "red", "error": "red",
    "not-applicable": "cyan",
}

# A message's leading label: "patchkit: error: ...", "warning: ...", "applied: x",
# "not applied: x: why" (whose first word is no state: only the label is coloured).
_LABEL = re.compile(r"^(patchkit: |verify: )?(error|warning|applied|reverted|OK|FAILED)\b")


def color() -> Optional[bool]:
    """For ``click.echo(color=...)`` and ``click.Context(color=...)``: False
    under ``NO_COLOR`` (set and not empty), else None (click decides: colour
    on a terminal only)."""
    return False if os.environ.get("NO_COLOR") else None


def state(word: str, width: int = 0) -> str:
    """``word`` padded to ``width`` and coloured by what it says (as is when
    it names no state); the padding stays outside the colour."""
    padding = " " * max(0, width - len(word))
    colour = COLOURS.get(word)
    return (click.style(word, fg=colour, bold=colour == "red" or None) if colour else word) + padding


def styled(line: str) -> str:
    """``line`` with its leading label coloured (an error, a warning, a verdict)."""
    return _LABEL.sub(lambda m: (m.group(1) or "") + state(m.group(2)), line, count=1)
