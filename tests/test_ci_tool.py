"""Change detection in tools/ci.py: which units a diff selects."""

from __future__ import annotations

from pathlib import Path

import pytest

from ci import Unit, changed_files, select_changed, tally, units, workspace_dependents

LOCK = """
version = 1
[[package]]
name = "papers-gpu"
source = { editable = "shared/gpu" }
dependencies = [{ name = "torch" }]
[[package]]
name = "papers-cli"
source = { editable = "shared/cli" }
dependencies = [{ name = "papers-gpu" }, { name = "rich" }]
[[package]]
name = "papers-eval"
source = { editable = "shared/eval" }
[[package]]
name = "alpha"
source = { editable = "projects/alpha" }
dependencies = [{ name = "papers-cli" }]
[[package]]
name = "beta"
source = { editable = "projects/beta" }
dependencies = [{ name = "papers-eval" }]
[[package]]
name = "torch"
source = { registry = "https://pypi.org/simple" }
"""

UNITS = [
    Unit("alpha", Path("projects/alpha"), True),
    Unit("beta", Path("projects/beta"), True),
    Unit("papers-cli", Path("shared/cli"), False),
    Unit("papers-eval", Path("shared/eval"), False),
    Unit("papers-gpu", Path("shared/gpu"), False),
]


def names(files):
    return [u.name for u in select_changed(files, UNITS, LOCK)]


def test_dependents_are_transitive_and_local_only():
    dependents = workspace_dependents(LOCK)
    assert dependents["papers-gpu"] == {"papers-cli", "alpha"}
    assert dependents["papers-eval"] == {"beta"}
    assert "torch" not in dependents


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (["projects/alpha/src/alpha/core.py"], ["alpha"]),
        (["projects/beta/README.md", "projects/alpha/tests/t.py"], ["alpha", "beta"]),
        (["shared/gpu/src/papers_gpu/hardware.py"], ["alpha", "papers-cli", "papers-gpu"]),
        (["shared/eval/README.md"], ["beta", "papers-eval"]),
        (["uv.lock"], [u.name for u in UNITS]),
        (["tools/ci.py", "projects/alpha/x.py"], [u.name for u in UNITS]),
        (["projects/gone/x.py"], []),
        ([], []),
    ],
)
def test_select_changed(files, expected):
    assert names(files) == expected


def test_unknown_base_means_everything_changed():
    assert changed_files("0" * 40) is None
    assert changed_files("no-such-ref") is None


def test_units_lists_real_members():
    found = {u.name: u for u in units()}
    assert {"papers-cli", "papers-data", "papers-eval", "papers-gpu"} <= set(found)
    assert not found["papers-cli"].is_project


def test_empty_or_crashed_lanes_count_as_failures():
    assert tally(0, (3, 0, 1)) == (3, 0, 1)
    assert tally(1, (2, 1, 0)) == (2, 1, 0)
    assert tally(5, (0, 0, 0)) == (0, 1, 0)  # pytest: no tests collected
    assert tally(2, (0, 0, 0)) == (0, 1, 0)  # interrupted / collection error


def test_collated_cells_escape_table_pipes():
    from collate_results import _cell

    assert _cell("a | b\n c") == "a \\| b c"
