import json
from pathlib import Path

import pytest
import torch

from papers_cli.testing import check_resume, run_ddp_train, run_train_test, user_error_message
from papers_eval import load_claim
from seqrejectron.claim import run_claim_experiment
from seqrejectron.cli import train

PROJECT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((PROJECT / "configs").glob("*.yaml"))


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


def test_a_validator_round_raises_test_disagreement_and_keeps_train_agreement(search_args):
    """Through the LightningModule: after BC, one round of Eq. 6 from pi-hat's weights (which
    disagree nowhere) cuts test prefixes while agreeing with the expert on train states."""
    args = [*search_args, "--model.validator_steps=80", "--trainer.max_steps=200"]
    cli = train(args)
    metrics = cli.trainer.callback_metrics
    assert metrics["round/cut"].item() > 0.1
    assert metrics["round/train_disagreement"].item() <= 0.025
    model = cli.model
    assert int(model.n_validators) == 1 and (model.taus < 10**9).any()


def test_resuming_mid_loop_continues_exactly(tiny_args, tmp_path):
    # BC for 4 steps, then a round of 6 (steps 4-9, scored at step 9), 5 batches an epoch: the
    # checkpoint at step 5 is 1 step into the round, and the round's end closes an epoch, so
    # the resumed half logs the round's score and a validation
    args = [*tiny_args, "--model.bc_steps=4", "--model.validator_steps=6"]
    check_resume(train, args, steps=10, root_dir=tmp_path / "resume")


def test_a_run_resumed_after_the_search_ended_stops_at_once(tiny_args, tmp_path):
    """A checkpoint written after the search ended resumes into no step at all: the same global
    step and parameters, however many steps are left (before, the resumed run counted one more
    step than the run that went straight through)."""
    args = [*tiny_args, "--model.bc_steps=4", "--model.validator_steps=4"]
    common = ["--trainer.max_epochs=-1", "--trainer.enable_checkpointing=true"]
    ended = train(
        ["fit", *args, *common, "--trainer.max_steps=40", f"--trainer.default_root_dir={tmp_path}"]
    )
    assert bool(ended.model.done) and ended.trainer.global_step < 40
    path = ended.trainer.checkpoint_callback.best_model_path
    resumed = train(
        [
            "fit",
            *args,
            *common,
            "--trainer.max_steps=80",
            f"--trainer.default_root_dir={tmp_path / 'resumed'}",
            f"--ckpt_path={path}",
        ]
    )
    assert resumed.trainer.global_step == ended.trainer.global_step
    for name, value in ended.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[name]), name


def test_test_subcommand_rolls_out_the_selective_policy(tiny_args, tmp_path):
    fitted = train([*tiny_args, "--trainer.enable_checkpointing=true"])
    checkpoint = fitted.trainer.checkpoint_callback.best_model_path
    args = [a for a in tiny_args if "checkpointing" not in a]
    stdout = run_train_test(PROJECT, args, checkpoint)
    for name in ("test/train_stop", "test/test_cost", "test/test_executed", "test/bc_test_cost"):
        assert name in stdout


@pytest.mark.slow  # 2-3 minutes on 2 cores (two gloo processes): over the fast lane's budget
def test_two_process_ddp_run_matches_single_process(tiny_args, tmp_path):
    single = tmp_path / "single"
    train([*tiny_args, f"--trainer.default_root_dir={single}"])
    reference = json.loads((single / "summary_rank0.json").read_text())
    ranks = run_ddp_train(PROJECT, tiny_args, tmp_path / "ddp", reference=reference)
    assert len(ranks) == 2


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--model.epsilon=0", "epsilon"),  # outside (0, 1)
        ("--model.epsilon=1.5", "epsilon"),
        ("--data.horizon=50", "horizon"),  # no such environment
        ("--data.shift=earthquake", "shift"),  # unknown test dynamics
        ("--data.in_features=58", "in_features"),  # the one-hot position encoding before issue 59
        ("--model.no_such_option=1", "no_such_option"),
    ],
)
def test_bad_values_exit_2_with_one_paragraph(tiny_args, flag, message, capsys):
    assert message in user_error_message(train, [*tiny_args, flag], capsys)


def test_reproduce_quick_writes_a_judged_record(tmp_path):
    outcome = run_claim_experiment(["--quick", "--out", str(tmp_path)])
    record = load_claim(tmp_path / "claim.json")
    assert record["project"] == "seqrejectron" and record["quick"]
    assert record["verdict"] == outcome["verdict"]
    assert {c["role"] for c in record["controls"]} == {"negative", "positive"}
    metrics = record["metrics"]
    assert metrics["bc"]["train_stop"]["mean"] == 0  # BC never stops
    assert metrics["oracle_stop"]["test_cost"]["mean"] == 0  # the oracle stops before any cost
    # environment (B) runs in the same record: BC never stops there, the oracle pays nothing,
    # the exact search (tables over (A)'s states) is not run on (B)
    assert metrics["bc"]["b_train_stop"]["mean"] == 0
    assert metrics["oracle_stop"]["b_test_cost"]["mean"] == 0
    assert metrics["seqrejectron_exact"]["b_test_cost"]["mean"] is None
    assert "b_shift_matters" in {p["name"] for p in record["preconditions"]}
    assert "b_near_oracle" in record["outcomes"]["seqrejectron"]
    # the stochastic variant is reported on both environments, on sampled rollouts: BC never
    # stops, the oracle stop pays nothing on (A) (the expert never fails there)
    stochastic = record["evidence"]["stochastic"]
    assert set(stochastic) == {"A", "B"}
    for env in stochastic.values():
        assert env["bc_train_stop"]["estimate"] == 0
        assert env["bc_minus_stochastic_test_cost"]["estimate"] == pytest.approx(
            env["bc_test_cost"]["estimate"] - env["stochastic_test_cost"]["estimate"]
        )
    assert stochastic["A"]["oracle_stop_test_cost"]["estimate"] == 0
    assert (tmp_path / "claim.md").is_file()


def test_a_bad_claim_file_stops_before_training(tmp_path, monkeypatch):
    from seqrejectron import claim

    bad = tmp_path / "claim.yaml"
    bad.write_text((PROJECT / "configs" / "claim.yaml").read_text().replace("[0, 1, 2]", "[0]"))
    monkeypatch.setattr(claim, "CLAIM_FILE", bad)
    monkeypatch.setattr(claim, "build_world", lambda *a, **k: pytest.fail("ran before validating"))
    with pytest.raises(ValueError, match="at least 3 seeds"):
        run_claim_experiment(["--out", str(tmp_path / "out")])
