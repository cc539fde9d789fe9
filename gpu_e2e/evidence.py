"""What a GPU run leaves in docs/results/, kept small (docs/results/README.md):

    python -m gpu_e2e.evidence compact RESULTS.json ...   # no indentation, output ids hashed
    python -m gpu_e2e.evidence trim-log engine.log ...     # only the lines read back from it

``compact`` keeps every field a report or test reads; each request's output ids become the
first 16 hex digits of the sha256 of their JSON list, a one-element list, so two requests
compare equal exactly when their ids did, and a duel call's ``outputs_sha256`` keeps the same
16 digits. A duel's ``calls`` (a record a call, the same keys over and over: half of a duel
JSON's bytes) become one table, ``calls_table`` (:func:`pack_calls`); :func:`read_json` gives
them back as records, so every reader reads what the duel wrote; an engine whose patched
files are an earlier engine's names it (:func:`pack_digests`). ``trim-log`` keeps each engine's ``===== KEY =====`` header, the lines
:func:`engine_facts.log_facts` counts, tracebacks and exception lines, and the lines the
tests cite; it refuses (and leaves the file as it was) if :func:`engine_facts.log_facts` or
:func:`engine_facts.failure_line` would read anything else from any section."""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import re
from pathlib import Path
from typing import Any

from . import engine_facts

#: Lines kept by ``trim-log`` besides headers, tracebacks and exception lines (lower case).
KEEP = [
    s.lower()
    for s in [
        *engine_facts.LOG_LINES.values(),
        "Capture target",
        "Capture draft",
        "Engine startup timings",
        engine_facts.FAILURE_PREFIX,
        "_draft_extend_for_decode",
        "Piecewise CUDA Graph failed",
        "Spec v1 is used",
        "ERROR SUMMARY",
        "awq_marlin_moe_repack",
        "KV Cache is allocated",
        "_OpNamespace",
        "Traceback",
    ]
]
_HEADER = re.compile(r"(?m)^(===== .* =====)$")


def ids_digest(ids: list) -> list[str]:
    """One request's output ids as a one-element list: the sha256 prefix of their JSON."""
    return [hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16]]


def _hashed(ids: list) -> bool:
    return len(ids) == 1 and isinstance(ids[0], str)


#: A duel call's fields that nothing reads back (duel_serve writes them; no report or test reads
#: them): dropped by ``compact``. ``accept_length`` is kept: a draft-side patch shows in it
#: (the fourteenth run's standalone duel), and older packs simply lack it.
UNREAD_CALL_FIELDS = ("verify_ct", "decode_lines")
#: What a duel engine's ``ready`` record keeps: the facts its reports read (``duel_report.ran_with``,
#: ``speed_grid``) and what says which model and release it served. The rest (the engine's
#: keyword arguments, file paths, start-up counts) repeats the run's ``args`` or nothing reads it.
READY_FIELDS_KEPT = (
    "engine_facts",
    "ranks_startup",
    "size",
    "variant",
    "scenario",
    "draft_checkpoint",
    "target_weights",
    "sglang_version",
)


def hash_output_ids(data: Any) -> Any:
    """``data`` with every ``output_ids`` list of per-request lists hashed (in place), and every
    duel call's ``outputs_sha256`` cut to the same 16 hex digits, its unread fields dropped, and
    each duel engine's ``ready`` record cut to :data:`READY_FIELDS_KEPT`."""
    if isinstance(data, dict):
        if isinstance(data.get("outputs_sha256"), str):
            data["outputs_sha256"] = data["outputs_sha256"][:16]
            for key in UNREAD_CALL_FIELDS:
                data.pop(key, None)
        if "failure" in data and isinstance(data.get("ready"), dict):  # a duel engine
            data["ready"] = {k: v for k, v in data["ready"].items() if k in READY_FIELDS_KEPT}
        for key, value in data.items():
            if key == "output_ids" and isinstance(value, list) and all(isinstance(r, list) for r in value):
                data[key] = [r if _hashed(r) else ids_digest(r) for r in value]
            else:
                hash_output_ids(value)
    elif isinstance(data, list):
        for item in data:
            hash_output_ids(item)
    return data


#: A packed call's value for a key that call did not have (a failed call has no timing).
MISSING = "~"
#: The call fields whose own keys become columns (``host.engine_cpu_s``, ...): fixed keys.
FLATTENED = ("host",)


def _is_duel(data: Any) -> bool:
    return isinstance(data, dict) and isinstance(data.get("calls"), list) and "engines" in data and "summary" in data


