"""The files patchkit adds to a tree: the runtime subpackage and the manifest.

Patched sglang files always import their helpers from one subpackage of the
tree, ``sglang.srt._patchkit`` (absolute imports, as sglang itself writes
them). What that subpackage holds depends on the runtime mode chosen at apply
time:

- ``vendored`` (the default): a copy of the runtime modules the applied
  patches need (``patchkit/runtime``, ``patchkit/backends/...``), so the tree
  imports and serves without patchkit installed and a later patchkit upgrade
  cannot change its behaviour.
- ``package``: the same module names, each forwarding to the installed
  ``patchkit.runtime`` / ``patchkit.backends``, after a check of the runtime
  contract (``RUNTIME_API``) that fails at import with one line naming both
  versions.

A patch set outside patchkit may bring runtime modules of its own (its
``runtime = [...]`` names modules of the set): they go into the same
subpackage under their own names, copied in vendored mode, forwarding to the
set's installed package in package mode (a set given as a folder has none:
the mode is refused for it).

Because the patched sglang files are the same in both modes, switching modes
rewrites this folder only. ``manifest.json`` beside it is tracked by the
fork's git: which patches, which patchkit and runtime versions, and the sha256
of every file patchkit changed before and after, so a clone of a patched fork
knows what was applied (``.patchkit/`` state is git-ignored and never travels).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Optional

from patchkit import __version__
from patchkit.errors import PatchkitError, untrusted_json
from patchkit.layout import FOLDER, IMPORT_ROOT
from patchkit.state.record import Record
from patchkit.tree import read_regular

if TYPE_CHECKING:
    from patchkit.registry.definitions import RuntimeModule

MODES = ("vendored", "package")
DEFAULT_MODE = "vendored"

MANIFEST = f"{FOLDER}/manifest.json"

_HEADER_END = "# --- end of patchkit header ---\n"
_HASH_RE = re.compile(r"^# content sha256: ([0-9a-f]{64})$", re.M)
_API_RE = re.compile(r"^RUNTIME_API = (\d+)$", re.M)

# The runtime contract this patchkit writes, read from the runtime's source:
# patchkit itself never imports its runtime (a process that checks patched
# code with the runtime unimportable can still run patchkit).
RUNTIME_API = int(_API_RE.findall(resources.files("patchkit").joinpath("runtime/__init__.py").read_text())[0])


# --- what the folder holds --------------------------------------------------------


def _sources(module: "RuntimeModule") -> list[tuple[str, str]]:
    """(path under the module's root, source) of a runtime module and the
    package ``__init__`` files above it; a package brings all its modules.
    The root is patchkit/ for patchkit's own, the set's folder for a set's."""
    parts = module.name.split(".")
    root = module.root
    out = []
    for depth in range(1, len(parts)):
        init = "/".join(parts[:depth]) + "/__init__.py"
        out.append((init, root.joinpath(init).read_text(encoding="utf-8")))
    node = root.joinpath(*parts)
    if node.is_dir():
        for child in sorted(node.iterdir(), key=lambda c: c.name):
            if child.name.endswith(".py"):
                rel = "/".join(parts) + "/" + child.name
                out.append((rel, child.read_text(encoding="utf-8")))
    else:
        rel = "/".join(parts) + ".py"
        out.append((rel, root.joinpath(rel).read_text(encoding="utf-8")))
    return out


def _forwarder(rel: str, module: "RuntimeModule") -> str:
    """Package mode: the module re-exports the installed one of the same name."""
    name = rel[: -len(".py")].replace("/", ".").removesuffix(".__init__")
    if module.own:
        dotted = f"patchkit.{name}"
        return (
            f'"""Forwards to the installed {dotted} (patchkit runtime, package mode)."""\n\n'
            f"from {IMPORT_ROOT} import require_runtime as _require_runtime\n\n"
            f"_require_runtime()\n\n"
            f"from {dotted} import *  # noqa: E402,F401,F403\n"
        )
    # A set's module: its own distribution provides it (apply refuses package
    # mode for a set that has none, see check_mode).
    dotted = f"{module.package}.{name}"
    return (
        f'"""Forwards to the installed {dotted} (runtime of patch set {module.origin}, package mode)."""\n\n'
        f"try:\n"
        f"    from {dotted} import *  # noqa: F401,F403\n"
        f"except ModuleNotFoundError as exc:\n"
        f"    raise ImportError(\n"
        f'        "this sglang tree was patched by patchkit in package mode and needs {dotted}, which is not "\n'
        f'        "installed: install {module.install}, or re-apply with --runtime vendored"\n'
        f"    ) from exc\n"
    )


def check_mode(patches: Iterable, mode: str) -> None:
    """Package mode imports each runtime module from an installed package: a
    module of a set given as a folder has none, so the mode is refused."""
    if mode != "package":
        return
    for patch in patches:
        for module in patch.runtime:
            if module.package is None:
                raise PatchkitError(
                    f"--runtime package: patch {patch.id} needs runtime module {module.name} of the patch set "
                    f"folder {module.origin}, which no installed package provides: install the set as a "
                    "distribution with a patchkit.patches entry point (docs/writing-a-patch.md), or apply "
                    "with --runtime vendored (nothing was changed)"
                )


def _root_init(mode: str) -> str:
    doc = (
        '"""Runtime code of the patches patchkit applied to this sglang tree.\n\n'
        "Patched sglang modules import their helpers from here. Regenerate with\n"
        "`patchkit apply`; `patchkit revert` removes this folder.\n"
        '"""\n\n'
    )
    head = f'RUNTIME = "{mode}"\nRUNTIME_API = {RUNTIME_API}\n'
    if mode == "vendored":
        return (
            doc
            + head
            + '\n\ndef require_runtime() -> None:\n    """The runtime is vendored here: nothing to check."""\n'
        )
    return (
        doc
        + head
        + f'''

def require_runtime() -> None:
    """The runtime contract: this tree was patched against RUNTIME_API; the
    installed patchkit runtime must provide exactly that API."""
    try:
        from patchkit.runtime import RUNTIME_API as installed
    except ImportError:
        raise ImportError(
            "this sglang tree was patched by patchkit in package mode and needs the patchkit runtime "
            "(API {RUNTIME_API}), which is not installed: install the runtime alone (sglang-patchkit-runtime: "
            "`python scripts/build_runtime_wheel.py` in a patchkit checkout builds its wheel) or all of patchkit "
            "(sglang-patchkit: `pip install .` in that checkout), or re-apply with --runtime vendored"
        ) from None
    if installed != RUNTIME_API:
        raise ImportError(
            f"this sglang tree was patched against patchkit runtime API {{RUNTIME_API}}, but the installed "
            f"patchkit runtime provides API {{installed}}: re-run `patchkit apply` with that patchkit, "
            f"or install a runtime with API {{RUNTIME_API}}"
        )
'''
    )


def header(patch_ids: Iterable[str], body: str) -> str:
    ids = ", ".join(patch_ids)
    return (
        f"# Generated by patchkit {__version__} for {ids}; do not edit.\n"
        f"# `patchkit apply` rewrites this file, `patchkit revert` removes it.\n"
        f"# content sha256: {_sha(body)}\n" + _HEADER_END
    )


def _sha(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


def runtime_files(patches: Iterable, mode: str) -> dict[str, bytes]:
    """Every file of the runtime folder for ``patches`` in ``mode`` (relative
    to the sglang package folder). Empty when no patch needs runtime code."""
    users: dict[str, list[str]] = {}  # file under the folder -> ids of the patches needing it
    bodies: dict[str, str] = {}
    for patch in patches:
        for module in patch.runtime:
            for rel, source in _sources(module):
                users.setdefault(rel, [])
                if patch.id not in users[rel]:
                    users[rel].append(patch.id)
                # A folder set's module has no installed package to forward to
                # (check_mode refuses package mode for it): its source stands in.
                bodies[rel] = source if mode == "vendored" or module.package is None else _forwarder(rel, module)
    if not users:
        return {}
    every = list(dict.fromkeys(pid for ids in users.values() for pid in ids))
    out = {f"{FOLDER}/__init__.py": _root_init(mode)}
    out |= {f"{FOLDER}/{rel}": bodies[rel] for rel in sorted(bodies)}
    return {
        rel: (header(users.get(rel.removeprefix(f"{FOLDER}/"), every), body) + body).encode()
        for rel, body in out.items()
    }


@dataclass(frozen=True)
class Generated:
    """A runtime file as found in a tree."""

    body: str
    recorded_sha: Optional[str]

    @property
    def edited(self) -> bool:
        return self.recorded_sha != _sha(self.body)


def split_header(data: bytes) -> Optional[Generated]:
    """A file patchkit generated, split into header and body (None: not ours)."""
    text = data.decode("utf-8", "surrogateescape")
    head, sep, body = text.partition(_HEADER_END)
    if not sep or not head.startswith("# Generated by patchkit"):
        return None
    found = _HASH_RE.search(head)
    return Generated(body, found.group(1) if found else None)


def stale_reason(rel: str, on_disk: Optional[bytes], expected: bytes) -> Optional[str]:
    """Why the runtime file ``rel`` is not what this patchkit writes, or None.

    Only the code counts: the header line naming the patchkit version that
    wrote an otherwise identical file does not make it stale."""
    if on_disk is None:
        return f"{rel}: missing"
    if on_disk == expected:
        return None
    found, wanted = split_header(on_disk), split_header(expected)
    assert wanted is not None
    if found is None:
        return f"{rel}: not written by patchkit (no patchkit header)"
    if found.edited:
        return f"{rel}: edited after patchkit wrote it (content sha256 differs from its header)"
    if found.body != wanted.body:
        api = _API_RE.search(found.body)
        was = f" (runtime API {api.group(1)})" if api and api.group(1) != str(RUNTIME_API) else ""
        return f"{rel}: written by another patchkit version{was}; this patchkit {__version__} writes runtime API {RUNTIME_API}"
    return None


# --- the manifest -----------------------------------------------------------------


def manifest_bytes(record: Record) -> bytes:
    """The tracked manifest of what ``record`` says patchkit did."""
    return (json.dumps(record.to_manifest(MANIFEST), indent=1, sort_keys=True) + "\n").encode()


def read_manifest(data: bytes, where: str) -> Record:
    try:
        doc = untrusted_json(data)
    except ValueError:
        raise PatchkitError(f"{where}: corrupt patchkit manifest (not the expected JSON)") from None
    if not isinstance(doc, dict):
        raise PatchkitError(f"{where}: corrupt patchkit manifest (not the expected JSON)")
    return Record.from_manifest(doc, where)


# --- does the tree stand on its own? ------------------------------------------------


def installed_runtime_api() -> Optional[int]:
    """RUNTIME_API of the patchkit runtime this interpreter imports (package
    mode: what a patched tree served from this environment gets)."""
    try:
        from patchkit.runtime import RUNTIME_API as installed
    except ImportError:
        return None
    return installed


def patchkit_imports(package, rels: Iterable[str]) -> list[str]:
    """``file:line`` of every import of ``patchkit`` in these files of the tree."""
    import ast

    found = []
    for rel in rels:
        try:
            module = ast.parse(read_regular(package / rel, package) or b"")
        except (OSError, SyntaxError, ValueError):
            continue
        for node in ast.walk(module):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            if any(n == "patchkit" or n.startswith("patchkit.") for n in names):
                found.append(f"{rel}:{node.lineno}")
    return found


def import_in_isolation(package, extra_path: Optional[str] = None) -> tuple[bool, str]:
    """Import every module of the tree's runtime folder in a fresh interpreter
    that has the standard library only (``-I -S``: no site-packages, so no
    patchkit, libcst or click), plus ``extra_path`` if given. The rest of
    sglang is not imported (it needs torch and a GPU stack): an empty
    ``sglang`` package stands in for it. Returns (ok, the error's last line)."""
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    folder = Path(package) / FOLDER
    modules = sorted(
        IMPORT_ROOT + "." + p.relative_to(folder).with_suffix("").as_posix().replace("/", ".").removesuffix(".__init__")
        for p in folder.rglob("*.py")
    )
    modules = [m.removesuffix("." + "__init__") for m in modules]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "sglang" / "srt").mkdir(parents=True)
        (Path(tmp) / "sglang" / "__init__.py").write_text("")
        (Path(tmp) / "sglang" / "srt" / "_patchkit").symlink_to(folder.resolve(), target_is_directory=True)
        path = [tmp] + ([extra_path] if extra_path else [])
        code = f"import sys; sys.path[:0] = {path!r}\n" + "".join(f"import {m}\n" for m in modules)
        proc = subprocess.run([sys.executable, "-I", "-S", "-B", "-c", code], capture_output=True, text=True)
    lines = (proc.stderr or proc.stdout).strip().splitlines()
    return proc.returncode == 0, lines[-1] if lines else ""
