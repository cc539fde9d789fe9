"""Content-addressed cache of per-file transforms, shared by every tree.

CI re-patches the same pristine release files on every push, and a vendor's
checkouts hold the same bytes: the result of running a set of codemods over a
file depends only on

- the file's bytes (sha256),
- the codemods, in order, grouped by patch (their names),
- patchkit itself: its version and a fingerprint of the code that decides the
  output (every ``patchkit/**/*.py``, ``patches/*.toml``, the installed libcst).

One entry per key under ``$PATCHKIT_TRANSFORM_CACHE`` (default
``$PATCHKIT_CACHE_DIR/transforms``, i.e. ``~/.cache/patchkit/transforms``;
``PATCHKIT_TRANSFORM_CACHE=off`` disables it; see ``patchkit.settings``). An entry holds what the engine would
compute: the detector findings on the input, the patched bytes and the findings
on them (the postcondition, already checked). Beside the transforms, under
``audit/tree/``, facts the audit learnt of a whole tree's bytes (``Fact``: one
typed value per entry, e.g. the first unguarded read of the mirror), shared
the same way.

Safe by construction:

- written to a temporary file and renamed into place: a reader sees a whole
  entry or none, and two runs writing the same key write the same bytes;
- read back only if its header names this exact key and the recorded length
  and seal match; the seal, an HMAC under the cache's own secret
  (``patchkit.cache_secret``), covers the header's findings as well as the
  payload: a truncated, corrupted, misplaced or forged entry (one written by
  anyone but the cache's owner) is a miss (a cold transform), never a wrong
  result;
- another patchkit version (or edited codemods) computes other keys, so it
  never reads this one's entries.
Only codemods that live in ``patchkit.codemods`` are cached (test codemods
defined elsewhere are not covered by the fingerprint).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar, Optional, Protocol, Self, TypeVar

import patchkit
from patchkit import settings
from patchkit.cache_secret import seal, sealed
from patchkit.errors import untrusted_json
from patchkit.findings import Finding
from patchkit.registry import sets as patch_sets

FORMAT = 3  # 2: facts apart from transforms (1 kept them in a transform's findings); 3: sealed
Findings = dict[str, Finding]  # codemod name -> its finding


@dataclass
class Entry:
    """A file's transform: findings before, the patched bytes (None when some
    patch group had a missing anchor and nothing was transformed), findings after."""

    before: Findings
    groups: list[list[str]]  # the groups transformed (patch groups with no missing anchor)
    new: Optional[bytes] = None
    after: Optional[Findings] = None
    transformed: tuple[str, ...] = ()  # the codemods that changed the file, in order
    notes: tuple[str, ...] = ()  # vendor code replaced on purpose (patchkit.transform.vendor_code)


class Fact(Protocol):
    """A typed value the transform cache keeps of a tree's bytes, apart from
    the transforms: ``KIND`` names it in its entry, ``from_json`` raises
    TypeError, ValueError or KeyError on what ``to_json`` would not write
    (read back as a miss)."""

    KIND: ClassVar[str]

    def to_json(self) -> Any: ...

    @classmethod
    def from_json(cls, data: Any) -> Self: ...


FactT = TypeVar("FactT", bound=Fact)


def _listed(findings: Findings) -> dict[str, list[Any]]:
    return {name: finding.as_list() for name, finding in findings.items()}


def _read_findings(listed: Any) -> Findings:
    if not isinstance(listed, dict):
        raise TypeError("findings are not a mapping")
    return {name: Finding.from_list(value) for name, value in listed.items()}


def default_folder() -> Optional[Path]:
    return settings.transform_cache_dir()


@lru_cache(maxsize=1)
def fingerprint() -> str:
    """patchkit's version plus a hash of everything that decides a transform's
    output: patchkit's modules, the patch definitions and libcst's version."""
    digest = hashlib.sha256(f"format {FORMAT}\npatchkit {patchkit.__version__}\n".encode())
    here = Path(__file__).resolve().parents[1]  # all of patchkit/
    # All of patchkit's code, not only the codemods: they use helpers from
    # elsewhere (e.g. where patched code imports its runtime from). About 2 ms.
    sources = sorted(here.rglob("*.py"))
    sources += [Path(str(f)) for f in patch_sets.definition_files()]
    libcst = importlib.util.find_spec("libcst")
    if libcst is not None and libcst.origin:
        sources.append(Path(libcst.origin).parent / "_version.py")
    for path in sources:
        with contextlib.suppress(OSError):
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def cacheable(codemods) -> bool:
    """Are all these codemods (classes or ``module:Class`` references) covered by the fingerprint?"""
    return all(isinstance(c, str) or c.__module__.startswith("patchkit.codemods.") for c in codemods)


def _signed(meta: dict, payload: bytes) -> bytes:
    """What an entry's seal covers: the header (without the seal itself) and
    the payload; a flipped finding is as much damage as a flipped byte of code."""
    return json.dumps(meta, sort_keys=True).encode() + b"\n" + payload


class TransformCache:
    def __init__(self, folder: Optional[Path]) -> None:
        self.folder = folder

    @classmethod
    def default(cls) -> "TransformCache":
        return cls(default_folder())

    @property
    def enabled(self) -> bool:
        return self.folder is not None

    @staticmethod
    def key(source_sha: str, groups: list[list[str]]) -> str:
        return hashlib.sha256(json.dumps([fingerprint(), source_sha, groups]).encode()).hexdigest()

    @staticmethod
    def fact_key(kind: type[Fact], *parts: str) -> str:
        """The key of a ``kind`` fact of the bytes ``parts`` name (fingerprints, digests)."""
        return hashlib.sha256(json.dumps([fingerprint(), kind.KIND, parts]).encode()).hexdigest()

    def _path(self, key: str) -> Path:
        assert self.folder is not None
        return self.folder / key[:2] / key

    def _fact_path(self, key: str) -> Path:
        assert self.folder is not None
        return self.folder / "audit" / "tree" / key[:2] / key

    def get(self, key: str) -> Optional[Entry]:
        if self.folder is None:
            return None
        try:
            raw = self._path(key).read_bytes()
            header, sep, payload = raw.partition(b"\n")
            meta = untrusted_json(header)
            if not sep or meta.get("format") != FORMAT or meta.get("key") != key:
                return None
            mac = meta.pop("seal")
            if not sealed(self.folder, _signed(meta, payload), mac) or meta["length"] != len(payload):
                return None
            has_new = meta["has_new"]
            return Entry(
                _read_findings(meta["before"]),
                meta["groups"],
                payload if has_new else None,
                _read_findings(meta["after"]) if has_new else None,
                tuple(meta["transformed"]),
                tuple(meta.get("notes", ())),
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None  # missing, truncated or corrupt: a miss, never a wrong result

    def get_fact(self, key: str, kind: type[FactT]) -> Optional[FactT]:
        """The ``kind`` fact kept under ``key`` (``fact_key``); None: a miss."""
        if self.folder is None:
            return None
        try:
            meta = untrusted_json(self._fact_path(key).read_bytes())
            if meta.get("format") != FORMAT or meta.get("key") != key or meta.get("kind") != kind.KIND:
                return None
            mac = meta.pop("seal")
            if not sealed(self.folder, _signed(meta, b""), mac):
                return None
            return kind.from_json(meta["fact"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None  # missing, truncated or corrupt: a miss, never a wrong result

    def put_fact(self, key: str, fact: Fact) -> None:
        if self.folder is None:
            return
        meta = {"format": FORMAT, "key": key, "kind": fact.KIND, "fact": fact.to_json()}
        if (mac := seal(self.folder, _signed(meta, b""))) is not None:
            _write(self._fact_path(key), json.dumps({**meta, "seal": mac}, sort_keys=True).encode())

    def put(self, key: str, entry: Entry) -> None:
        if self.folder is None:
            return
        payload = entry.new if entry.new is not None else b""
        meta = {
            "format": FORMAT,
            "key": key,
            "before": _listed(entry.before),
            "groups": entry.groups,
            "has_new": entry.new is not None,
            "after": None if entry.after is None else _listed(entry.after),
            "transformed": list(entry.transformed),
            "notes": list(entry.notes),
            "length": len(payload),
        }
        mac = seal(self.folder, _signed(meta, payload))
        # A cache is an optimisation: a read-only or full disk, or no secret, only costs speed.
        if mac is not None:
            _write(self._path(key), json.dumps({**meta, "seal": mac}, sort_keys=True).encode() + b"\n" + payload)


class SharedFindings:
    """Detection findings (``status``, ``verify``) by a file's path and bytes,
    beside the transform entries (``findings/``), for every tree: ``status``
    on a tree patchkit does not manage yet keeps no cache of its own (it
    writes nothing there), and would parse every target file again each
    time. The key holds the code fingerprint; an entry is read back only if
    it names its key and its seal matches (else a miss, never a wrong
    finding). Written when the command ends (``flush``), merged with what
    another run wrote meanwhile."""

    def __init__(self, folder: Optional[Path]) -> None:
        self.folder = folder
        self._read: dict[str, Findings] = {}
        self._learnt: dict[str, Findings] = {}
        self._where: dict[str, str] = {}

    def _key(self, rel: str, digest: str) -> str:
        return hashlib.sha256(json.dumps([fingerprint(), "findings", rel, digest]).encode()).hexdigest()

    def _load(self, key: str) -> Findings:
        assert self.folder is not None
        try:
            data = untrusted_json((self.folder / "findings" / key[:2] / key).read_bytes())
            found = data["findings"]
            if data["key"] != key or not sealed(
                self.folder, _signed({"key": key}, json.dumps(found, sort_keys=True).encode()), data["seal"]
            ):
                return {}
            return _read_findings(found)
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError):
            return {}

    def get(self, rel: str, digest: str, name: str) -> Optional[Finding]:
        if self.folder is None:
            return None
        key = self._key(rel, digest)
        if key not in self._read:
            self._read[key] = self._load(key)
        return self._read[key].get(name)

    def add(self, rel: str, digest: str, name: str, finding: Finding) -> None:
        if self.folder is not None:
            self._learnt.setdefault(self._key(rel, digest), {})[name] = finding

    def flush(self) -> None:
        """Write what was learnt (a read-only or full disk only costs speed)."""
        if self.folder is None:
            return
        for key, found in self._learnt.items():
            merged = _listed({**self._load(key), **found})
            mac = seal(self.folder, _signed({"key": key}, json.dumps(merged, sort_keys=True).encode()))
            if mac is None:
                break
            data = {"key": key, "findings": merged, "seal": mac}
            _write(self.folder / "findings" / key[:2] / key, json.dumps(data, sort_keys=True).encode())
        self._learnt.clear()


def _write(path: Path, data: bytes) -> None:
    """``data`` at ``path``, whole or not at all (a temporary file renamed into place)."""
    with contextlib.suppress(OSError):
        settings.make_cache_folder(path.parent)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:16]}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
