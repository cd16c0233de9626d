import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tcwm.claim import run_claim_experiment
from tcwm.cli import train
from papers_cli.testing import check_resume, run_ddp_train, user_error_message
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


def test_same_seed_same_metrics(tiny_args):
    """Same call, same seed and shapes, same machine and thread count: bitwise determinism. Runs
    that differ in batch size, thread or worker count, process count (DDP) or device are compared
    within a stated tolerance instead; across machines a result agrees within its claim's
    interval, not bit for bit."""
    first = train([*tiny_args, "--seed_everything=3"]).trainer.callback_metrics["val/mse"]
    again = train([*tiny_args, "--seed_everything=3"]).trainer.callback_metrics["val/mse"]
    assert first.item() == again.item()


def test_the_run_seed_also_seeds_the_data(tiny_args):
    first = train([*tiny_args, "--seed_everything=3", "--trainer.max_steps=0"]).datamodule
    other = train([*tiny_args, "--seed_everything=4", "--trainer.max_steps=0"]).datamodule
    assert not np.array_equal(first.true_weights, other.true_weights)


def test_short_run_lowers_the_loss(tiny_args):
    untrained = train(["validate", *tiny_args])
    trained = train([*tiny_args, "--trainer.max_epochs=10"])
    before = untrained.trainer.callback_metrics["val/mse"].item()
    assert trained.trainer.callback_metrics["val/mse"].item() < 0.5 * before


def test_resuming_continues_exactly(tiny_args, tmp_path):
    # 8 steps straight vs 4 + checkpoint + resume + 4: the same batches, shapes and thread count
    # in one process, so exact agreement is expected; check_resume's rtol 1e-5 / atol 1e-6 sits
    # far below what a state left out of the checkpoint changes.
    check_resume(train, tiny_args, steps=8, root_dir=tmp_path / "resume")  # 4 batches an epoch


def test_test_subcommand_evaluates_a_checkpoint_through_the_dispatcher(tiny_args, tmp_path):
    fitted = train([*tiny_args, "--trainer.enable_checkpointing=true"])
    checkpoint = fitted.trainer.checkpoint_callback.best_model_path
    args = [a for a in tiny_args if "checkpointing" not in a]
    result = subprocess.run(
        [str(TRAIN), "test", *args, f"--ckpt_path={checkpoint}"],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "test/mse" in result.stdout


# The shared DDP check (papers_cli.testing.run_ddp_train: two gloo processes through the real CLI)
# runs in the slow lane: about two minutes on two CPU cores, over the fast lane's budget.
@pytest.mark.slow
def test_two_process_ddp_run_matches_single_process(tiny_args, tmp_path):
    single = tmp_path / "single"
    train([*tiny_args, f"--trainer.default_root_dir={single}"])
    reference = json.loads((single / "summary_rank0.json").read_text())
    # Shapes and metric names only: DDP all-reduces gradients in another order than one process
    # sums them, so a value compared with the single run needs a stated tolerance.
    ranks = run_ddp_train(PROJECT, tiny_args, tmp_path / "ddp", reference=reference)
    assert len(ranks) == 2  # each rank drew its own noise (checked by run_ddp_train)


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--model.activation=swish", "activation"),  # a choice that does not exist
        ("--model.lr=-0.1", "lr"),  # out of range
        ("--data.n_train=0", "n_train"),  # out of range
        ("--model.no_such_option=1", "no_such_option"),  # unknown key
    ],
)
def test_bad_values_exit_2_with_one_paragraph(tiny_args, flag, message, capsys):
    assert message in user_error_message(train, [*tiny_args, flag], capsys)


def test_data_that_contradict_the_config_exit_2(tiny_args, tmp_path, capsys):
    np.savez(tmp_path / "data.npz", x=np.zeros((200, 3)), y=np.zeros(200))
    # a bad combination: 3 features in the data, 8 in the config
    message = user_error_message(train, [*tiny_args, f"--data.root={tmp_path}"], capsys)
    assert "in_features" in message
    too_big = [*tiny_args, f"--data.root={tmp_path}", "--data.in_features=3", "--data.n_train=190"]
    assert "fewer than" in user_error_message(train, too_big, capsys)
    missing = [*tiny_args, f"--data.root={tmp_path / 'missing'}"]
    assert "data.npz" in user_error_message(train, missing, capsys)


def test_reproduce_quick_writes_a_judged_record_and_replicates(tmp_path):
    outcome = run_claim_experiment(["--quick", "--replicate", "--out", str(tmp_path)])
    record = load_claim(tmp_path / "claim.json", require_v3=True)
    assert record["project"] == "tc-wm" and record["quick"] and record["protocol"] == 3
    assert record["verdict"] == outcome["verdict"]
    assert {c["role"] for c in record["controls"]} == {"negative", "positive"}
    assert {c["kind"] for c in record["controls"]} == {"negative", "oracle"}
    assert set(record["metrics"]) == {"mlp", "mean_predictor", "untrained", "true_weights"}
    assert record["replication"]["run"] and record["replication"]["seeds"] == [10]
    assert record["jobs"]["jobs"] >= 8  # every fit went through the shared job runner
    assert (tmp_path / "claim.md").is_file()


def test_the_oracle_is_the_generating_map_inside_the_module(tiny_args):
    """The positive control runs the method's own network and forward, with the true weights."""
    from tcwm.claim import load_true_weights

    cli = train([*tiny_args, "--model.activation=relu", "--trainer.max_steps=0"])
    data = cli.datamodule
    oracle = load_true_weights(cli.model, data.true_weights)
    x, y = data.test_set.tensors
    with torch.no_grad():
        # float32 matmul through two layers vs one product: the same sum up to rounding
        torch.testing.assert_close(oracle(x), x @ torch.from_numpy(data.true_weights))
    assert float(((oracle(x) - y) ** 2).mean()) < 2 * data.hparams.noise**2


def test_a_bad_claim_file_stops_before_training(tmp_path, monkeypatch):
    from tcwm import claim

    bad = tmp_path / "claim.yaml"
    bad.write_text((PROJECT / "configs" / "claim.yaml").read_text().replace("[0, 1, 2]", "[0]"))
    monkeypatch.setattr(claim, "CLAIM_FILE", bad)
    monkeypatch.setattr(claim, "fit", lambda *a, **k: pytest.fail("trained before validating"))
    with pytest.raises(ValueError, match="at least 3 seeds"):
        run_claim_experiment(["--out", str(tmp_path / "out")])
