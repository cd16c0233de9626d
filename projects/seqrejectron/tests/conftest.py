import pytest
import torch

from seqrejectron import claim


@pytest.fixture(autouse=True)
def two_threads(tmp_path, monkeypatch):
    """Tests run on 2 cores; generated data and the claim's finished jobs are cached in the
    test's own folder, so a test never reads a result an earlier run (or an earlier version of
    the code) left. The claim's worlds (content-addressed) stay in runs/seqrejectron/inputs."""
    torch.set_num_threads(2)
    monkeypatch.setenv("PAPERS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(claim, "JOBS_DIR", tmp_path / "jobs")


@pytest.fixture
def tiny_args(tmp_path):
    """Flags that shrink configs/default.yaml to seconds: horizon 40 (grid 7), 20 trajectories,
    BC for 10 steps, validator rounds of 5 steps, 5 steps an epoch, no logger."""
    return [
        "--trainer.accelerator=cpu",
        "--trainer.max_steps=20",
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.check_val_every_n_epoch=1",
        f"--trainer.default_root_dir={tmp_path}",
        "--data.horizon=40",
        "--data.in_features=42",
        "--data.n_train=20",
        "--data.n_test=20",
        "--data.n_eval=4",
        "--data.steps_per_epoch=5",
        "--model.bc_steps=10",
        "--model.validator_steps=5",
    ]


@pytest.fixture
def search_args(tiny_args):
    """tiny_args grown to a search that finds validators: 60 train and 60 test trajectories,
    BC for 120 steps, seed 0; a test adds its validator steps and step budget."""
    return [
        *tiny_args,
        "--seed_everything=0",
        "--data.n_train=60",
        "--data.n_test=60",
        "--data.steps_per_epoch=40",
        "--model.bc_steps=120",
    ]
