"""The LightningModule's plumbing by value (issue 50, the mutation lane over model.py): its
defaults, the input checks, the data/model agreement check, the optimiser and its schedule,
Gumbel-Sinkhorn's annealed temperature, and what the training, validation and test hooks log.

These are the parts of model.py the first mutation run at 3b040a4 left alive because only the
slower CLI tests (outside the mutation selection) touched them, or nothing did. Each test
builds the module directly, with no trainer unless one is stubbed, so a mutant costs a second.
"""

import inspect
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml

from papers_cli import ConfigError
from permflow.evaluate import LOGGED_METRICS, permutation_metrics
from permflow.model import PermutationModel

PROJECT = Path(__file__).resolve().parents[1]
TINY = {"width": 16, "heads": 4, "image_dim": 16, "channels": (4, 8), "steps": 3}


def tiny(**overrides) -> PermutationModel:
    return PermutationModel(**{**TINY, **overrides})


def test_every_constructor_default_is_a_value_train_runs():
    """A module built in code is the one `uv run train` runs: each default equals
    configs/default.yaml's model section (or, for the task, n and digits that the data module
    shares, its data section); the baselines' knobs equal what configs/sinkhorn.yaml and
    configs/gumbel_sinkhorn.yaml set, and the weight decay the README states."""
    default = yaml.safe_load((PROJECT / "configs" / "default.yaml").read_text())
    sinkhorn = yaml.safe_load((PROJECT / "configs" / "sinkhorn.yaml").read_text())["model"]
    gumbel = yaml.safe_load((PROJECT / "configs" / "gumbel_sinkhorn.yaml").read_text())["model"]
    expected = {
        **{k: default["data"][k] for k in ("task", "n", "digits")},
        **{k: v for k, v in sinkhorn.items() if k not in ("method", "decode")},
        **{k: v for k, v in gumbel.items() if k not in ("method", "decode")},
        "decode": "noiseless",  # the Sinkhorn baseline's; Gumbel-Sinkhorn's config sets noisy
        "weight_decay": 1e-4,
        **default["model"],
    }
    expected = {k: tuple(v) if isinstance(v, list) else v for k, v in expected.items()}
    defaults = {
        name: p.default
        for name, p in inspect.signature(PermutationModel.__init__).parameters.items()
        if name != "self"
    }
    assert defaults == expected
    # What a module built with no arguments stores (the signature alone would not show a default
    # changed inside a wrapper, e.g. the mutation lane's trampoline).
    built = {k: v for k, v in dict(PermutationModel().hparams).items() if not k.startswith("_")}
    assert {k: tuple(v) if isinstance(v, list) else v for k, v in built.items()} == expected


def test_width_must_split_into_heads():
    message = (
        r"^model.width=18 must be a multiple of model.heads=4 \(each attention head gets "
        r"width / heads channels\); change one of them$"
    )
    with pytest.raises(ConfigError, match=message):
        tiny(width=18)


def test_check_condition_accepts_the_tasks_shapes_and_names_what_is_wrong():
    """Sorting images [B, n, 1, H, W] (W = H x digits, so a 2-digit image is not square) and
    square SLAP costs [B, n, n] with B != n pass; a non-square or non-finite cost matrix and a
    batch of the wrong n raise with what was found."""
    tiny(digits=2).check_condition(torch.zeros(3, 5, 1, 14, 28))
    slap = tiny(task="slap")
    slap.check_condition(torch.zeros(2, 5, 5))
    with pytest.raises(ValueError, match=r"cost matrices must be square, got \(2, 5, 6\)"):
        slap.check_condition(torch.zeros(2, 5, 6))
    with pytest.raises(ValueError, match=r"^cost matrix contains NaN or inf$"):
        slap.check_condition(torch.tensor([[[0.0, 1.0], [math.inf, 0.0]]]).expand(1, 2, 2))
    with pytest.raises(ValueError, match=r"^batch has n=4 items but model.n=5$"):
        tiny().check_condition(torch.zeros(3, 4, 1, 14, 14))
    with pytest.raises(ValueError, match=r"^batch has n=4 items but model.n=5$"):
        slap.check_condition(torch.zeros(2, 4, 4))


