"""What patchkit shows only to a person at a terminal: colour on state words,
errors and warnings, and progress bars for work over about a second.

Colour is added with ``click.style`` and written with ``click.echo``, which
drops it where the stream is not a terminal; ``NO_COLOR`` (https://no-color.org)
drops it everywhere (``color()``). Colour only goes around words already
there: the text with the colour stripped is the text without it, byte for byte.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Callable, Iterator
from typing import Optional, TextIO

import click

# Each state a patch can be in (and a verdict), by how it reads for the user:
# done (green), to do or out of date (yellow), broken (red), not for this tree (cyan).
COLOURS = {
    "applied": "green",
    "native": "green",
    "OK": "green",
    "reverted": "green",
    "absent": "yellow",
    "stale": "yellow",
    "warning": "yellow",
    "partial": "red",
    "FAILED": "red",
    "error": "red",
    "not-applicable": "cyan",
}

# A message's leading label: "patchkit: error: ...", "patchkit: warning: ...",
# "applied: x", "verify: OK" ("not applied: x: why" starts with no label: plain).
_LABEL = re.compile(r"^(patchkit: |verify: )?(error|warning|applied|reverted|OK|FAILED)\b")


def color() -> Optional[bool]:
    """For ``click.echo(color=...)`` and ``click.Context(color=...)``: False
    under ``NO_COLOR`` (set and not empty), else None (click decides: colour
    on a terminal only)."""
    return False if os.environ.get("NO_COLOR") else None


def state(word: str) -> str:
    """``word`` coloured by what it says (as is when it names no state)."""
    colour = COLOURS.get(word)
    return click.style(word, fg=colour, bold=colour == "red" or None) if colour else word


def styled(line: str) -> str:
    """``line`` with its leading label coloured (an error, a warning, a verdict)."""
    return _LABEL.sub(lambda m: (m.group(1) or "") + state(m.group(2)), line, count=1)


@contextlib.contextmanager
def progress_bar(label: str, quiet: bool, file: Optional[TextIO] = None) -> Iterator[Optional[Callable[..., None]]]:
    """A ``(done, total, item="")`` callback drawing click's progress bar on
    stderr (``item``: what was just done, shown after the bar), or None where
    stderr is not a terminal or with ``-q`` (nothing to draw for a pipe, a log
    or a script). The bar opens on the first call, so work that is all cached
    (the warm case, well under a second) draws nothing; its line is ended
    when the block ends."""
    stream = file or sys.stderr
    if quiet or not stream.isatty():
        yield None
        return
    bar = None

    def update(done: int, total: int, item: str = "") -> None:
        nonlocal bar
        if bar is None:
            bar = click.progressbar(
                length=total,
                label=label,
                file=stream,
                show_eta=False,
                show_pos=True,
                item_show_func=lambda shown: shown,
            )
            bar.__enter__()
        bar.update(done - bar.pos, item or None)

    try:
        yield update
    finally:
        if bar is not None:
            bar.__exit__(None, None, None)
