import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread(tmp_path, monkeypatch):
    """Tests run on 1 thread (tiny matrices; the project's runs do the same); generated data and
    models are cached in the test's own folder."""
    torch.set_num_threads(1)
    monkeypatch.setenv("PAPERS_CACHE_DIR", str(tmp_path / "cache"))


TINY_MODEL = [
    "--model.hidden_size=32",
    "--model.num_layers=1",
    "--model.num_heads=2",
    "--model.intermediate_size=64",
]


@pytest.fixture
def tiny_args(tmp_path):
    """Flags that shrink configs/default.yaml to seconds: 2 pretraining + 2 fine-tuning + 2
    unlearning steps on 6 authors with a 1-layer model, CPU, no logger."""
    return [
        "--trainer.accelerator=cpu",
        "--trainer.devices=1",
        "--trainer.max_steps=6",
        "--trainer.val_check_interval=6",
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=false",
        f"--trainer.default_root_dir={tmp_path}",
        "--model.pretrain_steps=2",
        "--model.finetune_steps=2",
        "--model.eval_items=8",
        *TINY_MODEL,
        "--data.num_authors=6",
        "--data.num_forget_authors=1",
        "--data.num_collateral_authors=1",
        "--data.num_generic=40",
        "--data.vocab_size=300",
        "--data.batch_size=8",
        "--data.forget_batch_size=4",
        "--data.retain_batch_size=4",
    ]
