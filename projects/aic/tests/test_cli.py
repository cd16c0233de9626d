import json
from pathlib import Path

import pytest

from aic.cli import run_claim_experiment, train
from papers_cli.testing import run_ddp_train
from papers_eval import load_results

PROJECT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((PROJECT / "configs").glob("*.yaml"))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_every_config_parses(config, capsys):
    with pytest.raises(SystemExit) as info:
        train(["fit", "--config", str(config), "--print_config"])
    assert info.value.code == 0, capsys.readouterr().err


def test_train_fast_dev_run_through_the_cli(tiny_args):
    cli = train([*tiny_args, "--trainer.fast_dev_run=1"])
    assert cli.trainer.state.finished and cli.trainer.global_step == 1


def test_same_seed_same_metrics(tiny_args):
    first = train([*tiny_args, "--seed_everything=3"]).trainer.callback_metrics["val/mse"]
    again = train([*tiny_args, "--seed_everything=3"]).trainer.callback_metrics["val/mse"]
    assert first.item() == again.item()


def test_short_run_lowers_the_loss(tiny_args):
    untrained = train(["validate", *tiny_args])
    trained = train([*tiny_args, "--trainer.max_epochs=10", "--data.batch_size=16"])
    before = untrained.trainer.callback_metrics["val/mse"].item()
    assert trained.trainer.callback_metrics["val/mse"].item() < 0.5 * before


def test_two_process_ddp_run_matches_single_process(tiny_args, tmp_path):
    single = tmp_path / "single"
    train([*tiny_args, f"--trainer.default_root_dir={single}"])
    reference = json.loads((single / "summary_rank0.json").read_text())
    ranks = run_ddp_train(PROJECT, tiny_args, tmp_path / "ddp", reference=reference)
    assert len(ranks) == 2


def test_bad_inputs_exit_2_with_a_message(tiny_args, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        train([*tiny_args, "--model.no_such_option=1"])
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:
        train([*tiny_args, f"--data.root={tmp_path / 'missing'}"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "no_such_option" in err and "not found" in err and "Traceback" not in err


def test_reproduce_quick_writes_the_results_record(tmp_path):
    metrics = run_claim_experiment(["--quick", "--out", str(tmp_path)])
    record = load_results(tmp_path / "claim.json")
    assert record["project"] == "aic" and record["metrics"].keys() == metrics.keys()
    assert (tmp_path / "claim.md").is_file()
