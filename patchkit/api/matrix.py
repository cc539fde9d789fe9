"""The release matrix: every patch on every sglang release.

For each release: fetch it (cached), copy it, then status + apply (all
patches; apply's own reports are the status before it) -> verify -> apply
again, dry (idempotence) -> revert, and compare the
sha256 of every file with the pristine copy. ``-j N`` runs releases in
parallel processes. Its one command line is ``patchkit matrix`` (``scripts/matrix.py``
runs it from a checkout).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import as_completed
from pathlib import Path
from typing import Optional

from patchkit import lifetimes

MATRIX_SCHEMA = "patchkit.matrix/1"
WORKDIR_PREFIX = "patchkit-matrix-"
DEFAULT_RELEASES = ["0.5.10", "0.5.10.post1", "0.5.11", "0.5.12", "0.5.12.post1"] + [f"0.5.{n}" for n in range(13, 24)]


def snapshot(package: Path) -> dict[str, str]:
    """sha256 of every file of a package folder (``.patchkit`` excluded)."""
    out = {}
    for path in sorted(package.rglob("*")):
        rel = path.relative_to(package)
        if path.is_file() and ".patchkit" not in rel.parts:
            out[str(rel)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def run_release(version: str, workdir: Optional[str] = None) -> dict:
    """One row of the matrix (a JSON-able dict). Never raises: a failure at
    any step is recorded in ``error`` with the step's name."""
    from patchkit import api
    from patchkit.errors import PatchkitError
    from patchkit.fetch import fetch_tree
    from patchkit.state import vendoring

    started = time.perf_counter()
    row: dict = {
        "release": version,
        "error": None,
        "patches": {},
        "changed_files": [],
        "verify_ok": None,
        "idempotent": None,
        "revert_exact": None,
        "changed_after_revert": [],
        "seconds": None,
        "standalone": None,
        "standalone_detail": "",
    }
    step = "fetch"
    messages: list[str] = []
    try:
        pristine = fetch_tree(version)
        with tempfile.TemporaryDirectory(prefix=f"patchkit-matrix-{version}-", dir=workdir) as tmp:
            step = "copy"
            tree = Path(tmp) / "sglang"
            shutil.copytree(pristine, tree)
            expected = snapshot(pristine)
            step = "status + apply"
            # apply's reports are the status before it wrote anything: one
            # parse and detection of every file serves both.
            applied = api.apply(str(tree), say=messages.append, audit_vendor=False)
            row["version"] = applied.where.tree.version
            outcome = applied.outcome
            before = {r.patch.id: r for r in outcome.reports}
            row["changed_files"] = sorted(outcome.changed)
            row["skipped"] = [{"id": pid, "reason": why} for pid, why in outcome.skipped]
            step = "verify"
            verified = api.verify(str(tree), say=messages.append, audit=False)
            after = verified.reports
            row["verify_ok"] = verified.ok
            step = "standalone"
            # The patched tree imports without patchkit: nothing imports it, and
            # the runtime folder imports with the standard library alone.
            found = vendoring.patchkit_imports(tree, [rel for rel in verified.recorded_files if rel.endswith(".py")])
            ok, error = (
                vendoring.import_in_isolation(tree)
                if (tree / vendoring.FOLDER / "__init__.py").exists()
                else (True, "")
            )
            row["standalone"] = not found and ok
            row["standalone_detail"] = f"imports patchkit at {', '.join(found)}" if found else error
            for r in after:
                files = [t.file for t in r.patch.targets if t.file in outcome.changed]
                row["patches"][r.patch.id] = {
                    "before": before[r.patch.id].state,
                    "state": r.state,
                    "ok": r.ok,
                    "reason": r.reason,
                    "notes": list(r.notes),
                    "files": sorted(set(files)),
                }
            step = "apply again"
            again = api.apply(str(tree), dry_run=True, say=messages.append).outcome
            row["idempotent"] = not again.changed and not again.done
            step = "revert"
            api.revert(str(tree), say=messages.append)
            step = "compare"
            now = snapshot(tree)
            row["changed_after_revert"] = sorted(
                k for k in expected.keys() | now.keys() if expected.get(k) != now.get(k)
            )
            row["revert_exact"] = not row["changed_after_revert"]
    except PatchkitError as exc:
        row["error"] = f"{step}: {exc}"
    except Exception as exc:  # noqa: BLE001 - a matrix reports, it does not stop
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        row["error"] = f"{step}: internal error: {last}"
    row["messages"] = messages
    row["seconds"] = round(time.perf_counter() - started, 2)
    row["ok"] = bool(
        row["error"] is None and row["verify_ok"] and row["idempotent"] and row["revert_exact"] and row["standalone"]
    )
    return row


