import pytest
import torch

from aic import claim


@pytest.fixture(autouse=True)
def two_threads(tmp_path, monkeypatch):
    """Tests run on 2 cores; generated data and the claim's finished jobs are cached in the
    test's own folder, so a test never reads a result an earlier run (or an earlier version of
    the code) left."""
    torch.set_num_threads(2)
    monkeypatch.setenv("PAPERS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(claim, "JOBS_DIR", tmp_path / "jobs")


@pytest.fixture
def tiny_args(tmp_path):
    """Flags that shrink configs/default.yaml to seconds: CPU, tiny data and model, no logger."""
    return [
        "--trainer.accelerator=cpu",
        "--trainer.devices=1",
        "--trainer.max_epochs=2",
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=false",
        f"--trainer.default_root_dir={tmp_path}",
        "--data.n_train=128",
        "--data.n_val=64",
        "--data.batch_size=32",
        "--model.dim=8",
        "--model.k_max=3",
    ]