def with_datamodule(model: PermutationModel, hparams) -> PermutationModel:
    """A stub trainer whose data module carries ``hparams`` (what setup reads)."""
    model._trainer = SimpleNamespace(datamodule=SimpleNamespace(hparams=hparams))
    return model


def test_setup_stops_when_the_data_and_the_model_disagree():
    tiny().setup("fit")  # no trainer: nothing to compare
    with_datamodule(tiny(), {"n": 5, "task": "sorting"}).setup("fit")
    with_datamodule(tiny(), {"num_train": 16}).setup("fit")  # keys it does not share
    model = tiny()
    model._trainer = SimpleNamespace(datamodule=SimpleNamespace())  # no hparams at all
    model.setup("fit")
    model._trainer = SimpleNamespace()  # a trainer without a data module (fit on loaders)
    model.setup("fit")
    with pytest.raises(ConfigError, match=r"^data.n=6 but model.n=5; set both to the same value"):
        with_datamodule(tiny(), {"n": 6, "task": "sorting"}).setup("fit")
    with pytest.raises(ConfigError, match=r"^data.task='slap' but model.task='sorting'; set both"):
        with_datamodule(tiny(), {"n": 5, "task": "slap"}).setup("fit")


def test_adamw_with_a_cosine_decay_to_zero_over_lr_decay_steps_then_flat():
    model = tiny(lr=3e-3, weight_decay=0.02, lr_decay_steps=100)
    config = model.configure_optimizers()
    assert set(config) == {"optimizer", "lr_scheduler"}
    optimizer, schedule = config["optimizer"], config["lr_scheduler"]
    assert isinstance(optimizer, torch.optim.AdamW)
    group = optimizer.param_groups[0]
    assert (group["initial_lr"], group["weight_decay"]) == (3e-3, 0.02)
    assert sum(p.numel() for p in group["params"]) == sum(p.numel() for p in model.parameters())
    assert schedule["interval"] == "step"
    factor = schedule["scheduler"].lr_lambdas[0]
    for step, value in [(0, 1.0), (25, 0.5 + 0.5 * math.cos(math.pi / 4)), (50, 0.5)]:
        assert factor(step) == pytest.approx(value, abs=1e-12)
    assert factor(100) == pytest.approx(0.0, abs=1e-12)
    assert factor(250) == pytest.approx(0.0, abs=1e-12)  # flat after the decay


def test_gumbel_tau_anneals_geometrically_over_the_trainers_steps():
    """tau(s) = tau0 (tau_final / tau0)^(s / max_steps), clamped at the end; tau0 without a
    trainer or without a step budget."""
    model = tiny(method="gumbel_sinkhorn", sinkhorn_tau=2.0, gumbel_tau_final=0.5)
    assert model.gumbel_tau() == 2.0
    for max_steps in (None, 0, -1):
        model._trainer = SimpleNamespace(max_steps=max_steps, global_step=10)
        assert model.gumbel_tau() == 2.0
    for step, value in [(0, 2.0), (50, 1.0), (100, 0.5), (400, 0.5)]:
        model._trainer = SimpleNamespace(max_steps=100, global_step=step)
        assert model.gumbel_tau() == pytest.approx(value, rel=1e-12)


class LogRecorder:
    def __init__(self):
        self.calls = []

    def __call__(self, name, value, **kwargs):
        self.calls.append((name, value, kwargs))


def test_training_step_returns_and_logs_the_training_loss(default_model_and_batch, monkeypatch):
    model, batch = default_model_and_batch
    log = LogRecorder()
    monkeypatch.setattr(model, "log", log)
    torch.manual_seed(5)
    expected = model.training_loss(batch)
    torch.manual_seed(5)
    loss = model.training_step(batch, 0)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    [(name, value, kwargs)] = log.calls
    assert (name, kwargs) == (
        "train/loss",
        {"prog_bar": True, "batch_size": len(batch["num_valid"])},
    )
    assert value is loss


