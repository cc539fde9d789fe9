#!/usr/bin/env python3
"""Every patch on every sglang release, from a checkout without installing:
the same as `patchkit matrix` (one command line, defined in patchkit/cli/reading.py).

    python scripts/matrix.py [RELEASE ...] [-j N] [-q] [--format markdown|json] [-o FILE]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from patchkit.cli import main  # noqa: E402

if __name__ == "__main__":
    # -q belongs after the command name (patchkit matrix -q), where the
    # matrix command reads it; every other option is the command's own.
    main(["matrix", *sys.argv[1:]], prog_name="patchkit")
