"""The lock, the workflows, the README table and the pre-commit config are in order."""

from __future__ import annotations

import shutil
import subprocess

import yaml

from repo_helpers import ROOT


def run(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True)


def test_uv_lock_is_up_to_date():
    result = run("uv", "lock", "--check")
    assert result.returncode == 0, result.stderr


def test_workflows_pass_actionlint():
    actionlint = shutil.which("actionlint")
    assert actionlint, "actionlint (root dev group) is not installed"
    result = run(actionlint, "-no-color")
    assert result.returncode == 0, result.stdout + result.stderr


def test_gpu_jobs_run_on_self_hosted_runners_and_never_for_forks():
    gpu = yaml.safe_load((ROOT / ".github/workflows/gpu.yml").read_text())
    assert gpu["jobs"]["gpu"]["runs-on"] == ["self-hosted", "linux", "gpu"]
    guard = gpu["jobs"]["projects"]["if"]
    assert "head.repo.full_name == github.repository" in guard and "author_association" in guard


def test_readme_papers_table_is_collated():
    result = run("uv", "run", "--no-sync", "python", "tools/collate_results.py", "--check")
    assert result.returncode == 0, result.stdout


def test_readme_names_the_test_command_that_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci/run").read_text()
    assert "uv run tools/ci.py test" in readme
    assert "tools/ci.py test" in ci
    assert "pip install" in ci  # installs uv when it is missing


def test_precommit_hooks_are_all_local():
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    assert [repo["repo"] for repo in config["repos"]] == ["local"]
    hooks = {hook["id"] for hook in config["repos"][0]["hooks"]}
    expected = {
        "ruff-check",
        "ruff-format",
        "uv-lock-check",
        "trailing-whitespace",
        "end-of-file",
        "check-yaml",
        "check-toml",
        "large-files",
    }
    assert expected <= hooks