def pack_calls(data: Any) -> Any:
    """A duel result's ``calls`` as ``calls_table``: ``fields`` (every key any call has, in the
    order first seen, :data:`FLATTENED` ones as ``host.KEY``) and a row a call (in place). Left
    as records where :func:`unpack_calls` would not give the same calls back (an empty ``host``)."""
    if not _is_duel(data):
        return data
    calls = data["calls"]
    fields: list[str] = []
    for call in calls:
        for key, value in call.items():
            names = [f"{key}.{k}" for k in value] if key in FLATTENED and isinstance(value, dict) else [key]
            fields += [n for n in names if n not in fields]
    rows = []
    for call in calls:
        row = []
        for name in fields:
            outer, _, inner = name.partition(".")
            if outer in FLATTENED and inner:
                nested = call.get(outer)
                row.append(nested.get(inner, MISSING) if isinstance(nested, dict) else MISSING)
            else:
                row.append(call.get(name, MISSING))
        rows.append(row)
    table = {"fields": fields, "rows": rows}
    if unpack_calls({"calls_table": copy.deepcopy(table)})["calls"] == calls:
        del data["calls"]
        data["calls_table"] = table
    return data


def unpack_calls(data: Any) -> Any:
    """The inverse of :func:`pack_calls` (in place): ``calls`` as the duel wrote them."""
    if not isinstance(data, dict) or "calls_table" not in data:
        return data
    table = data.pop("calls_table")
    calls = []
    for row in table["rows"]:
        call: dict[str, Any] = {}
        for name, value in zip(table["fields"], row):
            if value == MISSING:
                continue
            outer, _, inner = name.partition(".")
            if outer in FLATTENED and inner:
                call.setdefault(outer, {})[inner] = value
            else:
                call[name] = value
        calls.append(call)
    data["calls"] = calls
    return data


#: A duel engine's ``patched_files_sha256`` entry that is another engine's, whole: "=ENGINE".
SAME_AS = "="


def pack_digests(data: Any) -> Any:
    """A duel's ``patched_files_sha256`` (each engine's tree: file -> sha256) with each engine
    whose files are an earlier engine's, every digest alike, written ``"=EARLIER"`` (in
    place). The engines of one bundle carry the same tree, so most of these maps were copies:
    479 KB of 53 duels' JSON before (2026-11-29f)."""
    digests = data.get("patched_files_sha256") if isinstance(data, dict) and "engines" in data else None
    if not isinstance(digests, dict):
        return data
    first: list[tuple[str, Any]] = []
    for engine, files in digests.items():
        if not isinstance(files, dict) or not files:
            continue
        same = next((name for name, seen in first if seen == files), None)
        if same is None:
            first.append((engine, files))
        else:
            digests[engine] = SAME_AS + same
    return data


def unpack_digests(data: Any) -> Any:
    """The inverse of :func:`pack_digests` (in place): every engine's files written out."""
    digests = data.get("patched_files_sha256") if isinstance(data, dict) else None
    if isinstance(digests, dict):
        for engine, files in digests.items():
            if isinstance(files, str) and files.startswith(SAME_AS):
                digests[engine] = copy.deepcopy(digests[files[len(SAME_AS) :]])
    return data


def read_json(path: Path) -> Any:
    """A committed results JSON as its run wrote it (a duel's calls and tree digests unpacked)."""
    return unpack_digests(unpack_calls(json.loads(path.read_text(encoding="utf-8"))))


def compact(path: Path) -> tuple[int, int]:
    """Rewrite one results JSON compactly; (bytes before, bytes after)."""
    raw = path.read_text(encoding="utf-8")
    packed = pack_digests(pack_calls(hash_output_ids(json.loads(raw))))
    out = json.dumps(packed, separators=(",", ":"), ensure_ascii=False)
    path.write_text(out, encoding="utf-8")
    return len(raw.encode()), len(out.encode())


def trim(text: str) -> str:
    """The lines of an engine log that are read back from it."""
    out, in_traceback = [], False
    for line in text.splitlines():
        low = line.lower()
        if line.startswith("=====") or any(k in low for k in KEEP):
            out.append(line)
            in_traceback = "traceback" in low
            continue
        if in_traceback and not line.strip().startswith("["):
            out.append(line)
            continue
        in_traceback = False
        if engine_facts._EXCEPTION_LINE.match(line.strip()):
            out.append(line)
    return "\n".join(out) + "\n"


def read_back(text: str) -> list:
    """What the harness and the tests read from a log: per section, its facts and failure line."""
    return [(engine_facts.log_facts(part), engine_facts.failure_line(part)) for part in _HEADER.split(text)] + [
        text.lower().count(k) for k in KEEP
    ]


def trim_log(path: Path) -> tuple[int, int]:
    """Trim one log in place; (bytes before, bytes after). Unchanged if anything read back differs."""
    text = path.read_text(encoding="utf-8", errors="surrogateescape")
    trimmed = trim(text)
    if read_back(trimmed) != read_back(text):
        raise SystemExit(f"{path}: trimming would change what is read back from it; left as it was")
    path.write_text(trimmed, encoding="utf-8", errors="surrogateescape")
    return len(text.encode(errors="surrogateescape")), len(trimmed.encode(errors="surrogateescape"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m gpu_e2e.evidence", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["compact", "trim-log"])
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args(argv)
    do = compact if args.action == "compact" else trim_log
    for path in args.files:
        before, after = do(path)
        print(f"{path}: {before} -> {after} bytes")


if __name__ == "__main__":
    main()
