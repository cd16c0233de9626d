import json
from pathlib import Path

import pytest
import torch

from aic.cli import train
from aic.model import AicModule
from papers_cli.testing import check_resume, run_ddp_train, user_error_message

PROJECT = Path(__file__).resolve().parents[1]
CLI_CONFIGS = [
    PROJECT / "configs" / name for name in ("default.yaml", "paper.yaml", "rl_minigrid.yaml")
]


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
        ["--data.task=program-lm", "--model.architecture=transformer", "--data.context=24"],
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


@pytest.mark.slow  # 80 s of two gloo processes: over the fast lane's 2-minute budget
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
        (
            ["--data.task=point-maze-umaze", "--model.architecture=gru", "--model.mode=a2c"],
            "grid worlds only",
        ),
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


@pytest.mark.parametrize("mode", ["aic", "fixed"])
def test_every_readout_is_supervised_in_aic_mode_and_only_the_last_in_fixed(mode):
    """Deep supervision (Eq. 7) through the LightningModule: the loss reaches every step's
    readout in AIC mode, only the K_max-th in the fixed counterpart."""
    torch.manual_seed(0)
    module = AicModule(task="program-lm", architecture="gru", dim=8, k_max=4, mode=mode)
    kept = {}
    forward = module.policy.forward

    def keep(obs, k_max=None):
        out = forward(obs, k_max)
        out["actions"].retain_grad()
        kept.update(out)
        return out

    module.policy.forward = keep
    obs = torch.randint(0, 20, (16, 32))
    batch = (obs, torch.randint(0, 20, (16,)), torch.zeros(16), torch.zeros(16, 0))
    module.losses(batch)["loss"].backward()
    per_step = kept["actions"].grad.abs().sum((0, 2))  # [K]
    if mode == "aic":
        assert (per_step > 0).all()
    else:
        assert per_step[-1] > 0 and (per_step[:-1] == 0).all()


def test_training_logs_the_exact_and_the_episode_return(tiny_args):
    metrics = train([*tiny_args, "--model.eval_episodes=2"]).trainer.callback_metrics
    assert 0 < metrics["val/return_at_halt"] <= 1.0 + 1e-6  # Q*/V*: a fraction of the optimum
    assert 0 < metrics["val/return_at_k_max"] <= 1.0 + 1e-6
    assert 0 <= metrics["val/episode_return"] <= 1.0  # MiniGrid's episode return
    assert 1 <= metrics["val/episode_mean_steps"] <= 3


def test_rl_config_trains_a2c_through_the_cli(tiny_args):
    config = PROJECT / "configs" / "rl_minigrid.yaml"
    cli = train(["--config", str(config), *tiny_args, "--model.eval_episodes=2"])
    metrics = cli.trainer.callback_metrics
    assert cli.model.hparams.mode == "a2c" and cli.trainer.global_step == 8
    assert "train/actor" in metrics and "val/episode_return" in metrics
    assert "train/episode_return" in metrics  # Empty-6x6 episodes end within 8 x 16 steps
    assert 0 < metrics["val/random_policy_return"] < 1  # the baseline is logged beside it


@pytest.mark.slow  # about 60 s on 2 shared cores: the registered config, 600 A2C updates
def test_rl_config_learns_a_greedy_policy_above_the_random_one(tmp_path):
    """`uv run train --config configs/rl_minigrid.yaml` as registered: after 12 epochs the
    greedy AIC policy's return on Empty-6x6 (the optimum is 0.956) is far above that of the
    uniform random policy on the same episode seeds (about 0.25), and AIC halts within K_max."""
    torch.set_num_threads(1)  # as `uv run train` runs it (aic.cli.main)
    config = PROJECT / "configs" / "rl_minigrid.yaml"
    cli = train(
        [
            "--config",
            str(config),
            "--trainer.logger=false",
            "--trainer.enable_checkpointing=false",
            f"--trainer.default_root_dir={tmp_path}",
        ]
    )
    metrics = cli.trainer.callback_metrics
    greedy, random = metrics["val/episode_return"], metrics["val/random_policy_return"]
    print(f"greedy {float(greedy):.3f} random {float(random):.3f}")
    assert 0.1 < random < 0.5 and greedy > random + 0.4
    assert 1 <= metrics["val/episode_mean_steps"] <= 3


def test_resume_continues_exactly(tiny_args, tmp_path):
    # 128 states / 32 = 4 batches per epoch; a constant learning rate, because OneCycle's
    # horizon is max_steps here, which the half run and the straight run do not share
    check_resume(train, [*tiny_args, "--model.lr_schedule=constant"], 8, tmp_path)


def test_train_then_test_from_the_checkpoint(tiny_args, tmp_path):
    args = [a for a in tiny_args if "checkpointing" not in a]
    fit = train([*args, "--trainer.enable_checkpointing=true"])
    ckpt = (
        fit.trainer.checkpoint_callback.best_model_path
        or fit.trainer.checkpoint_callback.last_model_path
    )
    assert Path(ckpt).is_file()
    tested = train(["test", *[a for a in args if "max_epochs" not in a], f"--ckpt_path={ckpt}"])
    metrics = tested.trainer.callback_metrics
    assert "test/return_at_halt" in metrics and "test/loss" in metrics
    again = fit.trainer.test(fit.model, datamodule=fit.datamodule, verbose=False)[0]
    assert metrics["test/loss"].item() == pytest.approx(again["test/loss"], rel=1e-6)