def run_matrix(
    releases: Iterable[str],
    jobs: int = 1,
    progress: Optional[Callable[..., None]] = None,
    workdir: Optional[str] = None,
) -> dict:
    """``progress(done, total, item)``: told at the start and after each
    release (``item``: which, and ok or FAILED; the table says why)."""
    from patchkit import __version__, registry

    releases = list(releases)
    started = time.perf_counter()
    rows: dict[str, dict] = {}
    if progress:
        progress(0, len(releases))

    def done(row: dict) -> None:
        rows[row["release"]] = row
        if progress:
            progress(len(rows), len(releases), f"sglang {row['release']}: {'ok' if row['ok'] else 'FAILED'}")

    # The releases' copies sit in one folder of ours, removed after the
    # pool has ended; one that a kill -9 left is removed by the next matrix
    # (patchkit.lifetimes.owned_folder: its owner's lock is free).
    with lifetimes.owned_folder(WORKDIR_PREFIX, workdir) as shared:
        if jobs <= 1 or len(releases) <= 1:
            for version in releases:
                done(run_release(version, str(shared)))
        else:
            from patchkit.transform import interruptible_pool

            # Ctrl-C / SIGTERM kill the workers at once (with the workers they
            # forked), not after their releases; a kill -9 too (they die with us).
            with interruptible_pool(min(jobs, len(releases))) as pool:
                futures = [pool.submit(run_release, version, str(shared)) for version in releases]
                for future in as_completed(futures):
                    done(future.result())
    return {
        "schema": MATRIX_SCHEMA,
        "patchkit": __version__,
        "patches": [{"id": p.id, "title": p.title, "upstream": list(p.upstream)} for p in registry.all_patches()],
        "releases": [rows[v] for v in releases],
        "ok": all(rows[v]["ok"] for v in releases),
        "jobs": jobs,
        "seconds": round(time.perf_counter() - started, 2),
    }


# --- rendering ----------------------------------------------------------------


def _yes(value: Optional[bool]) -> str:
    return "-" if value is None else "yes" if value else "**NO**"


def to_markdown(doc: dict) -> str:
    ids = [p["id"] for p in doc["patches"]]
    footnotes: dict[str, int] = {}

    def note(text: str) -> str:
        footnotes.setdefault(text, len(footnotes) + 1)
        return f"[{footnotes[text]}]"

    lines = [
        "| release | "
        + " | ".join(f"`{pid}`" for pid in ids)
        + " | files | verify | imports without patchkit | idempotent | revert exact | s |",
        "|---" * (len(ids) + 7) + "|",
    ]
    for row in doc["releases"]:
        if row["error"]:
            cells = [note(f"{row['release']}: {row['error']}")] + [""] * (len(ids) - 1)
        else:
            cells = []
            for pid in ids:
                p = row["patches"].get(pid)
                if p is None:
                    cells.append("-")
                    continue
                cell = p["state"]
                if p["state"] == "applied":
                    cell += f" ({len(p['files'])})"
                if not p["ok"]:
                    cell = f"**{cell}**"
                texts = ([p["reason"]] if p["reason"] else []) + p["notes"]
                numbers = sorted({int(note(text)[1:-1]) for text in texts})
                marks = "".join(f"[{n}]" for n in numbers)
                cells.append(cell + (" " + marks if marks else ""))
        verify = "-" if row["verify_ok"] is None else "OK" if row["verify_ok"] else "**FAILED**"
        lines.append(
            f"| {row['release']} | "
            + " | ".join(cells)
            + f" | {len(row['changed_files'])} | {verify} | {_standalone(row, note)} | {_yes(row['idempotent'])}"
            f" | {_yes(row['revert_exact'])} | {row['seconds']:.1f} |"
        )
    if footnotes:
        lines.append("")
        lines += [f"[{n}] {text}  " for text, n in footnotes.items()]
    lines.append("")
    lines.append(
        f"Cells: state after `patchkit apply` (files it changed). {len(doc['releases'])} releases, "
        f"-j {doc['jobs']}, {doc['seconds']:.1f}s; overall: {'OK' if doc['ok'] else 'FAILED'}."
    )
    return "\n".join(lines) + "\n"


def _standalone(row: dict, note: Callable[[str], str]) -> str:
    cell = _yes(row.get("standalone"))
    if row.get("standalone_detail"):
        cell += " " + note(f"{row['release']}: {row['standalone_detail']}")
    return cell


def to_json(doc: dict) -> str:
    return json.dumps(doc, indent=2) + "\n"
