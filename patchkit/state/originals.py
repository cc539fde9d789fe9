"""Find the bytes of a file version patchkit knows only by its sha256.

A clone of a patched fork has the tracked manifest (``srt/_patchkit/manifest.json``)
but not the git-ignored ``.patchkit/`` folder with its backups. To revert
there, each original is looked up, and checked against the recorded sha256
(so the order changes only the cost, cheapest first):

1. in the sglang release the tree says it is, where patchkit's cache has it
   (a release patched as shipped);
2. in the fork's git history (every version of that path in any ref), which
   has it when the fork committed the tree before patching it;
3. in that release downloaded from the package registry.
"""

from __future__ import annotations

import hashlib

from patchkit import fetch, git
from patchkit.errors import EXIT_CHANGES, PatchkitError
from patchkit.tree import Tree


class OriginalNotFound(PatchkitError):
    """A revert that cannot be exact is refused (exit 1, nothing changed)."""

    exit_code = EXIT_CHANGES


def find(tree: Tree, rel: str, digest: str) -> bytes:
    """The bytes of ``rel`` in ``tree`` with this sha256, from where a clone
    can have them, cheapest first: the tree's release in patchkit's cache
    (one file read), the checkout's git history, the release downloaded
    (the network, last)."""
    release = tree.release
    data = fetch.pristine_source(release, rel)
    path = tree.path(rel)
    if data is None or hashlib.sha256(data).hexdigest() != digest:
        data = git.version_in_history(path, digest)
    shallow = data is None and git.is_shallow(path.parent)
    if data is None and release is not None:
        data = fetch.release_file(release, rel)
        data = data if data is not None and hashlib.sha256(data).hexdigest() == digest else None
    if data is None and shallow:
        raise PatchkitError(
            f"{path}: cannot restore it exactly: this clone is shallow and the version patchkit recorded "
            f"(sha256 {digest[:12]}) is not in the history it has nor in the sglang {tree.version} release; "
            "`git fetch --unshallow` fetches the rest of the history, then run this again (nothing was changed)"
        )
    if data is None:
        raise OriginalNotFound(
            f"{path}: cannot restore it exactly: the version patchkit recorded (sha256 {digest[:12]}) is "
            f"neither in this checkout's git history nor in the sglang {tree.version} release; nothing was changed"
        )
    return data
