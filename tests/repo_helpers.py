"""Helpers shared by the repository policy tests (imported through conftest's sys.path)."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

README_SECTIONS = (
    "## The paper",
    "## Quick start",
    "## The method in code",
    "## Paper scale",
    "## Reconstructed vs stated",
    "## Results",
)


def project_dirs(root: Path = ROOT) -> list[Path]:
    return sorted(p.parent for p in (root / "projects").glob("*/pyproject.toml"))


def pyproject(folder: Path) -> dict:
    return tomllib.loads((folder / "pyproject.toml").read_text())


def copy_repository(destination: Path) -> Path:
    """Copy the working tree as git sees it (tracked and untracked-but-not-ignored files)."""
    listing = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for name in filter(None, listing.split("\0")):
        source = ROOT / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return destination


PROJECTS = project_dirs()
needs_projects = pytest.mark.skipif(not PROJECTS, reason="no project under projects/ yet")


def structure_problems(folder: Path) -> list[str]:
    """What a project folder lacks; empty when it follows the skeleton."""
    problems = []
    meta = pyproject(folder)
    name = meta["project"]["name"]
    if name != folder.name:
        problems.append(f"project name {name!r} differs from its folder {folder.name!r}")
    readme = (folder / "README.md").read_text() if (folder / "README.md").is_file() else ""
    problems += [f"README lacks '{s}'" for s in README_SECTIONS if s not in readme]
    for config in ("configs/default.yaml", "configs/paper.yaml"):
        if not (folder / config).is_file():
            problems.append(f"missing {config}")
    if not list((folder / "tests").glob("test_*.py")):
        problems.append("no tests/test_*.py")
    scripts = meta["project"].get("scripts", {})
    if name not in scripts:
        problems.append(f"no unique script [project.scripts] {name} = ...")
    if {"train", "reproduce"} & set(scripts):
        problems.append("declares train/reproduce scripts: those belong to the dispatchers")
    groups = meta["project"].get("entry-points", {})
    for group in ("papers.train", "papers.reproduce"):
        target = groups.get(group, {}).get(name)
        if target is None:
            problems.append(f"no entry point {name} in group {group}")
            continue
        module = target.split(":")[0].replace(".", "/") + ".py"
        if not (folder / "src" / module).is_file():
            problems.append(f"{group} points at missing module {module}")
    uv_settings = set(meta.get("tool", {}).get("uv", {})) - {"sources", "build-backend"}
    if uv_settings:
        problems.append(f"member-level [tool.uv] settings are ignored by uv: {sorted(uv_settings)}")
    return problems
