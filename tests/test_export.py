"""tools/export_project.py turns one project into a standalone uv project that works."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

from export_project import export
from repo_helpers import PROJECTS, needs_projects


def project_dependencies(project: Path) -> list[str]:
    return tomllib.loads((project / "pyproject.toml").read_text())["project"]["dependencies"]


@needs_projects
def test_exported_project_installs_offline_and_passes_its_fast_tests(tmp_path):
    # The project with the fewest direct dependencies: the export machinery is the same for all,
    # and this keeps the policy lane from re-running a heavy project's tests.
    slug = min(PROJECTS, key=lambda p: (len(project_dependencies(p)), p.name)).name
    dest = export(slug, tmp_path / slug, offline=True)
    meta = tomllib.loads((dest / "pyproject.toml").read_text())
    assert meta["project"]["scripts"]["train"].endswith(":main")
    assert all("workspace" not in s for s in meta["tool"]["uv"]["sources"].values())
    assert (dest / "requirements.txt").read_text().count("-e ./shared/") >= 1

    def run(*command):
        return subprocess.run(command, cwd=dest, capture_output=True, text=True, timeout=900)

    sync = run("uv", "sync", "--offline", "--locked")
    assert sync.returncode == 0, sync.stderr[-2000:]
    tests = run(
        "uv",
        "run",
        "--no-sync",
        "pytest",
        "-q",
        "-x",
        "-m",
        "not slow and not gpu",
        "-p",
        "no:cacheprovider",
    )
    assert tests.returncode == 0, tests.stdout[-4000:]
