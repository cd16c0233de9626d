import json
from pathlib import Path

import pytest

from aic.cli import run_claim_experiment, train
from papers_cli.testing import run_ddp_train, user_error_message
from papers_eval import load_results

PROJECT = Path(__file__).resolve().parents[1]
CLI_CONFIGS = [PROJECT / "configs" / name for name in ("default.yaml", "paper.yaml")]


@pytest.mark.parametrize("config", CLI_CONFIGS, ids=lambda p: p.name)
def test_every_config_parses(config, capsys):
    with pytest.raises(SystemExit) as info:
        train(["fit", "--config", str(config), "--print_config"])
    assert info.value.code == 0, capsys.readouterr().err


def test_train_fast_dev_run_through_the_cli(tiny_args):
    cli = train([*tiny_args, "--trainer.fast_dev_run=1"])
    assert cli.trainer.state.finished and cli.trainer.global_step == 1


@pytest.mark.parametrize(
    "flags",
    [
        ["--data.task=point-maze-umaze", "--model.architecture=gru"],
        ["--data.task=program-lm", "--model.architecture=transformer", "--data.context=8"],
    ],
    ids=["robotics-gru", "language-transformer"],
)
def test_fast_dev_run_on_other_domains(tiny_args, flags):
    cli = train([*tiny_args, *flags, "--trainer.fast_dev_run=1"])
    assert cli.trainer.global_step == 1


def test_same_seed_same_metrics(tiny_args):
    first = train([*tiny_args, "--seed_everything=3"]).trainer.callback_metrics
    again = train([*tiny_args, "--seed_everything=3"]).trainer.callback_metrics
    assert first["val/loss"].item() == again["val/loss"].item()
    assert first["val/mean_steps"].item() == again["val/mean_steps"].item()


def test_two_process_ddp_run_matches_single_process(tiny_args, tmp_path):
    single = tmp_path / "single"
    train([*tiny_args, f"--trainer.default_root_dir={single}"])
    reference = json.loads((single / "summary_rank0.json").read_text())
    ranks = run_ddp_train(PROJECT, tiny_args, tmp_path / "ddp", reference=reference)
    assert len(ranks) == 2


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--data.env_id=MiniGrid-NoSuchThing-v0"], "MiniGrid-NoSuchThing-v0"),
        (["--model.architecture=lstm"], "'iru', 'gru', 'transformer', 'resmlp', 'conv'"),
        (["--data.task=sokoban"], "'lava-crossing'"),  # a wrong choice lists the choices
        (["--model.voc_horizon=two_step"], "'one_step', 'cumulative'"),
        (["--model.price_per_step=-0.5"], "model.price_per_step"),  # out of range
        (["--model.k_max=0"], "model.k_max"),
        (["--data.task=point-maze-umaze"], "no spatial input"),  # conv on a state vector
        (["--model.dim=6"], "model.dim=6 must be a multiple of 4"),  # the conv core's groups
        (["--data.task=program-lm", "--data.env_id=Reacher-v5"], "reads text"),
    ],
)
def test_bad_inputs_exit_2_with_one_paragraph(tiny_args, flags, message, capsys):
    assert message in user_error_message(train, [*tiny_args, *flags], capsys)


def test_missing_text_corpus_for_paper_scale_language_is_clear(tiny_args, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        train([*tiny_args, "--data.task=stdlib-lm", f"--data.text_path={tmp_path / 'none'}"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "not found" in err and "txt" in err and "Traceback" not in err


def test_reproduce_quick_writes_the_results_record(tmp_path):
    out = run_claim_experiment(["--quick", "--out", str(tmp_path)])
    record = load_results(tmp_path / "claim.json")
    assert record["project"] == "aic" and isinstance(record["holds"], bool)
    assert len(out["verdicts"]) == 6
    assert (tmp_path / "claim.md").is_file() and (tmp_path / "frontier.png").is_file()
    assert (tmp_path / "removal.png").is_file()
