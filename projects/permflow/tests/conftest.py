import pytest
import torch

from permflow.cli import train


@pytest.fixture(autouse=True)
def two_threads(tmp_path, monkeypatch):
    """Tests run on 2 cores; generated data are cached in the test's own folder."""
    torch.set_num_threads(2)
    monkeypatch.setenv("PAPERS_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def tiny_args(tmp_path):
    """Flags that shrink configs/default.yaml to seconds: CPU, tiny data and model, no logger."""
    return [
        "--trainer.accelerator=cpu",
        "--trainer.devices=1",
        "--trainer.max_steps=6",
        "--trainer.check_val_every_n_epoch=1",
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=false",
        f"--trainer.default_root_dir={tmp_path}",
        "--data.num_train=48",
        "--data.num_val=16",
        "--data.num_test=16",
        "--data.batch_size=16",
        "--model.width=16",
        "--model.image_dim=16",
        "--model.channels=[4, 8]",
        "--model.steps=3",
        "--model.num_samples=4",
    ]


@pytest.fixture(scope="module")
def default_model_and_batch(tmp_path_factory):
    root = tmp_path_factory.mktemp("default")
    args = [
        "--trainer.accelerator=cpu",
        "--trainer.devices=1",
        "--trainer.max_steps=0",
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=false",
        f"--trainer.default_root_dir={root}",
        "--data.num_train=16",
        "--data.num_val=8",
        "--data.num_test=8",
        "--data.batch_size=8",
        "--model.width=16",
        "--model.image_dim=16",
        "--model.channels=[4, 8]",
        "--model.steps=3",
    ]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PAPERS_CACHE_DIR", str(root / "cache"))
        cli = train(args)
        batch = next(iter(cli.datamodule.train_dataloader()))
    model = cli.model.eval()
    hp = model.hparams
    assert (hp.method, hp.coupling, hp.prediction, hp.time_sampling, hp.sampler, hp.project) == (
        "permflow",
        "nearest",
        "endpoint_softmax",
        "early",
        "euler",
        True,
    )  # what default.yaml trains; the hand computations below are of this configuration
    return model, batch
