"""`tools/ci.py mutate` finds a mutant that a weak test lets through, and shows its diff."""

from __future__ import annotations

import textwrap

import pytest

from ci import mutate, mutation_targets

PYPROJECT = """
[project]
name = "tiny"
version = "0.1.0"

[tool.mutmut]
source_paths = ["src"]
only_mutate = ["src/tiny/core.py"]
pytest_add_cli_args_test_selection = ["tests/test_core.py"]
"""

CORE = """
def scale(x, factor=2):
    return x * factor


def clip(x, low=0):
    return max(x, low)
"""

# Checks scale's value but clip's only above its bound: moving the bound survives.
WEAK_TEST = """
from tiny.core import clip, scale


def test_scale():
    assert scale(3) == 6


def test_clip_keeps_values_above_the_bound():
    assert clip(5) == 5
"""


def write(folder, files):
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(textwrap.dedent(text).lstrip())
    return folder


def test_mutate_reports_the_planted_surviving_mutant(tmp_path, capfd):
    project = write(
        tmp_path / "tiny",
        {
            "pyproject.toml": PYPROJECT,
            "src/tiny/__init__.py": "",
            "src/tiny/core.py": CORE,
            "src/tiny/plumbing.py": "def untouched(x):\n    return x + 1\n",
            "tests/test_core.py": WEAK_TEST,
        },
    )
    (project / "mutants").mkdir()
    (project / "mutants" / "stale").write_text("a previous run")  # must not be reused
    assert mutate(project) == 0
    out = capfd.readouterr().out
    assert "-def clip(x, low=0):\n+def clip(x, low=1):" in out
    assert "x_scale__mutmut" not in out  # only survivors are named: scale's test kills all
    summary = out.strip().splitlines()[-1]
    assert summary.startswith("tiny: ") and " killed, 1 survived, 0 timed out of " in summary
    assert not (project / "mutants" / "stale").exists()


def test_mutate_needs_the_core_module_in_the_project_config(tmp_path):
    project = write(tmp_path / "tiny", {"pyproject.toml": PYPROJECT.replace("core.py", "x.py")})
    with pytest.raises(SystemExit, match="src/tiny/core.py"):
        mutation_targets(project)
