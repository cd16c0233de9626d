import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ibci_fewshot.claim import SUBJECTS, drift_trend, run_claim_experiment
from ibci_fewshot.cli import train
from papers_cli.testing import check_resume, check_summaries, run_train_test, user_error_message
from papers_eval import load_claim

PROJECT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((PROJECT / "configs").glob("*.yaml"))
TRAIN = Path(sys.executable).with_name("train")  # the workspace dispatcher a user runs


@pytest.mark.parametrize(
    "config", [c for c in CONFIGS if c.name != "claim.yaml"], ids=lambda p: p.name
)
def test_every_config_parses(config, capsys):
    with pytest.raises(SystemExit) as info:
        train(["fit", "--config", str(config), "--print_config"])
    assert info.value.code == 0, capsys.readouterr().err


def test_train_fast_dev_run_through_the_cli(tiny_args):
    cli = train([*tiny_args, "--trainer.fast_dev_run=1"])
    assert cli.trainer.state.finished and cli.trainer.global_step == 1


def test_stage_two_leaves_the_backbone_untouched_and_moves_the_meta_state(tiny_args):
    """Through the LightningModule: with stage1_steps=0 every step is a meta step."""
    initial = train([*tiny_args, "--trainer.max_steps=0"]).model
    meta = train([*tiny_args, "--model.stage1_steps=0", "--trainer.max_steps=2"]).model
    for name, value in initial.decoder.state_dict().items():
        torch.testing.assert_close(meta.decoder.state_dict()[name], value)
    moved = sum((meta.phi0[k] - initial.phi0[k]).abs().sum() for k in initial.phi0)
    assert moved > 0
    assert any(not torch.equal(meta.log_step[k], initial.log_step[k]) for k in initial.log_step)
    assert meta.log_step["weight"].shape == (192, 1)  # default.yaml: one step size per row of W


def test_second_order_meta_learning_of_the_diagonal_low_rank_form(tiny_args):
    """The other alignment form and the second-order path (pure CTC) through the module."""
    args = [*tiny_args, "--model.alignment=diag_lowrank", "--model.meta_order=second"]
    initial = train([*args, "--trainer.max_steps=0"]).model
    meta = train([*args, "--model.stage1_steps=0", "--trainer.max_steps=1"]).model
    assert set(meta.phi0) == {"gain", "u", "v", "bias"}
    torch.testing.assert_close(meta.decoder.readout.weight, initial.decoder.readout.weight)
    assert (meta.phi0["u"] - initial.phi0["u"]).abs().sum() > 0
    assert not torch.equal(meta.log_step["u"], initial.log_step["u"])


def test_stage_one_trains_the_backbone_and_not_the_meta_state(tiny_args):
    initial = train([*tiny_args, "--trainer.max_steps=0"]).model
    stage1 = train([*tiny_args, "--model.stage1_steps=5", "--trainer.max_steps=2"]).model
    assert not torch.equal(stage1.decoder.readout.weight, initial.decoder.readout.weight)
    for k in initial.phi0:
        torch.testing.assert_close(stage1.phi0[k], initial.phi0[k])


def test_short_stage_one_lowers_the_training_loss(tiny_args):
    first = train([*tiny_args, "--model.stage1_steps=40", "--trainer.max_steps=1"])
    later = train([*tiny_args, "--model.stage1_steps=40", "--trainer.max_steps=30"])
    assert (
        later.trainer.callback_metrics["train/ctc"]
        < 0.8 * first.trainer.callback_metrics["train/ctc"]
    )


def test_resuming_continues_exactly_across_the_stage_switch(tiny_args, tmp_path):
    """2 batches an epoch; the checkpoint at step 2 ends stage 1, stage 2 runs after it, so the
    meta-learned state must come back from the checkpoint."""
    check_resume(train, tiny_args, steps=4, root_dir=tmp_path / "resume")
    checkpoint = next((tmp_path / "resume" / "half").rglob("*.ckpt"))
    state = torch.load(checkpoint, weights_only=True)["state_dict"]
    assert any(k.startswith("phi0.") for k in state) and any(
        k.startswith("log_step.") for k in state
    )


def test_test_subcommand_adapts_and_scores_held_out_sessions_from_a_checkpoint(tiny_args):
    fitted = train([*tiny_args, "--trainer.enable_checkpointing=true"])
    checkpoint = fitted.trainer.checkpoint_callback.last_model_path or (
        fitted.trainer.checkpoint_callback.best_model_path
    )
    args = [a for a in tiny_args if "checkpointing" not in a and "max_steps" not in a]
    stdout = run_train_test(PROJECT, args, checkpoint)
    assert "test/wer" in stdout and "test/cer" in stdout


