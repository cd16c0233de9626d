import numpy as np
import pytest
import torch


@pytest.fixture(autouse=True)
def two_threads(tmp_path, monkeypatch):
    """Tests run on 2 cores; generated data are cached in the test's own folder."""
    torch.set_num_threads(2)
    monkeypatch.setenv("PAPERS_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def tiny_args(tmp_path):
    """Flags that shrink configs/default.yaml to seconds: CPU, 2 batches a task (one epoch each),
    4 tasks, 64 test images, no logger."""
    return [
        "--trainer.accelerator=cpu",
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.limit_train_batches=2",
        f"--trainer.default_root_dir={tmp_path}",
        "--model.epochs_per_task=1",
        "--model.eval_steps=3",
        "--model.buffer_size=40",
        "--model.replay_batch=8",
        "--data.n_val=32",
        "--data.n_test=64",
        "--data.batch_size=16",
    ]


def _sort_based_l1_projection(v: np.ndarray, radius: float) -> np.ndarray:
    """Duchi et al.'s algorithm, one vector, written plainly."""
    if np.abs(v).sum() <= radius:
        return v.copy()
    mu = np.sort(np.abs(v))[::-1]
    cumulative = np.cumsum(mu)
    rho = max(j for j in range(len(mu)) if mu[j] - (cumulative[j] - radius) / (j + 1) > 0)
    theta = (cumulative[rho] - radius) / (rho + 1)
    return np.sign(v) * np.maximum(np.abs(v) - theta, 0)


@pytest.fixture
def reference_l1_projection():
    """The plain reference the L1 projection and the sparse L1 PGD are checked against."""
    return _sort_based_l1_projection
