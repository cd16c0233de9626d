"""Every project has what users and CI rely on."""

from __future__ import annotations

import re

import pytest

from papers_eval import MIN_SEEDS, RecordSchemaError, load_claim, load_results
from repo_helpers import PROJECTS, ROOT, needs_projects, structure_problems


@needs_projects
@pytest.mark.parametrize("folder", PROJECTS, ids=lambda p: p.name)
def test_project_follows_the_skeleton(folder):
    assert structure_problems(folder) == []


@needs_projects
@pytest.mark.parametrize("folder", PROJECTS, ids=lambda p: p.name)
def test_project_has_a_results_record(folder):
    """A schema-2 record from a full run (not --quick); a schema-1 record stays readable until
    the project's fix-up moves it to the claim protocol (the root table marks it pre-protocol)."""
    path = folder / "results" / "claim.json"
    try:
        record = load_claim(path)
    except RecordSchemaError:
        record = load_results(path)
    else:
        assert not record["quick"], "the committed record comes from a --quick run"
        assert len(record["seeds"]) >= MIN_SEEDS
        assert (folder / "configs" / "claim.yaml").is_file()
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
