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


# The language module's tests (test_model.py, test_module_values.py) share a small data module
# and the helpers that step a module outside a Trainer.
SMALL = dict(hidden_size=32, layers=1, heads=2, top_k=4, feedback_batch=16, refresh_every=2)


@pytest.fixture(scope="module")
def data():
    from vpretrain.data import VPretrainDataModule

    dm = VPretrainDataModule(
        block_size=16,
        batch_size=4,
        n_feedback=32,
        n_val=16,
        n_test=16,
        perplexity_blocks=4,
        arithmetic_share=0.4,
    )
    dm.setup()
    return dm


def module_for(data, arm="vpretrain", **overrides):
    """A seeded small module on ``data``'s vocabulary whose optimizer, backward and log work
    without a Trainer; returns (module, learner optimizer)."""
    from vpretrain.model import VPretrainModule

    torch.manual_seed(0)
    module = VPretrainModule(arm=arm, vocab_size=data.vocab_size, **{**SMALL, **overrides})
    module.feedback = data.feedback
    optimizer = module.configure_optimizers()
    module.optimizers = lambda: optimizer  # a step outside a Trainer
    module.manual_backward = lambda loss: loss.backward()
    module.log = lambda *args, **kwargs: None
    return module, optimizer


def batch_of(data, index=0):
    """Training blocks 4 * index .. 4 * index + 3."""
    return {k: v[index * 4 : (index + 1) * 4] for k, v in data.train_set.blocks.items()}


def corrupted_batch(data):
    """The first batch of 4 blocks holding a corrupted answer digit."""
    corrupted = data.train_set.blocks["corrupted"][:, 1:]
    whole = corrupted[: len(corrupted) // 4 * 4].reshape(-1, 4 * corrupted.shape[1])
    index = int(torch.nonzero(whole.any(-1))[0])
    return batch_of(data, index)


@pytest.fixture(scope="session")
def tools():
    """module_for, batch_of and corrupted_batch (importlib mode: tests cannot import each
    other, so the helpers travel as a fixture)."""
    from types import SimpleNamespace

    return SimpleNamespace(
        module_for=module_for, batch_of=batch_of, corrupted_batch=corrupted_batch
    )
