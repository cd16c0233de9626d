"""Bad config values end in one paragraph on stderr and exit 2, whether the parser rejects them
(typed hyper-parameters) or the code does (``ConfigError``, while instantiating or in ``fit``)."""

import argparse
import sys
from typing import Literal

import pytest
from jsonargparse.typing import OpenUnitInterval, PositiveInt
from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel

from papers_cli import ConfigError, UserError, cli_main
from papers_cli.testing import user_error_message


class TypedModel(BoringModel):
    """A module with typed hyper-parameters and a check that only a combination can fail."""

    def __init__(
        self,
        kind: Literal["small", "large"] = "small",
        width: PositiveInt = 4,
        dropout: OpenUnitInterval = 0.5,
        max_width: PositiveInt = 8,
    ) -> None:
        super().__init__()
        if width > max_width:
            raise ConfigError(f"model.width={width} exceeds model.max_width={max_width}")


class PickyDataModule(BoringDataModule):
    """Rejects its data in ``setup``, i.e. inside ``trainer.fit``."""

    def __init__(self, classes: PositiveInt = 2) -> None:
        super().__init__()
        self.classes = classes

    def setup(self, stage: str) -> None:
        if self.classes > 2:
            raise ConfigError(f"data.classes={self.classes} but the data hold 2 classes")
        super().setup(stage)


@pytest.fixture
def project(tmp_path, monkeypatch):
    root = tmp_path / "demo"
    (root / "configs").mkdir(parents=True)
    (root / "pyproject.toml").write_text('[project]\nname = "demo"\nversion = "0"\n')
    (root / "configs" / "default.yaml").write_text(
        "trainer:\n  max_steps: 1\n  limit_val_batches: 0\n  logger: false\n"
        "  enable_checkpointing: false\n"
    )
    monkeypatch.setattr(sys, "argv", ["train"])
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PAPERS_TRACEBACK", raising=False)
    return root


def run(project, *args):
    return cli_main(
        TypedModel, PickyDataModule, project_file=project / "src" / "cli.py", args=list(args)
    )


def error_of(project, capsys, *args) -> str:
    return user_error_message(lambda argv: run(project, *argv), args, capsys)


def test_configerror_is_a_user_facing_value_error():
    assert issubclass(ConfigError, UserError) and issubclass(ConfigError, ValueError)
    assert ConfigError.user_facing


@pytest.mark.parametrize(
    ("flag", "expected"),
    [
        ("--model.kind=medium", "'small', 'large'"),  # the choices are in the message
        ("--model.width=0", "model.width"),
        ("--model.dropout=1", "OpenUnitInterval"),
        ("--data.classes=-1", "data.classes"),
    ],
)
def test_typed_values_are_rejected_while_parsing(project, capsys, flag, expected):
    assert expected in error_of(project, capsys, flag)


def test_a_combination_fails_while_instantiating(project, capsys):
    err = error_of(project, capsys, "--model.width=9")
    assert "model.width=9 exceeds model.max_width=8" in err


def test_the_data_fail_inside_fit(project, capsys):
    err = error_of(project, capsys, "--data.classes=3")
    assert "data.classes=3 but the data hold 2 classes" in err


def test_papers_traceback_shows_the_stack(project, monkeypatch):
    monkeypatch.setenv("PAPERS_TRACEBACK", "1")
    with pytest.raises(ConfigError):
        run(project, "--data.classes=3")
    with pytest.raises(argparse.ArgumentError, match="model.width"):
        run(project, "--model.width=0")


def test_help_lists_the_choices(project, capsys):
    with pytest.raises(SystemExit):
        run(project, "--help")
    assert "{small,large}" in capsys.readouterr().out


def test_user_error_message_fails_on_a_traceback_or_an_accepted_value(project, capsys):
    with pytest.raises(AssertionError, match="accepted"):
        error_of(project, capsys, "--model.width=2")

    def buggy_train(argv):
        raise RuntimeError("bug")

    with pytest.raises(RuntimeError):  # not a user error: the exception itself propagates
        user_error_message(buggy_train, [], capsys)
