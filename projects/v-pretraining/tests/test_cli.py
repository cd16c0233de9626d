"""`train` through the real CLI: configs, the default path, seeds, resume, test, DDP, errors."""

import json
from pathlib import Path

import pytest
import torch

from papers_cli.testing import check_resume, run_ddp_train, run_train_test, user_error_message
from vpretrain.cli import train

PROJECT = Path(__file__).resolve().parents[1]
LANGUAGE_CONFIGS = [
    c
    for c in sorted((PROJECT / "configs").glob("*.yaml"))
    if c.name != "claim.yaml" and not c.name.startswith("vision")
]


@pytest.mark.parametrize("config", LANGUAGE_CONFIGS, ids=lambda p: p.name)
def test_every_config_parses(config, capsys):
    with pytest.raises(SystemExit) as info:
        train(["fit", "--config", str(config), "--print_config"])
    assert info.value.code == 0, capsys.readouterr().err


def test_the_default_arm_trains_designer_and_learner_through_the_cli(tiny_args):
    cli = train(tiny_args)
    metrics = cli.trainer.callback_metrics
    assert cli.trainer.global_step == 4  # learner steps only: the designer's are not counted
    assert cli.model.hparams.arm == "vpretrain"
    for name in ("train/value", "train/mixing", "val/answer_nll", "val/perplexity"):
        assert name in metrics and metrics[name].isfinite(), name
    start = 0.9 * torch.sigmoid(torch.tensor(-3.0)).item()
    assert metrics["train/mixing"].item() != pytest.approx(start, abs=1e-6)  # the designer moved


def test_same_seed_same_metrics(tiny_args):
    first = train([*tiny_args, "--seed_everything=3"]).trainer.callback_metrics
    again = train([*tiny_args, "--seed_everything=3"]).trainer.callback_metrics
    assert first["val/answer_nll"].item() == again["val/answer_nll"].item()
    assert first["train/value"].item() == again["train/value"].item()


def test_a_short_run_lowers_the_held_out_losses(tiny_args):
    args = [*tiny_args, "--model.arm=plain", "--model.lr=0.003"]
    untrained = train(["validate", *args]).trainer.callback_metrics
    trained = train([*args, "--trainer.max_steps=30", "--trainer.val_check_interval=30"])
    after = trained.trainer.callback_metrics
    assert after["val/prose_nll"].item() < untrained["val/prose_nll"].item() - 0.3
    assert after["val/answer_nll"].item() < untrained["val/answer_nll"].item() - 0.3


def test_resuming_continues_exactly(tiny_args, tmp_path):
    # refresh every 3 steps: the resumed half (steps 3-5) starts on the cached g_down
    args = [
        *tiny_args,
        "--model.refresh_every=3",
        "--trainer.val_check_interval=3",
        "--trainer.limit_train_batches=3",
    ]
    check_resume(train, args, steps=6, root_dir=tmp_path / "resume")


def test_train_test_scores_a_checkpoint(tiny_args, tmp_path):
    fitted = train([*tiny_args, "--trainer.enable_checkpointing=true"])
    checkpoint = fitted.trainer.checkpoint_callback.best_model_path
    args = [a for a in tiny_args if "checkpointing" not in a]
    tested = train(["test", *args, f"--ckpt_path={checkpoint}"]).trainer.callback_metrics
    for name in ("test/answer_nll", "test/pass_at_1", "test/perplexity"):
        assert name in tested and tested[name].isfinite(), name
    assert 0 <= tested["test/pass_at_1"].item() <= 1
    # the checkpoint's learner, not a fresh one: its answer NLL equals the fitted model's
    from vpretrain import evaluation

    fitted_nll = evaluation.answer_nll(fitted.model.eval(), fitted.datamodule.test_problems)
    assert tested["test/answer_nll"].item() == pytest.approx(float(fitted_nll.mean()), rel=1e-5)


@pytest.mark.slow  # a subprocess: about 35 s of start-up on 2 cores
def test_train_test_through_the_dispatcher(tiny_args, tmp_path):
    fitted = train([*tiny_args, "--trainer.enable_checkpointing=true"])
    checkpoint = fitted.trainer.checkpoint_callback.best_model_path
    args = [a for a in tiny_args if "checkpointing" not in a]
    out = run_train_test(PROJECT, args, checkpoint)
    for name in ("test/answer_nll", "test/pass_at_1", "test/perplexity"):
        assert name in out, out[-2000:]


@pytest.mark.slow  # about 100 s on 2 busy cores: two processes, each building the miniature
def test_two_process_ddp_run(tiny_args, tmp_path):
    single = tmp_path / "single"
    train([*tiny_args, f"--trainer.default_root_dir={single}"])
    reference = json.loads((single / "summary_rank0.json").read_text())
    ranks = run_ddp_train(PROJECT, tiny_args, tmp_path / "ddp", reference=reference)
    assert len(ranks) == 2


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--model.top_k=5000", "top_k"),  # K beyond the vocabulary
        ("--model.arm=sft", "arm"),  # not an arm
        ("--data.gsm8k=/nowhere", "corpus"),  # the real path needs both files
        ("--model.pretrained=/nowhere/qwen", "local checkpoint"),
        ("--model.attn_implementation=sdpa", "eager"),  # no forward-mode AD for the JVP
    ],
)
def test_bad_values_exit_2_with_one_paragraph(tiny_args, flag, message, capsys):
    assert message in user_error_message(train, [*tiny_args, flag], capsys)


def test_a_missing_corpus_is_a_clear_error(tiny_args, tmp_path, capsys):
    (tmp_path / "gsm8k").mkdir()
    args = [
        *tiny_args,
        f"--data.corpus={tmp_path / 'corpus'}",
        f"--data.gsm8k={tmp_path / 'gsm8k'}",
    ]
    assert "corpus" in user_error_message(train, args, capsys).lower()
