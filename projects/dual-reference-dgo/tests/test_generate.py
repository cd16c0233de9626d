"""The generation stage: the file it writes, and the warm-start model as the fast policy."""

import json

import pytest
import torch

from dual_dgo.cli import train
from dual_dgo.data import DualDgoDataModule
from dual_dgo.generate import generate_cli, generate_offline, load_fast_policy
from dual_dgo.miniature import TaskConfig, generate_split

SIZES = {"train": 12, "val": 6, "test": 6}


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_scripted_file_reads_back_as_the_in_memory_miniature(tmp_path):
    generate_offline(tmp_path, seed=3, task=TaskConfig(), sizes=SIZES)
    sizes = {f"n_{k}": v for k, v in SIZES.items()}
    from_file = DualDgoDataModule(root=str(tmp_path), max_length=13, seed=3)
    in_memory = DualDgoDataModule(**sizes, seed=3)
    from_file.setup(), in_memory.setup()
    for split in SIZES:
        for a, b in zip(from_file.splits[split], in_memory.splits[split], strict=True):
            assert torch.equal(a.prompt.input_ids, b.prompt.input_ids)
            torch.testing.assert_close(
                a.prompt.vision["pixel_values"], b.prompt.vision["pixel_values"]
            )  # images round-trip exactly (the encoder quantises to 8 bits either way)
            assert torch.equal(a.rewards, b.rewards) and torch.equal(a.modes, b.modes)
            assert a.difficulty == b.difficulty and a.answer == b.answer
            assert all(torch.equal(x, y) for x, y in zip(a.responses, b.responses, strict=True))


@pytest.fixture(scope="module")
def warm_checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("warm")
    args = [
        "--trainer.accelerator=cpu",
        "--trainer.max_epochs=1",
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.limit_val_batches=0",
        f"--trainer.default_root_dir={root}",
        "--model.sft_warmup_epochs=0",
        "--model.hidden=32",
        "--model.layers=1",
        "--model.vision_hidden=32",
        "--model.max_new_tokens=14",
        "--data.n_train=16",
        "--data.n_val=8",
        "--data.n_test=8",
        "--data.batch_prompts=16",
    ]
    path = root / "warm.ckpt"
    train(args).trainer.save_checkpoint(path)
    return path


def _generate(out, checkpoint, temperature="1.0"):
    flags = ["--n-train=12", "--n-val=4", "--n-test=4", f"--temperature={temperature}"]
    generate_cli([str(out), f"--fast-policy={checkpoint}", "--seed=5", *flags])
    return _rows(out / "train.jsonl")


def test_the_warm_start_as_fast_policy_samples_scores_and_keeps_the_slow_policy(
    warm_checkpoint, tmp_path
):
    rows = _generate(tmp_path / "a", warm_checkpoint)
    scripted = generate_split(12, 5 * 3, TaskConfig())  # the train split's prompts for seed 5
    for row, reference in zip(rows, scripted, strict=True):
        fast = [r for r in row["responses"] if r["mode"] == "fast"]
        slow = [r for r in row["responses"] if r["mode"] == "slow"]
        n_fast = TaskConfig().counts(row["difficulty"])[0]  # the scripted policy's count
        assert len(fast) == n_fast and all(r["behavior"] == "warm_start" for r in fast)
        assert all(r["text"].startswith("<fast>") for r in fast)
        # the verifier on the text after "A:" minus 0.2 x tokens / 13 (tokens: words + EOS here)
        for r in fast:
            correct = (
                r["text"].split("A:")[-1].strip() == row["answer"] if "A:" in r["text"] else False
            )
            tokens = len(r["text"].split()) + 1
            assert r["reward"] == pytest.approx(float(correct) - 0.2 * tokens / 13)
        assert slow == [r for r in reference["responses"] if r["mode"] == "slow"]
        assert row["answer"] == reference["answer"]
    assert _generate(tmp_path / "b", warm_checkpoint) == rows  # same seed, same draws


def test_near_zero_temperature_samples_the_models_greedy_fast_answer(warm_checkpoint, tmp_path):
    rows = _generate(tmp_path / "cold", warm_checkpoint, temperature="1e-4")
    model = load_fast_policy(warm_checkpoint)
    data = DualDgoDataModule(root=str(tmp_path / "cold"), max_length=13)
    data.setup()
    greedy = model.evaluate_prompts(data.splits["train"])
    for row, correct in zip(rows, greedy["fast_correct"], strict=True):
        fast = [r["reward"] > 0.5 for r in row["responses"] if r["mode"] == "fast"]
        assert len(fast) >= 1 and all(hit == bool(correct) for hit in fast)


def test_generation_bad_input_is_clear(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="uv run train"):
        load_fast_policy(tmp_path / "none.ckpt")
    for flag, message in [
        (f"--fast-policy={tmp_path / 'none.ckpt'}", "uv run train"),
        ("--temperature=0", "temperature"),
    ]:
        with pytest.raises(SystemExit) as stop:
            generate_cli([str(tmp_path / "out"), flag])
        assert stop.value.code == 2 and message in capsys.readouterr().err
