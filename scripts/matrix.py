#!/usr/bin/env python3
"""Every patch on every sglang release: status / apply / verify / revert.

    python scripts/matrix.py [RELEASE ...] [-j N] [-q] [--format markdown|json] [-o FILE]

Same as `patchkit matrix`; the logic lives in patchkit/matrix.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from patchkit.matrix import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
