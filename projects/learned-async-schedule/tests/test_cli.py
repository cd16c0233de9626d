import json
from pathlib import Path

import pytest
import torch

from async_schedule.cli import run_claim_experiment, summarise, train
from papers_cli.testing import run_ddp_train, user_error_message
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


def test_probe_freezes_the_window_average_and_resets_the_model(tiny_args):
    cli = train([*tiny_args, "--trainer.limit_val_batches=0"])
    model = cli.model
    assert not model.probing and not any(p.requires_grad for p in model.schedule.parameters())
    report = model.probe_report
    assert report["probe_steps"] == 3 and 1 <= report["window_length"] <= 3
    probe_mean = torch.stack(model.probe_curves[report["window_start"] :]).mean(0)
    with torch.no_grad():
        frozen = model.schedule(torch.linspace(0, 1, 101, dtype=torch.float64))
    assert torch.allclose(frozen, probe_mean, atol=1e-6)  # f* = the window's mean curve
    assert cli.trainer.global_step == 6 and model.main_stage_step == 3
    # the speed penalty's gradient always points away from lag (it is zero only at the identity)
    gradients = report["gradients"]
    assert set(gradients) == {"lead", "lag", "speed"} and len(model.probe_gradients) == 3
    assert gradients["speed"]["more_lag_derivative_mean"] > 0


def test_steps_to_sync_final_uses_the_seed_mean_curves():
    """One synchronous seed ends above the two-seed mean: the synchronous baseline still reaches
    its own mean final FD-digit (at its last step), and LAS's probe steps are added."""
    curve = lambda *fd: [
        {"step": s, "fd_digit": v, "precision": 0.5, "recall": 0.5}
        for s, v in zip((10, 20), fd, strict=True)
    ]
    histories = {
        "synchronous": {0: curve(9.0, 5.0), 1: curve(8.0, 7.0)},  # target: mean final 6.0
        "learned (LAS)": {0: curve(6.5, 5.0), 1: curve(5.0, 5.0)},  # mean curve 5.75, 5.0
        "power (best of grid)": {0: curve(9.0, 8.0), 1: curve(9.0, 6.5)},  # never reaches 6.0
    }
    seconds = {m: [1.0] for m in histories}
    metrics, _ = summarise(histories, seconds, [10, 20], probe_steps=3)
    assert metrics["synchronous"]["steps_to_sync_final"] == 20
    assert metrics["learned (LAS)"]["steps_to_sync_final"] == 10 + 3
    assert metrics["power (best of grid)"]["steps_to_sync_final"] == float("inf")


def test_same_seed_same_metrics(tiny_args):
    first = train([*tiny_args, "--seed_everything=3"]).trainer.callback_metrics["val/loss"]
    again = train([*tiny_args, "--seed_everything=3"]).trainer.callback_metrics["val/loss"]
    other = train([*tiny_args, "--seed_everything=4"]).trainer.callback_metrics["val/loss"]
    assert first.item() == again.item() and first.item() != other.item()


@pytest.mark.parametrize("config", ["synchronous.yaml", "sfd.yaml", "class_conditional.yaml"])
def test_baselines_and_conditional_config_train_and_sample(tiny_args, config):
    cli = train(
        [*tiny_args, f"--config={PROJECT / 'configs' / config}", "--trainer.limit_val_batches=0"]
    )
    labels = torch.arange(4) if cli.model.hparams.num_classes else None
    lead, lag = cli.model.generate(
        4, steps=3, generator=torch.Generator().manual_seed(0), labels=labels
    )
    assert lead.shape == (4, 4, 4, 4) and lag.shape == (4, 1, 16, 16) and torch.isfinite(lag).all()


def test_autoguidance_uses_the_weaker_guide(tiny_args):
    model = train([*tiny_args, "--trainer.limit_val_batches=0"]).model
    generator = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    plain = model.generate(4, 3, generator())
    guided = model.generate(4, 3, generator(), guidance_scale=2.0, guide=model.network)
    self_guided = model.generate(4, 3, generator(), guidance_scale=2.0, guide=model.ema.module)
    assert torch.allclose(plain[1], self_guided[1], atol=1e-5)  # guide == model: no change
    assert not torch.allclose(plain[1], guided[1])


def test_two_process_ddp_run_matches_single_process(tiny_args, tmp_path):
    # probe_steps above max_steps: plain DDP (the helper's strategy) during the probe; the
    # frozen main stage needs ddp_find_unused_parameters_true, as configs/paper.yaml sets.
    args = [*tiny_args, "--model.probe_steps=100"]
    single = tmp_path / "single"
    train([*args, f"--trainer.default_root_dir={single}"])
    reference = json.loads((single / "summary_rank0.json").read_text())
    ranks = run_ddp_train(PROJECT, args, tmp_path / "ddp", reference=reference)
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


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--model.schedule=cosine"], "'learned', 'frozen', 'synchronous', 'power', 'sfd'"),
        (["--model.ode_method=rk4"], "'euler', 'heun'"),  # a wrong choice lists the choices
        (["--model.sfd_delta=1.5"], "model.sfd_delta"),  # out of range
        (["--model.power_exponent=0.5"], "v>=1"),
        (["--model.schedule=frozen"], "needs --model.frozen_slopes"),  # combinations
        (["--model.width=30"], "multiple of 4"),
        (["--model.lag_size=32"], "a multiple of the token grid"),
        (["--model.lead_channels=8"], "set --model.lead_channels=4"),  # the data disagree
    ],
)
def test_bad_values_exit_2_with_one_paragraph(tiny_args, capsys, flags, expected):
    assert expected in user_error_message(train, [*tiny_args, *flags], capsys)


def test_reproduce_quick_writes_the_results_record(tmp_path):
    metrics = run_claim_experiment(["--quick", "--out", str(tmp_path)])
    record = load_results(tmp_path / "claim.json")
    assert (
        record["project"] == "learned-async-schedule" and record["metrics"].keys() == metrics.keys()
    )
    assert set(metrics) == {
        "synchronous",
        "sfd (best of grid)",
        "power (best of grid)",
        "learned (LAS)",
        "LAS ablation, beta=0",
    }
    assert set(record["extra"]["grids_first_seed"]["sfd (best of grid)"]) == {"0.15", "0.3", "0.5"}
    assert metrics["synchronous"]["steps_to_sync_final"] <= record["config"]["main_steps"]
    assert 0 < record["extra"]["probe_share_of_steps"] < 1
    for name in ("claim.md", "learned_schedule.png", "quality_vs_steps.png"):
        assert (tmp_path / name).is_file()
