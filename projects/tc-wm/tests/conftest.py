import pytest
import torch


@pytest.fixture(autouse=True)
def two_threads(tmp_path, monkeypatch):
    """Tests run on 2 cores; generated data are cached in the test's own folder."""
    torch.set_num_threads(2)
    monkeypatch.setenv("PAPERS_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def tiny_args(tmp_path):
    """Flags that shrink configs/default.yaml to seconds: CPU, a few batches, no logger."""
    return [
        "--trainer.accelerator=cpu",
        "--trainer.max_epochs=2",
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=false",
        "--trainer.enable_progress_bar=false",
        f"--trainer.default_root_dir={tmp_path}",
        "--data.n_episodes=30",
        "--data.episode_length=12",
        "--data.batch_size=32",
        "--model.plan_pairs=2",
    ]
