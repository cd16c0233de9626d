"""tools/new_project.py makes a project that follows the skeleton and passes its own tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from new_project import create
from repo_helpers import copy_repository, mutation_config_problems, structure_problems


def test_rejects_bad_slugs(tmp_path):
    for slug in ("Bad", "a_b", "-x", "permflow/../x"):
        with pytest.raises(SystemExit):
            create(slug, root=tmp_path, lock=False)


def test_generated_project_passes_its_tests(tmp_path):
    repo = copy_repository(tmp_path / "repo")
    folder = create("demo-paper", title="A demo paper", root=repo)
    assert structure_problems(folder) == []
    assert mutation_config_problems(folder) == []
    assert "demo-paper" in (repo / "uv.lock").read_text()

    def run(*command):
        return subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=600)

    sync = run("uv", "sync", "--locked", "--package", "demo-paper")
    assert sync.returncode == 0, sync.stderr[-2000:]
    # The locked ruff of the policy environment: `uv run --with ruff` would take the newest one.
    ruff = str(Path(sys.executable).with_name("ruff"))
    lint = run(ruff, "check", "projects/demo-paper")
    formatted = run(ruff, "format", "--check", "projects/demo-paper")
    tests = run(
        "uv",
        "run",
        "--no-sync",
        "pytest",
        "projects/demo-paper/tests",
        "-q",
        "-m",
        "not slow and not gpu",
        "-p",
        "no:cacheprovider",
    )
    assert tests.returncode == 0, tests.stdout[-4000:]
    assert " passed" in tests.stdout.splitlines()[-1]
    assert lint.returncode == 0, lint.stdout[-2000:]
    assert formatted.returncode == 0, formatted.stdout[-2000:]
