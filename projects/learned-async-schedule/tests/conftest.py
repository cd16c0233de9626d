import pytest
import torch


@pytest.fixture(scope="session")
def cache_root(tmp_path_factory):
    """One cache per test session: the miniature's encoders are trained once, not per test."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(autouse=True)
def two_threads(cache_root, monkeypatch):
    """Tests run on 2 cores; generated data are cached in the session's own folder."""
    torch.set_num_threads(2)
    monkeypatch.setenv("PAPERS_CACHE_DIR", str(cache_root))


TINY = [
    "--trainer.accelerator=cpu",
    "--trainer.max_steps=6",
    "--trainer.val_check_interval=6",
    "--trainer.limit_val_batches=1",
    "--trainer.logger=false",
    "--trainer.enable_checkpointing=false",
    "--model.probe_steps=3",
    "--model.width=32",
    "--model.depth=1",
    "--model.heads=2",
    "--data.batch_size=16",
    "--data.train_subset=128",
    "--data.encoder_epochs=1",
    "--data.evaluator_epochs=1",
]


@pytest.fixture
def tiny_args(tmp_path):
    """Flags that shrink configs/default.yaml to seconds: CPU, few steps, tiny DiT, no logger."""
    return [*TINY, f"--trainer.default_root_dir={tmp_path}"]
