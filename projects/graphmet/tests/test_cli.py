import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from graphmet.cli import run_claim_experiment, train
from papers_eval import load_results

PROJECT = Path(__file__).resolve().parents[1]
TRAIN = Path(sys.executable).with_name("train")
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
    ddp = tmp_path / "ddp"
    result = subprocess.run(
        [
            str(TRAIN),
            *tiny_args,
            f"--trainer.default_root_dir={ddp}",
            "--trainer.devices=2",
            "--trainer.strategy=ddp",
        ],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PL_DISABLE_FORK": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((ddp / f"summary_rank{r}.json").read_text()) for r in (0, 1)]
    reference = json.loads((single / "summary_rank0.json").read_text())
    assert [r["world_size"] for r in ranks] == [2, 2]
    for summary in ranks:
        assert summary["strategy"] == "DDPStrategy"
        assert summary["parameter_shapes"] == reference["parameter_shapes"]
        assert summary["metrics"].keys() == reference["metrics"].keys()


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
    assert record["project"] == "graphmet" and record["metrics"].keys() == metrics.keys()
    assert (tmp_path / "claim.md").is_file()
