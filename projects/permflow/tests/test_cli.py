"""The real entry points: config parsing, training through LightningCLI, DDP, reproduce."""

from pathlib import Path

import pytest
import torch

from papers_cli.testing import run_ddp_train, user_error_message
from papers_eval import load_results
from permflow.cli import run_claim_experiment, train
from permflow.model import PermutationModel

PROJECT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((PROJECT / "configs").glob("*.yaml"))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_every_config_parses(config, capsys):
    with pytest.raises(SystemExit) as info:
        train(["fit", "--config", str(config), "--print_config"])
    assert info.value.code == 0, capsys.readouterr().err


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
    for key in ("train/loss", "val/valid_rate", "val/unambiguous_accuracy"):
        assert first[key].item() == again[key].item()


def test_short_run_lowers_the_loss():
    torch.manual_seed(0)
    from permflow.data import PermutationDataModule

    data = PermutationDataModule(task="slap", n=5, num_train=64, num_val=8, num_test=8)
    data.setup()
    model = PermutationModel(task="slap", n=5, width=16)
    batch = next(iter(data.train_dataloader()))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    torch.manual_seed(1)
    before = sum(model.training_loss(batch).item() for _ in range(8)) / 8
    for _ in range(60):
        optimizer.zero_grad()
        model.training_loss(batch).backward()
        optimizer.step()
    torch.manual_seed(1)
    after = sum(model.training_loss(batch).item() for _ in range(8)) / 8
    assert after < 0.7 * before


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


def test_missing_mnist_root_exits_2_with_a_message(tiny_args, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("PAPERS_DATA_ROOT", raising=False)
    with pytest.raises(SystemExit) as info:
        train([*tiny_args, "--data.image_source=idx", f"--data.root={tmp_path / 'missing'}"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "mnist" in err and "Traceback" not in err


def test_two_process_ddp_run_finishes_on_both_ranks(tiny_args, tmp_path):
    ranks = run_ddp_train(PROJECT, tiny_args, tmp_path / "ddp")
    assert [r["global_step"] for r in ranks] == [6, 6]


def test_reproduce_quick_writes_the_results_record(tmp_path):
    metrics = run_claim_experiment(["--quick", "--out", str(tmp_path)])
    record = load_results(tmp_path / "claim.json")
    assert record["project"] == "permflow" and record["metrics"].keys() == metrics.keys()
    assert {"sorting: permflow", "slap: sinkhorn", "sorting: gumbel_sinkhorn (noisy)"} <= set(
        metrics
    )
    assert metrics["sorting: permflow"]["violation"] < 1e-4
    for name in (
        "claim.md",
        "ambiguous_orders.png",
        "both_modes_vs_samples_slap.png",
        "steps_ablation_sorting.png",
    ):
        assert (tmp_path / name).is_file()
