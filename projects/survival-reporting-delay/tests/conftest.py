import pytest
import torch

from survival_delay import claim


@pytest.fixture(autouse=True)
def two_threads(tmp_path, monkeypatch):
    """Tests run on 2 shared cores; one torch thread is fastest for these small float64
    tensors (measured ~5x faster per likelihood evaluation than 2 threads under load).
    Generated data and the claim's finished jobs are cached in the test's own folder, so a
    test never reads a result an earlier run (or an earlier version of the code) left."""
    torch.set_num_threads(1)
    monkeypatch.setenv("PAPERS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(claim, "JOBS_DIR", tmp_path / "jobs")


@pytest.fixture
def tiny_args(tmp_path):
    """Flags that shrink configs/default.yaml to seconds: CPU, few MCEM iterations, no logger."""
    return [
        "--trainer.accelerator=cpu",
        "--trainer.max_epochs=2",
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=false",
        f"--trainer.default_root_dir={tmp_path}",
        "--data.n_source=400",
        "--data.n_target=200",
        "--model.max_draws=40",
    ]
