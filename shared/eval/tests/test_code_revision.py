"""code_revision: the job cache's key follows a project's code, not every commit of the repo."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from papers_eval.record import code_revision, git_revision


def _git(root: Path, *argv: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *argv],
        cwd=root,
        check=True,
        capture_output=True,
    )


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _commit(root: Path, message: str) -> None:
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", message)


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    _git(tmp_path, "init", "-q")
    _write(tmp_path, "uv.lock", "lock 1\n")
    _write(tmp_path, "pyproject.toml", "[tool.uv]\n")
    _write(tmp_path, "shared/eval/stats.py", "X = 1\n")
    _write(tmp_path, "projects/a/src/a/core.py", "A = 1\n")
    _write(tmp_path, "projects/a/configs/claim.yaml", "seeds: [0]\n")
    _write(tmp_path, "projects/a/README.md", "# a\n")
    _write(tmp_path, "projects/a/results/claim.json", "{}\n")
    _write(tmp_path, "projects/b/src/b/core.py", "B = 1\n")
    _commit(tmp_path, "start")
    return tmp_path


def test_unrelated_commits_keep_the_key(repo: Path) -> None:
    project = repo / "projects/a"
    key, commit = code_revision(project), git_revision(project)
    assert len(key) == 16 and int(key, 16) >= 0
    _write(repo, "projects/b/src/b/core.py", "B = 2\n")  # another project
    _commit(repo, "b")
    _write(repo, "projects/a/results/claim.json", '{"verdict": "held"}\n')  # its own record
    _write(repo, "projects/a/results/history/x/claim.md", "old\n")
    _write(repo, "projects/a/README.md", "# a, with numbers\n")  # its prose
    _commit(repo, "results and README")
    assert git_revision(project) != commit
    assert code_revision(project) == key


@pytest.mark.parametrize(
    "rel",
    [
        "projects/a/src/a/core.py",
        "projects/a/configs/claim.yaml",
        "shared/eval/stats.py",
        "uv.lock",
    ],
)
def test_code_the_project_runs_changes_the_key(repo: Path, rel: str) -> None:
    project = repo / "projects/a"
    key = code_revision(project)
    _write(repo, rel, (repo / rel).read_text() + "# changed\n")
    dirty_one = code_revision(project)
    assert dirty_one != key  # an uncommitted edit is a new key ...
    _write(repo, rel, (repo / rel).read_text() + "# changed again\n")
    dirty_two = code_revision(project)
    assert dirty_two not in (key, dirty_one)  # ... and a second edit another one
    _commit(repo, "edit")
    assert code_revision(project) not in (key, dirty_one)
    _write(repo, "projects/a/results/claim.json", "[]\n")  # an uncommitted record is not code
    assert code_revision(project) == code_revision(project)


def test_uncommitted_record_or_readme_keeps_the_key(repo: Path) -> None:
    project = repo / "projects/a"
    key = code_revision(project)
    _write(repo, "projects/a/results/claim.json", "[1]\n")
    _write(repo, "projects/a/README.md", "# edited\n")
    assert code_revision(project) == key


def test_a_project_lifted_out_alone_and_no_git(repo: Path, tmp_path_factory) -> None:
    alone = tmp_path_factory.mktemp("alone")
    _git(alone, "init", "-q")
    _write(alone, "src/a/core.py", "A = 1\n")
    _write(alone, "results/claim.json", "{}\n")
    _commit(alone, "start")
    key = code_revision(alone)
    _write(alone, "results/claim.json", "[]\n")
    _commit(alone, "record")
    assert code_revision(alone) == key
    _write(alone, "src/a/core.py", "A = 2\n")
    assert code_revision(alone) != key
    assert code_revision(tmp_path_factory.mktemp("no_git")) == "unknown"
