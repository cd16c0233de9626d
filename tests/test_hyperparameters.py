"""Every hyper-parameter that LightningCLI parses is typed so that a bad value fails while parsing.

The rule, for each parameter of the ``__init__`` of every LightningModule and LightningDataModule
defined in a project (after dropping ``None`` from an optional type, and for each element type of
a list, tuple or dict):

- it has a type annotation and a default (the default must pass its own type);
- ``int`` and ``float`` are constrained: ``PositiveInt``, ``NonNegativeFloat``,
  ``OpenUnitInterval``, ... from ``jsonargparse.typing``, or a ``restricted_number_type``. The
  few that may take any value (a location on the real line, a log-scale start, a signed index)
  are listed in ``UNBOUNDED`` with the reason;
- ``str`` is a ``Literal[...]`` of its choices, unless its name says it is free text: a path,
  a file pattern, an identifier or a name (``FREE_TEXT``);
- ``bool``, ``Literal``, constrained numbers and other classes (``Path``, ...) pass as they are.

Projects are imported, so this needs every project's dependencies (the policy lane syncs
``--all-packages``). Importing them together also surfaces a range registered twice under two
names (jsonargparse keeps one type per range: create project ranges with ``name=None``).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import typing
from pathlib import Path
from typing import Literal, Optional

from jsonargparse import ArgumentError, ArgumentParser
from jsonargparse.typing import PositiveFloat, PositiveInt
from lightning.pytorch import LightningDataModule, LightningModule

from repo_helpers import PROJECTS, needs_projects

FREE_TEXT = re.compile(
    r"^(root|files|pretrained|name)$|(^|_)(variables|checkpoint)$|_(path|file|dir|id)$"
)
UNBOUNDED = {
    "AsyncDiffusionModule.schedule_init": "raw log-increment the learned schedule starts from",
    "AsyncDiffusionModule.time_loc": "location of the logit-normal time density",
    "UnlearningModule.scorer_layer": "hidden-state index; negative counts from the last layer "
    "(its range depends on num_layers: a ConfigError)",
    "SurvivalDelayDataModule.gamma": "log hazard ratio of the simulated target cohort",
}
LIGHTNING_BASES = (LightningModule, LightningDataModule)


def _leaf_types(hint) -> list:
    """The types a value is checked against, with optional and container layers peeled off."""
    if hint is type(None) or hint is Ellipsis:
        return []
    if typing.get_origin(hint) is Literal or not typing.get_args(hint):
        return [hint]
    return [leaf for arg in typing.get_args(hint) for leaf in _leaf_types(arg)]


def parameter_problems(cls: type) -> list[str]:
    """What breaks the rule of the module docstring in ``cls.__init__``."""
    problems = []
    hints = typing.get_type_hints(cls.__init__)
    for name, parameter in inspect.signature(cls.__init__).parameters.items():
        if name == "self":
            continue
        where = f"{cls.__qualname__}.{name}"
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            problems.append(f"{where}: *args/**kwargs cannot be configured")
            continue
        if name not in hints:
            problems.append(f"{where}: no type annotation")
            continue
        if parameter.default is parameter.empty:
            problems.append(f"{where}: no default")
        for leaf in _leaf_types(hints[name]):
            if leaf in (int, float) and where not in UNBOUNDED:
                problems.append(f"{where}: bare {leaf.__name__}; constrain it (PositiveInt, ...)")
            elif leaf is str and not FREE_TEXT.search(name):
                problems.append(f"{where}: bare str; use Literal[...] of its choices")
    return problems


def _module_names(project: Path) -> list[str]:
    """Modules of a project's packages that define a class deriving from a Lightning base."""
    names = []
    for path in sorted((project / "src").glob("*/*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        bases = {
            base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
            for node in ast.walk(tree)
            if isinstance(node, ast.ClassDef)
            for base in node.bases
        }
        if bases & {"LightningModule", "LightningDataModule"}:
            names.append(f"{path.parent.name}.{path.stem}")
    return names


def lightning_classes(project: Path) -> list[type]:
    classes = []
    for module_name in _module_names(project):
        module = importlib.import_module(module_name)
        classes += [
            obj
            for obj in vars(module).values()
            if isinstance(obj, type)
            and obj.__module__ == module_name
            and issubclass(obj, LIGHTNING_BASES)
        ]
    return classes


def default_problems(cls: type) -> list[str]:
    """A default that its own type rejects, found by parsing no arguments."""
    parser = ArgumentParser(exit_on_error=False)
    try:
        parser.add_class_arguments(cls, "hp")
        parser.parse_args([])
    except (ValueError, ArgumentError) as error:
        return [f"{cls.__qualname__}: {' '.join(str(error).split())}"]
    return []


@needs_projects
def test_every_project_hyperparameter_is_typed_and_constrained():
    problems, parameters = [], set()
    for project in PROJECTS:
        classes = lightning_classes(project)
        if not classes:
            problems.append(f"{project.name}: no LightningModule or LightningDataModule found")
        for cls in classes:
            problems += parameter_problems(cls) + default_problems(cls)
            parameters |= {
                f"{cls.__qualname__}.{name}" for name in inspect.signature(cls).parameters
            }
    problems += [
        f"UNBOUNDED lists {key}, which no class has" for key in set(UNBOUNDED) - parameters
    ]
    assert problems == [], "\n".join(problems)


class _Planted(LightningModule):
    def __init__(
        self,
        required: PositiveInt,
        mode: str = "a",
        lr: float = 1e-3,
        hidden: int = 8,
        sizes: tuple[int, ...] = (1,),
        untyped=3,
        root: str | None = None,
        tokenizer_path: Optional[str] = None,  # noqa: UP045 (both spellings must be handled)
        fine: Literal["a", "b"] = "a",
        width: PositiveInt = 4,
        temperature: PositiveFloat | None = None,
        flag: bool = True,
    ) -> None:
        super().__init__()


def test_the_rule_catches_a_planted_bad_signature():
    problems = parameter_problems(_Planted)
    joined = " | ".join(problems)
    for name in ("mode: bare str", "lr: bare float", "hidden: bare int", "sizes: bare int"):
        assert f"_Planted.{name}" in joined
    assert "_Planted.untyped: no type annotation" in joined
    assert "_Planted.required: no default" in joined
    for fine in ("root", "tokenizer_path", "fine", "width", "temperature", "flag"):
        assert f"_Planted.{fine}:" not in joined
    assert len(problems) == 6


class _BadDefault(LightningModule):
    def __init__(self, width: PositiveInt = 0) -> None:
        super().__init__()


def test_a_default_its_type_rejects_is_caught():
    assert "hp.width" in " ".join(default_problems(_BadDefault))
