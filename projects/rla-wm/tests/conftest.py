import pytest
import torch


@pytest.fixture(autouse=True)
def two_threads(tmp_path, monkeypatch):
    """Tests run on 2 cores; generated data are cached in the test's own folder."""
    torch.set_num_threads(2)
    monkeypatch.setenv("PAPERS_CACHE_DIR", str(tmp_path / "cache"))


TINY_DATA = [
    "--data.num_episodes=4",
    "--data.num_demos=2",
    "--data.episode_length=8",
    "--data.chunks=2",
    "--data.encoder_episodes=1",
    "--data.encoder_steps=2",
    "--data.val_groups=2",
    "--data.test_groups=2",
    "--data.batch_size=16",
]


@pytest.fixture(scope="session")
def token_cache(tmp_path_factory):
    """One tiny rendered world (4 episodes of 8 steps), shared by the CLI tests."""
    from rlawm.data import PushWorldDataModule

    path = tmp_path_factory.mktemp("world") / "tokens.pt"
    values = {a.split("=")[0].removeprefix("--data."): int(a.split("=")[1]) for a in TINY_DATA}
    PushWorldDataModule(token_cache=path, **values).setup()
    return path


@pytest.fixture
def tiny_args(tmp_path, token_cache):
    """Flags that shrink configs/default.yaml to seconds: CPU, 12 steps (6 autoencoder, 6 world
    model), a small network, no logger or checkpoint."""
    return [
        "--trainer.accelerator=cpu",
        "--trainer.max_steps=12",
        "--trainer.val_check_interval=12",
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=false",
        "--trainer.enable_progress_bar=false",
        f"--trainer.default_root_dir={tmp_path}",
        "--model.rla_steps=6",
        "--model.width=16",
        "--model.heads=2",
        "--model.num_samples=2",
        "--model.sample_steps=2",
        *TINY_DATA,
        f"--data.token_cache={token_cache}",
    ]
