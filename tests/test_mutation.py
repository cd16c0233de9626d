"""`tools/ci.py mutate` finds a mutant that a weak test lets through, and shows its diff; every
project's mutation lane covers the paper's math (core.py) and the LightningModule's training path
(model.py) against tests that exist."""

from __future__ import annotations

import textwrap

import pytest

from ci import mutate, mutation_targets
from repo_helpers import PROJECTS, mutation_config_problems, needs_projects

PYPROJECT = """
[project]
name = "tiny"
version = "0.1.0"

[tool.mutmut]
source_paths = ["src"]
only_mutate = ["src/tiny/core.py", "src/tiny/model.py"]
pytest_add_cli_args_test_selection = ["tests/test_core.py", "tests/test_model.py"]
"""

CORE = """
def scale(x, factor=2):
    return x * factor


def clip(x, low=0):
    return max(x, low)
"""

MODEL = """
from tiny.core import scale


def training_loss(x):
    return scale(x, 3)
"""

MODEL_TEST = """
from tiny.model import training_loss


def test_training_loss_by_hand():
    assert training_loss(5) == 15
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
            "src/tiny/model.py": MODEL,
            "src/tiny/plumbing.py": "def untouched(x):\n    return x + 1\n",
            "tests/test_core.py": WEAK_TEST,
            "tests/test_model.py": MODEL_TEST,
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


def test_mutate_needs_the_model_module_in_the_project_config(tmp_path):
    without = PYPROJECT.replace(', "src/tiny/model.py"', "")
    project = write(tmp_path / "tiny", {"pyproject.toml": without})
    with pytest.raises(SystemExit, match="must list src/tiny/model.py"):
        mutation_targets(project)


def test_config_problems_name_missing_files_and_tests(tmp_path):
    broken = PYPROJECT.replace('"tests/test_model.py"', '"tests/test_model.py::test_gone"')
    broken = broken.replace('"src/tiny/core.py", ', "")
    project = write(
        tmp_path / "tiny",
        {
            "pyproject.toml": broken,
            "src/tiny/model.py": MODEL,
            "tests/test_core.py": WEAK_TEST,
            "tests/test_model.py": MODEL_TEST,
        },
    )
    assert mutation_config_problems(project) == [
        "only_mutate lacks src/tiny/core.py",
        "selected test tests/test_model.py::test_gone does not exist",
    ]
    (project / "tests" / "test_model.py").unlink()
    assert mutation_config_problems(project)[-2:] == [
        "selected test file tests/test_model.py does not exist",
        "no selected test imports tiny.model or tiny.cli",
    ]


def test_config_problems_name_a_module_that_reads_its_frame(tmp_path):
    module = MODEL + "\n\nclass M:\n    def __init__(self, lr=1.0):\n"
    files = {"src/tiny/core.py": CORE, "tests/test_core.py": WEAK_TEST}
    files["tests/test_model.py"] = MODEL_TEST
    project = write(
        tmp_path / "tiny",
        {
            **files,
            "pyproject.toml": PYPROJECT,
            "src/tiny/model.py": module + "        self.save_hyperparameters()\n",
        },
    )
    assert mutation_config_problems(project) == [
        "src/tiny/model.py calls save_hyperparameters() without arguments: pass "
        "init_arguments(locals())"
    ]
    explicit = module + "        self.save_hyperparameters(init_arguments(locals()))\n"
    (project / "src/tiny/model.py").write_text(explicit)
    assert mutation_config_problems(project) == []


@needs_projects
@pytest.mark.parametrize("folder", PROJECTS, ids=lambda p: p.name)
def test_every_project_mutates_its_math_and_module_against_tests_that_exist(folder):
    assert mutation_config_problems(folder) == []
    assert mutation_targets(folder)  # what `tools/ci.py mutate` itself requires
