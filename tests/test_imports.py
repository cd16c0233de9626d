"""Projects never import each other; shared packages never import a project."""

from __future__ import annotations

import ast
from pathlib import Path

from repo_helpers import ROOT


def package_names(folder: Path) -> set[str]:
    return {p.name for p in (folder / "src").iterdir() if (p / "__init__.py").is_file()}


def imported_top_levels(folder: Path) -> dict[str, set[Path]]:
    found: dict[str, set[Path]] = {}
    for path in folder.rglob("*.py"):
        if ".venv" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(path.relative_to(ROOT))
    return found


def units(kind: str) -> list[Path]:
    return sorted(p.parent for p in (ROOT / kind).glob("*/pyproject.toml"))


def test_no_project_imports_another_and_no_shared_package_imports_a_project():
    owners = {name: folder for folder in units("projects") for name in package_names(folder)}
    violations = []
    for folder in units("projects") + units("shared"):
        own = package_names(folder)
        for name, files in imported_top_levels(folder).items():
            if name in owners and name not in own:
                violations.append(f"{folder.relative_to(ROOT)} imports {name} in {sorted(files)}")
    assert violations == []


def test_import_names_are_distinct_and_never_src():
    names = [n for kind in ("projects", "shared") for f in units(kind) for n in package_names(f)]
    assert len(names) == len(set(names))
    assert "src" not in names
