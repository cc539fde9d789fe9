"""``patchkit audit``: the report of a postcondition a patch declares
(``patchkit.postconditions``), on the tree as it stands. Knows no patch and
no check by name. apply runs the same checks on the tree as it would be
written, in its checked transform step (``patchkit.transform.checked``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from patchkit.errors import PatchkitError
from patchkit.postconditions import Report
from patchkit.registry import Patch
from patchkit.transform import checks

if TYPE_CHECKING:
    from patchkit.tree import Tree


def audit(patches: Iterable[Patch], tree: Tree) -> Report:
    """The report of the first check ``patches`` declare that offers one
    (``Postcondition.audit``) on ``tree`` as it stands."""
    for patch in patches:
        for ref in patch.postconditions:
            check = checks.made(patch.id, ref)
            report = checks.guarded(check.owner, check.name, check.postcondition.audit, tree)
            if report is not None:
                return report
    raise PatchkitError("no loaded patch declares a postcondition that audits a tree")
