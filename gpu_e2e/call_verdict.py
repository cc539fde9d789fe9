"""The last line of a call: ``verdict: OK`` or ``verdict: NOT OK`` (GPU side, and tests).

A call with a pair (pristine and patched, or ``--compare A,B``) is OK when its table has
rows and nothing is a PROBLEM. A call with one variant only (the ``upstream`` reference
alone, ``--variants patched``, ``--alternate``) has no pair to compare: its comparison is
made across calls (issue 57's yardstick runs 0.5.17 and 0.5.12.post1 in calls of their
own). It is OK when every engine ran (rc 0, with batches) and nothing is a PROBLEM, with
a NOTE that says so; before, such a call read NOT OK with no PROBLEM line to say why.
"""

from __future__ import annotations


def variants_run(results: dict) -> list[str]:
    """The variants the call's engines ran (``release/size/backend/round/variant`` keys)."""
    return sorted({run.get("variant") or key.rsplit("/", 1)[-1] for key, run in results["runs"].items()})


def verdict(results: dict, extra_tables: str = "") -> bool:
    """OK? ``extra_tables``: issue 23's tables, made across the call. A one-variant call
    found OK gets its NOTE in ``results["notes"]``."""
    if results["problems"]:
        return False
    if results["rows"] or extra_tables:
        return True
    runs = list(results["runs"].values())
    variants = variants_run(results)
    if runs and len(variants) == 1 and all(r.get("rc") == 0 and r.get("batches") for r in runs):
        results["notes"].append(
            f"one variant ({variants[0]}): no pair to compare in this call; its comparison is made across calls"
        )
        return True
    return False
