import pytest
import torch


@pytest.fixture(autouse=True)
def two_threads(tmp_path_factory, monkeypatch):
    """Tests run on 2 cores; the miniature's tokenizer is cached once per session."""
    torch.set_num_threads(2)
    monkeypatch.setenv("PAPERS_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture
def tiny_args(tmp_path):
    """Flags that shrink configs/default.yaml to seconds: a 1-layer learner, short blocks,
    few evaluation items, no logger."""
    return [
        "--trainer.accelerator=cpu",
        "--trainer.max_steps=4",
        "--trainer.val_check_interval=2",
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=false",
        "--trainer.enable_progress_bar=false",
        f"--trainer.default_root_dir={tmp_path}",
        "--model.hidden_size=32",
        "--model.layers=1",
        "--model.heads=2",
        "--model.top_k=4",
        "--model.refresh_every=2",
        "--model.feedback_batch=16",
        "--data.block_size=16",
        "--data.batch_size=4",
        "--data.n_feedback=32",
        "--data.n_val=16",
        "--data.n_test=16",
        "--data.perplexity_blocks=4",
        "--data.arithmetic_share=0.4",
    ]
