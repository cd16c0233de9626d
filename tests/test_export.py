"""tools/export_project.py turns one project into a standalone uv project that works."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

from export_project import export
from repo_helpers import PROJECTS, ROOT, needs_projects


def project_dependencies(project: Path) -> list[str]:
    return tomllib.loads((project / "pyproject.toml").read_text())["project"]["dependencies"]


def registry_versions(lock: Path) -> dict[str, str]:
    packages = tomllib.loads(lock.read_text())["package"]
    return {p["name"]: p["version"] for p in packages if "registry" in p["source"]}


def paths_leaving(folder: Path) -> list[str]:
    """References in the export's pyprojects, lock and requirements that point outside it:
    the workspace's absolute path, or a relative path that climbs out of ``folder``."""
    files = [*folder.rglob("pyproject.toml"), folder / "uv.lock", folder / "requirements.txt"]
    found = []
    for file in files:
        text = file.read_text()
        if str(ROOT) in text:
            found.append(f"{file.relative_to(folder)} names {ROOT}")
        for relative in re.findall(r"(?<![\w.])\.\.?/[\w./-]*", text):
            if not (file.parent / relative).resolve().is_relative_to(folder):
                found.append(f"{file.relative_to(folder)}: {relative}")
    return found


@needs_projects
def test_exported_project_stands_alone_pins_the_tested_versions_and_trains(tmp_path):
    # The project with the fewest direct dependencies: the export machinery is the same for all.
    slug = min(PROJECTS, key=lambda p: (len(project_dependencies(p)), p.name)).name
    dest = export(slug, tmp_path / slug).resolve()
    meta = tomllib.loads((dest / "pyproject.toml").read_text())
    assert meta["project"]["scripts"]["train"].endswith(".cli:main")
    assert meta["project"]["scripts"]["reproduce"].endswith(".claim:main")
    assert "entry-points" not in meta["project"]  # the dispatchers are not exported
    assert all("workspace" not in s for s in meta["tool"]["uv"]["sources"].values())
    assert (dest / "requirements.txt").read_text().count("-e ./shared/") >= 1
    assert paths_leaving(dest) == []

    exported = registry_versions(dest / "uv.lock")
    tested = registry_versions(ROOT / "uv.lock")
    assert {n: v for n, v in exported.items() if tested.get(n) != v} == {}
    assert {"torch", "lightning"} <= exported.keys()

    def run(*command):
        return subprocess.run(command, cwd=dest, capture_output=True, text=True, timeout=900)

    sync = run("uv", "sync", "--locked")
    assert sync.returncode == 0, sync.stderr[-2000:]
    # The project's own fast lane already runs in the workspace against the same pinned versions;
    # here the export only has to show that every test module imports (all dependencies are
    # declared and installed) and that the plain `train` script it gained runs.
    collect = run(
        "uv", "run", "--no-sync", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider"
    )
    assert collect.returncode == 0, collect.stdout[-4000:]
    train = run(
        "uv",
        "run",
        "--no-sync",
        "train",
        "--trainer.fast_dev_run=1",
        "--trainer.accelerator=cpu",
        f"--trainer.default_root_dir={tmp_path / 'runs'}",
    )
    assert train.returncode == 0, train.stderr[-4000:]
