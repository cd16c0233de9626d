"""init_arguments: a module's hyper-parameters given explicitly, as builtins."""

from __future__ import annotations

import pickle
from pathlib import Path

import torch
from jsonargparse.typing import PositiveFloat, PositiveInt
from lightning.pytorch import LightningModule

from papers_cli.hparams import builtin, init_arguments


class _Module(LightningModule):
    def __init__(self, width: PositiveInt = 4, lr: PositiveFloat = 0.1, sizes=(2, 3)) -> None:
        super().__init__()
        self.save_hyperparameters(init_arguments(locals()))
        self.layer = torch.nn.Linear(width, 1)


def test_jsonargparse_numbers_become_builtins_inside_containers():
    value = builtin(
        {"a": PositiveInt(3), "b": [PositiveFloat(0.5), "x", True], "c": (1, None), "p": Path("/d")}
    )
    assert value == {"a": 3, "b": [0.5, "x", True], "c": (1, None), "p": "/d"}
    assert type(value["a"]) is int and type(value["b"][0]) is float
    assert type(value["b"][2]) is bool and type(value["c"]) is tuple


def test_module_stores_its_arguments_and_loads_weights_only(tmp_path):
    module = _Module(width=PositiveInt(3), lr=PositiveFloat(0.01))
    assert dict(module.hparams) == {"width": 3, "lr": 0.01, "sizes": (2, 3)}
    assert type(module.hparams.width) is int and type(module.hparams.lr) is float
    path = tmp_path / "m.ckpt"
    torch.save({"hyper_parameters": dict(module.hparams)}, path)
    assert torch.load(path, weights_only=True)["hyper_parameters"]["lr"] == 0.01
    with_subclass = {"lr": PositiveFloat(0.01)}
    torch.save(with_subclass, tmp_path / "bad.pt")
    try:
        torch.load(tmp_path / "bad.pt", weights_only=True)
    except pickle.UnpicklingError:
        pass  # why init_arguments converts
    else:  # pragma: no cover - a torch that accepts subclasses would make the conversion moot
        raise AssertionError("weights_only accepted an int/float subclass")
