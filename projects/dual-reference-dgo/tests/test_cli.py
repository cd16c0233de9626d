import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dual_dgo.claim import run_claim_experiment
from dual_dgo.cli import train
from dual_dgo.data import collate_prompts
from dual_dgo.vlm import load_local
from papers_cli.testing import check_resume, run_ddp_train, run_train_test, user_error_message
from papers_eval import load_claim

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


def test_same_seed_same_metrics(tiny_args):
    first = train([*tiny_args, "--seed_everything=3"]).trainer.callback_metrics
    again = train([*tiny_args, "--seed_everything=3"]).trainer.callback_metrics
    assert first["train/loss"].item() == again["train/loss"].item()
    assert first["val/fast_rate"].item() == again["val/fast_rate"].item()


def test_the_run_seed_also_seeds_the_data(tiny_args):
    first = train([*tiny_args, "--seed_everything=3", "--trainer.max_steps=0"]).datamodule
    other = train([*tiny_args, "--seed_everything=4", "--trainer.max_steps=0"]).datamodule
    a, b = first.splits["train"][0], other.splits["train"][0]
    assert not torch.equal(a.prompt.vision["pixel_values"], b.prompt.vision["pixel_values"])


def test_short_run_lowers_the_loss(tiny_args):
    args = [*tiny_args, "--model.responses_per_prompt=null", "--trainer.limit_val_batches=0"]
    args += ["--model.lr=0.005"]
    first = train([*args, "--trainer.max_epochs=1"]).trainer.callback_metrics["train/loss"].item()
    later = train([*args, "--trainer.max_epochs=15"]).trainer.callback_metrics["train/loss"].item()
    assert later < 0.6 * first, (first, later)


def test_resuming_continues_exactly(tiny_args, tmp_path):
    # the weighted draws of responses come from a generator seeded by the step: resumed runs
    # draw the same responses
    check_resume(
        train, [*tiny_args, "--trainer.limit_val_batches=0"], steps=4, root_dir=tmp_path / "resume"
    )


def test_every_epoch_reads_every_prompt_in_a_new_order(tiny_args):
    cli = train([*tiny_args, "--trainer.max_steps=0"])
    data = cli.datamodule
    n = len(data.splits["train"])
    sampler = data.train_dataloader().sampler
    first = list(sampler)
    assert sorted(first) == list(range(n))
    data.trainer = SimpleNamespace(global_step=2, accumulate_grad_batches=1, world_size=1)
    second = list(sampler)  # 2 steps of 16 prompts: the next epoch
    assert sorted(second) == list(range(n)) and second != first


def test_one_step_on_a_prompt_whose_slow_responses_win_raises_p_slow(tiny_args):
    """Through the LightningModule: the method's gradient moves the first token toward slow."""
    cli = train([*tiny_args, "--trainer.max_steps=0", "--model.responses_per_prompt=null"])
    module, data = cli.model, cli.datamodule
    first = data.splits["train"][0]  # a copy: the encoded miniature is shared within a process
    item = dataclasses.replace(first, rewards=torch.where(first.modes == 1, 1.0, 0.0))  # slow wins
    batch = collate_prompts([item])
    before = module.evaluate_prompts([item])["p_fast"][0]
    weights, rho = module.response_weights(batch)
    assert rho[0, 1] > 0.9 and weights[item.modes == 0].sum() < 0.1
    optimizer = torch.optim.SGD(module.parameters(), lr=0.5)
    module.loss(batch)[0].backward()
    optimizer.step()
    after = module.evaluate_prompts([item])["p_fast"][0]
    assert after < before - 0.01


def test_test_subcommand_reports_fast_rate_accuracy_and_tokens_from_a_checkpoint(
    tiny_args, tmp_path
):
    fitted = train([*tiny_args, "--trainer.enable_checkpointing=true"])
    checkpoint = fitted.trainer.checkpoint_callback.best_model_path
    args = [a for a in tiny_args if "checkpointing" not in a]
    output = run_train_test(PROJECT, args, checkpoint)
    for metric in ("test/fast_rate", "test/accuracy", "test/tokens", "test/slow_rank_correlation"):
        assert metric in output


def test_a_saved_local_tiny_checkpoint_loads_offline(tiny_args, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cli = train([*tiny_args, "--trainer.max_steps=0"])
    folder = cli.model.save_pretrained(tmp_path / "tiny-vlm")
    model, processor = load_local(folder)
    item = cli.datamodule.splits["test"][0]
    ids = item.prompt.input_ids[None]
    with torch.no_grad():
        expected = cli.model.vlm(
            input_ids=ids, pixel_values=item.prompt.vision["pixel_values"]
        ).logits
        loaded = model(input_ids=ids, pixel_values=item.prompt.vision["pixel_values"]).logits
    torch.testing.assert_close(loaded, expected)
    assert processor.tokenizer.convert_tokens_to_ids("<think>") == cli.model.encoder.slow_id
    # the paper-scale path: the module and the data read the same folder
    again = train([*tiny_args, f"--model.checkpoint={folder}", "--trainer.fast_dev_run=1"])
    assert again.trainer.global_step == 1


def test_two_process_ddp_run_matches_single_process(tiny_args, tmp_path):
    single = tmp_path / "single"
    train([*tiny_args, f"--trainer.default_root_dir={single}"])
    reference = json.loads((single / "summary_rank0.json").read_text())
    ranks = run_ddp_train(PROJECT, tiny_args, tmp_path / "ddp", reference=reference)
    assert len(ranks) == 2


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--model.objective=grpo", "objective"),
        ("--model.beta=0", "beta"),
        ("--model.prior_fast=1.5", "prior_fast"),
        ("--data.n_train=0", "n_train"),
        ("--model.no_such_option=1", "no_such_option"),
    ],
)
def test_bad_values_exit_2_with_one_paragraph(tiny_args, flag, message, capsys):
    assert message in user_error_message(train, [*tiny_args, flag], capsys)


