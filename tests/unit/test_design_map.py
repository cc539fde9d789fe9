"""docs/design.md's floor map is checked against the code (issue 56, "docs from one
source"): every top-level module and package of patchkit is on the map, the map has
at most 8 floors, and no module imports from a floor above its own (stdlib ``ast``
reads the imports; nothing is imported)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "patchkit"
NAME = re.compile(r"^[A-Za-z_]+(\.py|/)$")


def floor_map() -> dict[str, int]:
    """``{"output": 5, "api": 6, ...}`` from the map's code block: a floor line starts
    with its number; a line indented by four spaces continues the floor above. The
    names are the leading fields (two spaces apart) that look like ``x.py`` or ``x/``."""
    block = (ROOT / "docs" / "design.md").read_text().split("```", 2)[1]
    floors: dict[str, int] = {}
    current = None
    for line in block.splitlines():
        m = re.match(r"^ ?(\d)  (.*)$", line)
        if m:
            current, rest = int(m[1]), m[2]
        elif current is not None and re.match(r"^ {4}[a-z_]", line):
            rest = line.strip()
        else:
            continue
        for field in re.split(r"\s{2,}", rest.strip()):
            if not NAME.match(field):
                break
            floors[field.rstrip("/").removesuffix(".py")] = current
    return floors


def units() -> set[str]:
    """patchkit's top-level modules and packages (``__init__`` aside: it is the package)."""
    return {
        p.stem if p.is_file() else p.name
        for p in PACKAGE.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())
    }


def _imported_units(path: Path) -> set[str]:
    """Top-level patchkit units one file imports (absolute or relative)."""
    here = path.relative_to(PACKAGE).parts[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = list(here[: len(here) - (node.level - 1)])
            target = base + (node.module.split(".") if node.module else [a.name for a in node.names][:1])
            out.add(target[0])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("patchkit"):
            parts = node.module.split(".")
            out.update(parts[1:2] or [a.name for a in node.names])
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[1] for a in node.names if a.name.startswith("patchkit."))
    return out


def imports() -> set[tuple[str, str]]:
    known = units()
    edges = set()
    for path in PACKAGE.rglob("*.py"):
        unit = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        edges.update((unit, other) for other in _imported_units(path) if other in known and other != unit)
    return edges


def test_every_module_and_package_is_on_the_map():
    assert sorted(units() - set(floor_map())) == []


def test_the_map_has_at_most_eight_floors():
    assert set(floor_map().values()) <= set(range(1, 9))


def test_no_module_imports_from_a_floor_above_its_own():
    floors = floor_map()
    up = sorted((a, floors[a], b, floors[b]) for a, b in imports() if floors[a] < floors[b])
    assert up == [], "design.md's map or the imports: (module, floor, imports, floor above)"


def test_the_reader_finds_relative_and_absolute_imports(tmp_path, monkeypatch):
    fake = tmp_path / "patchkit"
    (fake / "api").mkdir(parents=True)
    (fake / "api" / "x.py").write_text(
        "from ..engine import Session\nfrom . import y\nimport patchkit.tree\nfrom patchkit import output\n"
    )
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    assert _imported_units(fake / "api" / "x.py") == {"engine", "api", "tree", "output"}


def _transform_imports(path: Path) -> set[str]:
    """The modules of ``patchkit.transform`` (the package, or one of its modules) that one file imports from."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "patchkit":
            out.update(f"patchkit.{a.name}" for a in node.names if a.name == "transform")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("patchkit.transform"):
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("patchkit.transform"))
    return out


def test_the_read_side_reaches_the_transform_package_through_one_door():
    """The engine never parses, detects or touches a transform cache itself:
    it asks ``patchkit.transform.detection`` (design.md, "The parts")."""
    assert _transform_imports(PACKAGE / "engine.py") == {"patchkit.transform.detection"}
