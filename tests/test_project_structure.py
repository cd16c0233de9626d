"""Every project has what users and CI rely on."""

from __future__ import annotations

import re

import pytest

from papers_eval import load_results
from repo_helpers import PROJECTS, ROOT, needs_projects, structure_problems


@needs_projects
@pytest.mark.parametrize("folder", PROJECTS, ids=lambda p: p.name)
def test_project_follows_the_skeleton(folder):
    assert structure_problems(folder) == []


@needs_projects
@pytest.mark.parametrize("folder", PROJECTS, ids=lambda p: p.name)
def test_project_has_a_results_record(folder):
    record = load_results(folder / "results" / "claim.json")
    assert record["project"] == folder.name
    assert (folder / "results" / "claim.md").is_file()


@needs_projects
@pytest.mark.parametrize("folder", PROJECTS, ids=lambda p: p.name)
def test_project_is_in_the_root_readme_and_registry(folder):
    readme = (ROOT / "README.md").read_text()
    assert re.search(rf"\]\(projects/{re.escape(folder.name)}\)", readme), folder.name
    registry = (ROOT / "papers.toml").read_text()
    assert f'slug = "{folder.name}"' in registry


def test_the_registry_lists_nineteen_distinct_papers():
    import tomllib

    slugs = [p["slug"] for p in tomllib.loads((ROOT / "papers.toml").read_text())["paper"]]
    assert len(slugs) == len(set(slugs)) == 19