def test_missing_offline_data_and_checkpoint_are_clear_errors(tiny_args, tmp_path, capsys):
    message = user_error_message(train, [*tiny_args, f"--data.root={tmp_path / 'none'}"], capsys)
    assert "train.jsonl" in message and "synthetic" in message
    message = user_error_message(
        train, [*tiny_args, f"--model.checkpoint={tmp_path / 'none'}"], capsys
    )
    assert "config.json" in message


def test_the_offline_file_trains_and_the_exact_partition_control_refuses_it(
    tiny_args, offline_root, capsys
):
    fitted = train([*tiny_args, f"--data.root={offline_root}", "--data.batch_prompts=2"])
    assert fitted.trainer.global_step == 4 and "val/accuracy" in fitted.trainer.callback_metrics
    args = [*tiny_args, f"--data.root={offline_root}", "--model.objective=exact_partition"]
    assert "known accuracies" in user_error_message(train, args, capsys)


def test_reproduce_quick_writes_a_judged_record(tmp_path, monkeypatch):
    import gzip

    from dual_dgo import claim

    monkeypatch.setattr(claim, "JOBS_DIR", tmp_path / "jobs")
    outcome = run_claim_experiment(["--quick", "--out", str(tmp_path)])
    record = load_claim(tmp_path / "claim.json")
    assert record["project"] == "dual-reference-dgo" and record["quick"]
    assert record["protocol"] == 3 and record["verdict"] == outcome["verdict"]
    assert {c["role"] for c in record["controls"]} == {"negative", "positive"}
    assert {c["kind"] for c in record["controls"]} == {"negative", "oracle"}
    assert {"dual", "single_reference", "fixed_prior", "exact_partition", "oracle_router"} <= set(
        record["metrics"]
    )
    assert (tmp_path / "claim.md").is_file() and (tmp_path / "fast_rate.png").is_file()
    ablations = record["evidence"]["ablations"]["per_seed"][0]
    assert {"dual_swapped", "single_reference_swapped", "dual_token_mean"} <= set(ablations)
    # the subjects really differ: a shared cache key or a config that overrode the objective
    # would make every trained subject's metrics identical
    rates = {
        name: record["metrics"][name]["fast_rate"]["mean"]
        for name in ("dual", "sft", "always_fast", "always_slow")
    }
    assert len(set(np.round(list(rates.values()), 6))) == 4, rates
    # both matched-token rules, the image ablation, the grid edges and the runner's jobs
    for metric in ("gain_vs_single_reference", "gain_vs_single_reference_random"):
        assert np.isfinite(record["metrics"]["dual"][metric]["mean"])
    for how in ("zeroed", "shuffled"):
        assert 0 <= record["metrics"]["dual"][f"{how}_image_accuracy"]["mean"] <= 1
    assert record["evidence"]["tuning_edges"]["dual"]["at_edge"] is None  # a grid of one
    assert record["jobs"]["jobs"] > 0
    if record["verdict"] not in ("held", "held, not replicated"):
        assert record["diagnosis"] and "error" not in record["diagnosis"]
    # the per-prompt arrays: every trained subject's, enough to redo the matched-token analysis
    with gzip.open(tmp_path / "per_prompt.json.gz", "rt") as handle:
        arrays = json.load(handle)["registered"]["seeds"]["0"]
    n_test = len(arrays["dual"]["test"]["p_fast"])
    assert n_test == 32 and {"sft", "rft", "warm_start", "dual_swapped"} <= set(arrays)
    keys = {"p_fast", "fast_correct", "slow_correct", "fast_tokens", "slow_tokens", "difficulty"}
    assert set(arrays["single_reference"]["test"]) == keys | {"source"}
    assert set(arrays["dual"]["test"]["source"]) == {0, 1}  # the registered source-tag design
    assert len(ablations["fast_rate_by_source"]["dual"]) == 2
    assert set(arrays["dual"]) == {"val", "test", "test_zeroed", "test_shuffled"}


def test_a_bad_claim_file_stops_before_training(tmp_path, monkeypatch):
    from dual_dgo import claim

    bad = tmp_path / "claim.yaml"
    bad.write_text(
        (PROJECT / "configs" / "claim.yaml").read_text().replace("seeds: [0, 1, 2]", "seeds: [0]")
    )
    monkeypatch.setattr(claim, "CLAIM_FILE", bad)
    monkeypatch.setattr(
        claim, "quiet_fit", lambda *a, **k: pytest.fail("trained before validating")
    )
    with pytest.raises(ValueError, match="at least 3 seeds"):
        run_claim_experiment(["--out", str(tmp_path / "out")])
