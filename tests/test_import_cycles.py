"""No package imports itself in a circle, and a project's cli.py never reaches its claim.py.

CONVENTIONS' skeleton: cli.py holds the LightningCLI class and `train`; claim.py holds the claim
experiment and `main` (the `papers.reproduce` entry point) and may import cli.py, never the other
way round. The graph is read with `ast` from every module of a package, counting the imports
inside functions too (a lazy import is still a dependency, and hides a cycle rather than removing
it); only imports under `if TYPE_CHECKING:` are left out, as they never run.
"""

from __future__ import annotations

import ast

import pytest

from repo_helpers import (
    PROJECTS,
    ROOT,
    cycles,
    import_graph,
    needs_projects,
    packages,
    pyproject,
    reachable,
)

SHARED = sorted(p.parent for p in (ROOT / "shared").glob("*/pyproject.toml"))


# Cycles known and left for their project's own fix-up; the test fails when one goes away too, so
# that this list only shrinks. (atwu's data.py <-> rwku.py went when the record helpers moved to
# atwu/records.py.)
KNOWN_CYCLES: dict[str, list[list[str]]] = {}

UNITS = [(folder, package) for folder in PROJECTS + SHARED for package in packages(folder)]


@pytest.mark.parametrize(
    ("folder", "package"), UNITS, ids=[f"{f.parent.name}/{p.name}" for f, p in UNITS]
)
def test_no_import_cycle_inside_a_package(folder, package):
    assert cycles(import_graph(package)) == KNOWN_CYCLES.get(package.name, [])


@needs_projects
@pytest.mark.parametrize("folder", PROJECTS, ids=lambda p: p.name)
def test_cli_never_imports_claim(folder):
    (package,) = packages(folder)
    graph = import_graph(package)
    cli, claim = f"{package.name}.cli", f"{package.name}.claim"
    assert {cli, claim} <= set(graph)
    assert claim not in reachable(graph, cli), f"{cli} imports {claim} (directly or through others)"


@needs_projects
@pytest.mark.parametrize("folder", PROJECTS, ids=lambda p: p.name)
def test_reproduce_entry_point_is_claim_main(folder):
    (package,) = packages(folder)
    meta = pyproject(folder)
    entry = meta["project"]["entry-points"]["papers.reproduce"][meta["project"]["name"]]
    assert entry == f"{package.name}.claim:main"
    tree = ast.parse((package / "claim.py").read_text())
    assert "main" in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}


def test_the_graph_sees_relative_lazy_and_submodule_imports(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "cli.py": "from pkg import model\n",
        "model.py": "def f():\n    from .sub import helper\n",
        "sub/__init__.py": "",
        "sub/helper.py": "import pkg.claim as c\n",
        "claim.py": (
            "from typing import TYPE_CHECKING\nfrom pkg.cli import train\n"
            "if TYPE_CHECKING:\n    from pkg import data\n"
        ),
        "data.py": "from pkg import claim\n",
    }
    for name, text in files.items():
        (package / name).write_text(text)
    graph = import_graph(package)
    assert graph["pkg.cli"] == {"pkg.model"}
    assert graph["pkg.model"] == {"pkg.sub.helper"}
    assert graph["pkg.sub.helper"] == {"pkg.claim"}
    assert graph["pkg.claim"] == {"pkg.cli"}  # the TYPE_CHECKING import does not run
    assert cycles(graph) == [["pkg.claim", "pkg.cli", "pkg.model", "pkg.sub.helper"]]
    assert "pkg.claim" in reachable(graph, "pkg.cli")