def test_two_process_ddp_run_shards_episodes_and_seeds_ranks_apart(tiny_args, tmp_path):
    """A 2-process CPU DDP job (gloo) with paper.yaml's strategy: stage 1 leaves phi_0 unused and
    stage 2 the backbone, which plain ``ddp`` does not allow. Every noise source of
    the training step is switched off (augmentation, episode drift, dropout), so the ranks'
    losses can differ only through the episodes they read: EpochShuffle must shard them. The
    ranks' noise seeds (SeedEveryStep) must differ too (``check_summaries``)."""
    root = tmp_path / "ddp"
    silent = [
        "--model.white_noise=0",
        "--model.offset_sd=0",
        "--model.gain_sd=0",
        "--model.episode_gain_sd=0",
        "--model.episode_offset_sd=0",
        "--model.episode_mix_sd=0",
        "--model.dropout=0",
    ]
    # run_ddp_train pins --trainer.strategy=ddp (no unused parameters allowed)
    result = subprocess.run(
        [
            str(TRAIN),
            *tiny_args,
            *silent,
            "--data.episodes_per_epoch=8",  # 4 episodes a rank, 2 batches an epoch
            "--trainer.limit_val_batches=0",  # validation is not what this checks
            f"--trainer.default_root_dir={root}",
            "--trainer.devices=2",
            "--trainer.strategy=ddp_find_unused_parameters_true",
        ],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PL_DISABLE_FORK": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((root / f"summary_rank{r}.json").read_text()) for r in (0, 1)]
    check_summaries(ranks, devices=2)  # DDPStrategy x2 on both, noise seeds differ
    assert [r["global_step"] for r in ranks] == [4, 4]  # 2 stage-1 + 2 stage-2 steps each
    first, second = (r["metrics"] for r in ranks)
    for key in ("train/ctc", "train/meta_query_ctc"):  # rank-local (not synced) values
        assert abs(first[key] - second[key]) > 1e-4, (key, first[key], second[key])


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--model.alignment=full", "alignment"),  # a choice that does not exist
        ("--model.meta_order=third", "meta_order"),
        ("--model.inner_lr=-0.1", "inner_lr"),  # out of range
        ("--model.no_such_option=1", "no_such_option"),  # unknown key
    ],
)
def test_bad_values_exit_2_with_one_paragraph(tiny_args, flag, message, capsys):
    assert message in user_error_message(train, [*tiny_args, flag], capsys)


def test_bad_data_settings_exit_2(tiny_args, tmp_path, capsys):
    assert "zero calibration" in user_error_message(
        train, [*tiny_args, "--data.n_calibration=0"], capsys
    )
    missing = user_error_message(train, [*tiny_args, f"--data.root={tmp_path / 'missing'}"], capsys)
    assert "DANDI" in missing


def test_reproduce_quick_writes_a_judged_record(tmp_path):
    outcome = run_claim_experiment(["--quick", "--out", str(tmp_path)])
    record = load_claim(tmp_path / "claim.json")
    assert record["project"] == "ibci-fewshot" and record["quick"]
    assert record["verdict"] == outcome["verdict"]
    assert {c["role"] for c in record["controls"]} == {"negative", "positive"}
    assert set(record["metrics"]) == set(SUBJECTS)
    preconditions = {p["name"]: p for p in record["preconditions"]}
    assert set(preconditions) == {
        "drift_hurts",
        "latest_session_is_worse",
        "oracle_decodes_well",
        "start_no_worse_than_identity",
    }
    assert preconditions["start_no_worse_than_identity"]["rule"] == "interval"
    oracle = preconditions["oracle_decodes_well"]
    assert oracle["rule"] == "estimate"  # the registered point rule
    mean_wer = float(
        np.mean([np.mean(v) for v in outcome["results"]["many_sentence_finetune"]["test_wer"]])
    )
    assert oracle["advantage"]["estimate"] == pytest.approx(0.3 - mean_wer)
    assert oracle["passed"] == (mean_wer < 0.3)
    if not all(p["passed"] for p in preconditions.values()):
        assert record["verdict"] == "not shown"
    assert (tmp_path / "claim.md").is_file() and (tmp_path / "claim.png").is_file()


def test_drift_trend_is_the_slope_over_days_and_the_latest_minus_the_earliest():
    slope, last_minus_first = drift_trend([(30, 0.2), (60, 0.5), (90, 0.5), (30, 0.4)])
    # days 30, 60, 90, 30 with WER 0.2, 0.5, 0.5, 0.4: mean day 52.5, mean WER 0.4;
    # slope = sum((d - 52.5)(w - 0.4)) / sum((d - 52.5)^2) = 9 / 2475
    assert slope == pytest.approx(9 / 2475)
    assert last_minus_first == pytest.approx(0.5 - 0.3)


def test_a_bad_claim_file_stops_before_training(tmp_path, monkeypatch):
    from ibci_fewshot import claim

    bad = tmp_path / "claim.yaml"
    bad.write_text((PROJECT / "configs" / "claim.yaml").read_text().replace("[0, 1, 2]", "[0]"))
    monkeypatch.setattr(claim, "CLAIM_FILE", bad)
    monkeypatch.setattr(claim, "fit", lambda *a, **k: pytest.fail("trained before validating"))
    with pytest.raises(ValueError, match="at least 3 seeds"):
        run_claim_experiment(["--out", str(tmp_path / "out")])