@pytest.mark.parametrize(
    ("step", "epoch_end", "prefix"),
    [
        ("validation_step", "on_validation_epoch_end", "val"),
        ("test_step", "on_test_epoch_end", "test"),
    ],
)
def test_evaluation_hooks_log_the_metrics_of_samples_seeded_by_batch_index(
    default_model_and_batch, monkeypatch, step, epoch_end, prefix
):
    """Each evaluation batch draws its samples from a generator seeded by its index (the global
    generator's state does not matter), and the epoch end logs the mean of every metric over
    the epoch's inputs, synchronised across ranks, with both-modes recovery on the progress
    bar; then it forgets them."""
    model, batch = default_model_and_batch
    log = LogRecorder()
    monkeypatch.setattr(model, "log", log)
    model._eval_outputs.clear()
    torch.manual_seed(0)
    getattr(model, step)(batch, 0)
    torch.manual_seed(1)  # another global state: the samples must not change
    getattr(model, step)(batch, 3)
    [first, second] = model._eval_outputs
    for output, index in [(first, 0), (second, 3)]:
        perms, stats = model.sample_permutations(
            batch, model.hparams.num_samples, torch.Generator().manual_seed(index)
        )
        np.testing.assert_array_equal(output["samples"], perms)
        np.testing.assert_array_equal(output["nearest"], stats["nearest"])
    assert not np.array_equal(first["samples"], second["samples"])
    outputs = {k: np.concatenate([first[k], second[k]]) for k in first}
    expected = permutation_metrics(**outputs)
    getattr(model, epoch_end)()
    assert model._eval_outputs == []
    logged = {name: (value, kwargs) for name, value, kwargs in log.calls}
    keys = [k for k in LOGGED_METRICS if k in expected and len(expected[k])]
    assert set(logged) == {f"{prefix}/{k}" for k in keys}
    assert "both_modes" in keys
    for key in keys:
        value, kwargs = logged[f"{prefix}/{key}"]
        assert value == pytest.approx(float(np.mean(expected[key])), rel=1e-12)
        assert kwargs == {"sync_dist": True, "prog_bar": key == "both_modes"}
    log.calls.clear()
    getattr(model, epoch_end)()  # nothing collected: nothing logged
    assert log.calls == []


def structure(net: torch.nn.Module) -> tuple:
    """What a network is built of: its parameters' names and shapes, each attention's number of
    heads (which no parameter shape shows) and whether it is the flow's network."""
    shapes = tuple((name, tuple(p.shape)) for name, p in net.state_dict().items())
    heads = tuple(m.num_heads for m in net.modules() if hasattr(m, "num_heads"))
    return shapes, heads, getattr(net, "flow", None)


@pytest.mark.parametrize("method", ["permflow", "sinkhorn", "gumbel_sinkhorn"])
def test_the_module_builds_the_network_its_arguments_name(method):
    """Every size reaches the network (non-default values, so a dropped or swapped argument
    shows), and only PermFlow gets the flow's network (x_t and t inputs)."""
    from permflow.networks import AxialNet, SortingNet

    sizes = {"width": 12, "depth": 1, "heads": 3}
    flow = method == "permflow"
    sorting = PermutationModel(
        method=method, n=6, image_dim=8, channels=(4,), digits=2, grid_depth=2, **sizes
    )
    expected = SortingNet(6, flow, 12, 1, 3, 8, channels=(4,), digits=2, grid_depth=2)
    assert structure(sorting.net) == structure(expected)
    other = SortingNet(6, not flow, 12, 1, 3, 8, channels=(4,), digits=2, grid_depth=2)
    assert structure(sorting.net) != structure(other)
    slap = PermutationModel(task="slap", method=method, n=6, **sizes)
    assert structure(slap.net) == structure(AxialNet(flow, 12, 1, 3))
    assert structure(slap.net) != structure(AxialNet(not flow, 12, 1, 3))
