"""Finding the paper project you are in, and listing the ones that exist."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

GROUPS = ("papers.train", "papers.reproduce")


@dataclass(frozen=True)
class Project:
    """A folder with a ``pyproject.toml``: a paper project, a shared package or the root."""

    directory: Path
    name: str | None
    is_workspace_root: bool

    @property
    def slug(self) -> str:
        return self.name or self.directory.name


def _read_pyproject(directory: Path) -> Project:
    data = tomllib.loads((directory / "pyproject.toml").read_text())
    is_root = "workspace" in data.get("tool", {}).get("uv", {})
    return Project(directory, data.get("project", {}).get("name"), is_root)


def find_project(start: str | os.PathLike | None = None) -> Project | None:
    """The nearest folder at or above ``start`` (default: the working directory) holding a
    ``pyproject.toml``, or None when there is none."""
    here = Path(start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        if (directory / "pyproject.toml").is_file():
            return _read_pyproject(directory)
    return None


def project_dir_of(module_file: str | os.PathLike) -> Path:
    """The project folder of a module inside it (its nearest ``pyproject.toml`` above)."""
    project = find_project(Path(module_file).resolve().parent)
    if project is None:
        raise FileNotFoundError(f"no pyproject.toml above {module_file}")
    return project.directory


def registered_projects(group: str = "papers.train") -> list[str]:
    """Names of the installed projects with an entry point in ``group``."""
    return sorted({ep.name for ep in entry_points(group=group)})


def workspace_projects(start: str | os.PathLike | None = None) -> list[str]:
    """Folders under ``projects/`` of the workspace that contains ``start``."""
    here = Path(start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        if (directory / "projects").is_dir() and (directory / "pyproject.toml").is_file():
            return sorted(
                p.name
                for p in (directory / "projects").iterdir()
                if (p / "pyproject.toml").is_file()
            )
    return []
