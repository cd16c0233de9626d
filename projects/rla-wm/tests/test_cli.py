"""`uv run train` through the real CLI: defaults, fit, test from a checkpoint, exact resume,
the two stages, and clear errors."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
import yaml

from papers_cli.testing import check_resume
from rlawm.cli import train
from rlawm.data import PushWorldDataModule, encode
from rlawm.formats import DataFormatError, write_trajectory_dir
from rlawm.model import WorldModelModule

PROJECT = Path(__file__).resolve().parents[1]


def test_constructor_defaults_equal_the_default_config():
    config = yaml.safe_load((PROJECT / "configs" / "default.yaml").read_text())
    for cls, section in ((WorldModelModule, "model"), (PushWorldDataModule, "data")):
        defaults = {
            k: p.default
            for k, p in inspect.signature(cls.__init__).parameters.items()
            if k != "self"
        }
        for key, value in config[section].items():
            assert defaults[key] == value, (section, key)


def fit(args, *extra):
    return train(["fit", *args, *extra])


def test_fit_then_test_from_the_checkpoint_scores_rollouts(tiny_args, tmp_path):
    cli = fit(tiny_args, "--trainer.enable_checkpointing=true")
    model = cli.model
    assert model.z_ready and not any(p.requires_grad for p in model.rla.parameters())
    assert "val/energy_distance" in cli.trainer.callback_metrics
    checkpoint = next(Path(tmp_path).rglob("*.ckpt"))
    tested = train(["test", *tiny_args, f"--ckpt_path={checkpoint}"])
    metrics = tested.trainer.callback_metrics
    for name in ("energy_distance", "feature_l1_best", "collapse_ratio"):
        assert torch.isfinite(metrics[f"test/{name}"]), name
    # the checkpoint's weights were scored, not a fresh model
    loaded = tested.model.state_dict()
    for key, value in model.state_dict().items():
        torch.testing.assert_close(loaded[key], value)


def test_resume_continues_exactly_including_the_flow_noise(tiny_args, tmp_path):
    """The shared check: parameters, optimizer state, global step and the logged metrics of a
    resumed run equal a straight one. 12 steps: the autoencoder's 6, then the flow's; the
    checkpoint at step 6 falls at the stage switch (an epoch of 2 batches ends there)."""
    args = [*tiny_args, "--trainer.limit_train_batches=2", "--trainer.val_check_interval=null"]
    # the resumed half starts at the stage switch, so it logs no autoencoder loss to compare
    ignore = ("peak_memory", "per_sec", "time", "rla_loss")
    check_resume(train, args, steps=12, root_dir=tmp_path / "resume", ignore_metrics=ignore)


def test_flow_noise_state_is_what_the_checkpoint_restores():
    module = WorldModelModule(width=16, heads=2)
    torch.randn(5, generator=module.noise)
    saved = {}
    module.on_save_checkpoint(saved)
    expected = torch.randn(3, generator=module.noise)
    fresh = WorldModelModule(width=16, heads=2)
    fresh.on_load_checkpoint(saved)
    assert torch.equal(torch.randn(3, generator=fresh.noise), expected)


@pytest.mark.parametrize("method", ["rla_wm", "regression"])
def test_actions_change_the_predictions(tiny_args, method):
    # the velocity head starts at zero (no action effect): 50 world-model steps move it
    model = fit(tiny_args, f"--model.method={method}", "--trainer.max_steps=56").model.eval()
    world = model.trainer.datamodule.world
    x, chunk = world.test.tokens[:, 0, 0], world.test.actions[:, 0]
    other = torch.flip(chunk, dims=(-1,)) * -1

    def predict(actions):
        with torch.no_grad():
            if method == "rla_wm":  # the sampled RLA (the barely trained decoder damps it)
                return model.net.sample(x, actions, 2, torch.Generator().manual_seed(0))
            return model.predict_chunk(x, actions)

    assert torch.equal(predict(chunk), predict(chunk))  # seeded
    assert (predict(chunk) - predict(other)).abs().mean() > 1e-4


def test_the_decoder_uses_the_latent_after_a_short_fit(tiny_args):
    model = fit(
        tiny_args, "--model.rla_steps=150", "--trainer.max_steps=151", "--model.lr=0.003"
    ).model.eval()
    x_t, x_next, _ = model.trainer.datamodule.pairs()
    with torch.no_grad():
        z = model.rla.encode(x_t, x_next)[0]
        with_z = (model.rla.decode(x_t, z) - x_next).abs().mean()
        zero = (model.rla.decode(x_t, torch.zeros_like(z)) - x_next).abs().mean()
    assert with_z < 0.9 * zero


def test_the_encoder_is_frozen_and_the_cache_holds_its_tokens(token_cache):
    data = PushWorldDataModule(token_cache=token_cache, episode_length=8, chunks=2)
    data.setup()
    assert not any(p.requires_grad for p in data.encoder.parameters())
    world = data.world
    again = world.standardise(encode(data.encoder, world.train_frames[:1], world.train_masks[:1]))
    torch.testing.assert_close(again, world.train_tokens[:1], atol=1e-4, rtol=1e-4)


def test_tokens_of_the_wrong_shape_are_a_clear_error(token_cache):
    data = PushWorldDataModule(token_cache=token_cache, encoder_width=48)
    with pytest.raises(DataFormatError, match="48"):
        data.setup()


def test_a_model_that_does_not_fit_the_data_says_which_flags(tiny_args):
    with pytest.raises(ValueError, match="--model.action_dim=2"):
        fit(tiny_args, "--model.action_dim=3")


def test_real_episodes_need_the_pretrained_encoder_and_load_with_it(tmp_path):
    import numpy as np

    from papers_worldmodels.encoder import build_encoder, tiny_config
    from rlawm.formats import Episode
    from rlawm.scene import PushScene, rollout_episode

    scene, rng = PushScene(32), np.random.default_rng(0)
    for i in range(4):  # rendered pushes written in the official trajectory-folder format
        e = rollout_episode(scene, rng, 9)
        actions = np.concatenate([e["actions"], e["actions"][-1:]])  # one per frame
        episode = Episode(e["frames"], e["masks"], actions, e["qpos"], f"traj_{i}")
        write_trajectory_dir(tmp_path / "data" / f"traj_{i}", episode, "front")
    scene.close()
    with pytest.raises(DataFormatError, match="encoder_path"):
        PushWorldDataModule(
            source="trajectories", data_dir=tmp_path / "data", camera="front"
        ).setup()
    build_encoder(tiny_config(image_size=32, patch_size=8, hidden=16, layers=1)).save_pretrained(
        tmp_path / "encoder"
    )
    data = PushWorldDataModule(
        source="trajectories",
        data_dir=tmp_path / "data",
        camera="front",
        encoder_path=tmp_path / "encoder",
        image_size=32,
        horizon=2,
        chunks=2,
        episode_length=4,
    )
    data.setup()
    assert data.token_shape == (16, 16)
    assert data.world.test.tokens.shape[:3] == (1, 1, 3)
    assert data.world.train_actions.shape[-1] == 2
    with pytest.raises(DataFormatError, match="Cameras found: front"):
        PushWorldDataModule(
            source="trajectories",
            data_dir=tmp_path / "data",
            camera="side",
            encoder_path=tmp_path / "encoder",
            image_size=32,
        ).setup()


def test_a_missing_data_folder_is_a_clear_error():
    with pytest.raises(DataFormatError, match="data_dir"):
        PushWorldDataModule(source="robomimic")
