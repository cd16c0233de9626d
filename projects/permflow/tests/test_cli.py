"""The real entry points: config parsing, training through LightningCLI, DDP, resume, test."""

import inspect
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from papers_cli.testing import check_resume, run_ddp_train, run_train_test, user_error_message
from papers_gpu import derived_seed, seed_all_generators
from permflow.cli import train
from permflow.data import PermutationDataModule, generate_slap, save_slap
from permflow.evaluate import start_cross_entropy
from permflow.model import PermutationModel

PROJECT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((PROJECT / "configs").glob("*.yaml"))


@pytest.mark.parametrize(
    "config", [c for c in CONFIGS if c.name != "claim.yaml"], ids=lambda p: p.name
)
def test_every_config_parses(config, capsys):
    with pytest.raises(SystemExit) as info:
        train(["fit", "--config", str(config), "--print_config"])
    assert info.value.code == 0, capsys.readouterr().err


@pytest.mark.parametrize(
    ("cls", "section"), [(PermutationModel, "model"), (PermutationDataModule, "data")]
)
def test_constructor_defaults_are_default_yaml(cls, section):
    """One source of defaults: a model or data module built in code is the one `train` runs."""
    config = yaml.safe_load((PROJECT / "configs" / "default.yaml").read_text())[section]
    defaults = {
        name: p.default
        for name, p in inspect.signature(cls.__init__).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    for key, value in config.items():
        expected = tuple(value) if isinstance(value, list) else value
        assert defaults[key] == expected, f"{section}.{key}: {defaults[key]} vs {value}"


def test_slap_with_baseline_layers_configs(capsys):
    with pytest.raises(SystemExit):
        train(
            [
                "--config",
                str(PROJECT / "configs/slap.yaml"),
                "--config",
                str(PROJECT / "configs/sinkhorn.yaml"),
                "--print_config",
            ]
        )
    printed = capsys.readouterr().out
    assert "method: sinkhorn" in printed and "task: slap" in printed and "n: 8" in printed


def test_train_fast_dev_run_through_the_cli(tiny_args):
    cli = train([*tiny_args, "--trainer.fast_dev_run=1"])
    assert cli.trainer.state.finished and cli.trainer.global_step == 1


@pytest.mark.parametrize("method", ["sinkhorn", "gumbel_sinkhorn"])
def test_baselines_train_on_slap_through_the_cli(tiny_args, method):
    cli = train(
        [
            *tiny_args,
            f"--config={PROJECT / 'configs/slap.yaml'}",
            f"--config={PROJECT / f'configs/{method}.yaml'}",
            "--trainer.fast_dev_run=1",
            "--data.n=5",
        ]
    )
    assert cli.model.hparams.method == method and cli.model.hparams.n == 5


def test_same_seed_same_metrics(tiny_args):
    first = train([*tiny_args, "--seed_everything=3"]).trainer.callback_metrics
    again = train([*tiny_args, "--seed_everything=3"]).trainer.callback_metrics
    for key in ("train/loss", "val/valid_rate", "val/accuracy", "val/coupling"):
        assert first[key].item() == again[key].item()


def test_short_run_of_the_default_model_lowers_the_loss(tiny_args):
    """The model default.yaml builds (endpoint row-softmax, cross-entropy, t = u^2, its sizes)
    learns on a fixed batch through its own training_loss, and learns to read the images."""
    default_sizes = ["--model.width=32", "--model.image_dim=64", "--model.channels=[16, 32]"]
    cli = train([*tiny_args, *default_sizes, "--trainer.max_steps=0"])
    model, data = cli.model, cli.datamodule
    assert model.hparams.prediction == "endpoint_softmax"
    assert model.hparams.time_sampling == "early" and model.hparams.task == "sorting"
    batch = next(iter(data.train_dataloader()))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    torch.manual_seed(1)
    before = sum(model.training_loss(batch).item() for _ in range(8)) / 8
    for _ in range(120):
        optimizer.zero_grad()
        model.training_loss(batch).backward()
        optimizer.step()
    torch.manual_seed(1)
    after = sum(model.training_loss(batch).item() for _ in range(8)) / 8
    assert after < 0.7 * before
    # At t = 0 the input x_t is pure noise, so only the images can lower the endpoint loss:
    # a field that learned to read x_t alone (the rank-code bug) stays at log n here.
    at_start = start_cross_entropy(model, batch, batch["condition"])
    wrong_images = start_cross_entropy(model, batch, batch["condition"].roll(1, dims=0))
    assert at_start < 0.5 * math.log(model.hparams.n) and wrong_images > at_start + 1.0


def test_oracle_through_the_module_recovers_both_orders(tiny_args):
    """The default sampler (Euler, endpoint form) with the exact posterior field: every sample
    valid, both orders on every ambiguous sequence, the coupling followed, sums exact."""
    from permflow.evaluate import evaluate

    cli = train([*tiny_args, "--trainer.max_steps=0", "--data.num_test=32"])
    result = evaluate(cli.model, cli.datamodule.test_dataloader(), 16, oracle=True)
    assert np.mean(result["valid_rate"]) == 1.0 and np.mean(result["accuracy"]) == 1.0
    assert np.mean(result["both_modes"]) == 1.0 and np.mean(result["coupling"]) == 1.0
    assert result["violation"].max() < 1e-4
    untrained = evaluate(cli.model, cli.datamodule.test_dataloader(), 16)
    assert np.mean(untrained["valid_rate"]) < 0.5  # the untrained network is no oracle


def test_ranks_draw_different_training_noise():
    """Under DDP, SeedEveryStep re-seeds every rank from (seed, rank, epoch, batch) before each
    batch: the model's x0 and t then differ across ranks and repeat on the same rank."""
    model = PermutationModel(width=16, image_dim=16, channels=(4, 8))
    draws = []
    for rank in (0, 1, 0):
        seed_all_generators(derived_seed(7, rank, 0, 3))
        draws.append(model.draw_training_noise(8))
    (x0_a, t_a), (x0_b, t_b), (x0_c, t_c) = draws
    assert not torch.allclose(x0_a, x0_b) and not torch.allclose(t_a, t_b)
    assert torch.equal(x0_a, x0_c) and torch.equal(t_a, t_c)


@pytest.mark.slow  # ~1 min (three interpreters); the rank-noise law is tested in-process above
def test_two_process_ddp_run_draws_different_noise_per_rank(tiny_args, tmp_path):
    ranks = run_ddp_train(PROJECT, tiny_args, tmp_path / "ddp")  # checks the ranks' noise seeds
    assert [r["global_step"] for r in ranks] == [6, 6]
    assert ranks[0]["noise_seed"] != ranks[1]["noise_seed"]


def test_resuming_continues_exactly(tiny_args, tmp_path):
    check_resume(train, tiny_args, steps=6, root_dir=tmp_path / "resume")  # 3 batches an epoch


def test_test_subcommand_computes_the_claim_metrics_from_a_checkpoint(tiny_args, tmp_path):
    fitted = train([*tiny_args, "--trainer.enable_checkpointing=true"])
    checkpoint = fitted.trainer.checkpoint_callback.best_model_path
    assert checkpoint
    args = [a for a in tiny_args if "checkpointing" not in a]
    stdout = run_train_test(PROJECT, args, checkpoint)
    for metric in ("test/both_modes", "test/valid_rate", "test/accuracy", "test/violation"):
        assert metric in stdout


def test_model_rejects_mismatched_and_bad_inputs():
    model = PermutationModel(task="slap", n=5, width=16)
    batch = {
        "condition": torch.rand(2, 6, 6),
        "optima": torch.zeros(2, 2, 6, dtype=torch.long),
        "num_valid": torch.ones(2, dtype=torch.long),
    }
    with pytest.raises(ValueError, match="n=6 items but model.n=5"):
        model.training_loss(batch)
    batch["condition"] = torch.rand(2, 5, 6)
    with pytest.raises(ValueError, match="square"):
        model.training_loss(batch)
    batch["condition"] = torch.full((2, 5, 5), float("nan"))
    with pytest.raises(ValueError, match="NaN"):
        model.training_loss(batch)


@pytest.mark.parametrize(
    ("flag", "expected"),
    [
        ("--data.task=nosuch", "'sorting', 'slap'"),  # a wrong choice: the choices are listed
        ("--data.image_source=mnist_idx", "'mnist_5k', 'idx'"),
        ("--model.sampler=rk4", "'euler', 'heun'"),
        ("--data.n=0", "v>=3"),  # out of range
        ("--model.sigma=-1", "model.sigma"),
        ("--data.ambiguous_fraction=1.5", "data.ambiguous_fraction"),
        ("--data.n=10", "use n <= 9"),  # a combination: blends need a free digit
        ("--model.heads=3", "multiple of model.heads=3"),  # width 16 in tiny_args
    ],
)
def test_bad_values_exit_2_with_one_paragraph(tiny_args, capsys, flag, expected):
    assert expected in user_error_message(train, [*tiny_args, flag], capsys)


def test_bad_slap_files_exit_2_with_one_paragraph(tiny_args, tmp_path, capsys):
    slap = [*tiny_args, f"--config={PROJECT / 'configs/slap.yaml'}"]
    missing = user_error_message(train, [*slap, f"--data.slap_file={tmp_path / 'no.npz'}"], capsys)
    assert "does not exist" in missing
    wrong_n = tmp_path / "slap6.npz"
    save_slap(wrong_n, generate_slap(20, 6, seed=0))
    assert "set --data.n" in user_error_message(
        train, [*slap, f"--data.slap_file={wrong_n}"], capsys
    )
    no_optima = tmp_path / "costs_only.npz"
    np.savez(no_optima, C=np.zeros((4, 8, 8), np.float32))
    assert "lacks arrays ['optima']" in user_error_message(
        train, [*slap, f"--data.slap_file={no_optima}"], capsys
    )


def test_missing_mnist_root_exits_2_with_a_message(tiny_args, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("PAPERS_DATA_ROOT", raising=False)
    with pytest.raises(SystemExit) as info:
        train([*tiny_args, "--data.image_source=idx", f"--data.root={tmp_path / 'missing'}"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "mnist" in err and "Traceback" not in err
