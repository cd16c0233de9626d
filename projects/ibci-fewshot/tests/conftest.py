import pytest
import torch

from ibci_fewshot import claim

# A miniature of the miniature, shaped like configs/default.yaml: 5 held-in sessions (the last 2
# validate, the one before them feeds stage 2 only) and 2 held-out ones, short budgets.
# Seconds per fit.
TINY_DATA = [
    "--data.sim_held_in_days=[0,5,10,15,20]",
    "--data.n_val_sessions=2",
    "--data.meta_sessions=1",
    "--data.sim_held_out_days=[30,60]",
    "--data.sim_sentences=16",
    "--data.sim_calibration_pool=8",
    "--data.sim_eval=4",
    "--data.episodes_per_batch=2",
    "--data.episodes_per_epoch=4",
    "--data.n_minival=2",
    "--data.n_query=3",
]


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(autouse=True)
def one_thread(shared_cache, tmp_path, monkeypatch):
    """Tests run with one torch thread; the simulated NWB files are cached once per session.
    The claim's finished jobs are cached in the test's own folder, so a test never reads a
    result an earlier run (or an earlier version of the code) left; its trained backbones
    (content-addressed) stay in runs/ibci-fewshot/inputs."""
    torch.set_num_threads(1)
    monkeypatch.setenv("PAPERS_CACHE_DIR", str(shared_cache))
    monkeypatch.setattr(claim, "JOBS_DIR", tmp_path / "jobs")


@pytest.fixture
def tiny_args(tmp_path):
    """Flags that shrink configs/default.yaml to seconds: CPU, 2 batches an epoch, no logger,
    2 stage-1 steps then stage 2."""
    return [
        "--trainer.accelerator=cpu",
        "--trainer.max_steps=4",
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.check_val_every_n_epoch=1",
        f"--trainer.default_root_dir={tmp_path}",
        "--model.stage1_steps=2",
        "--model.hidden=16",
        "--model.projection=8",
        *TINY_DATA,
    ]
