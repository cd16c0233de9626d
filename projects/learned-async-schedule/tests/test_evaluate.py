import numpy as np
import pytest
import torch

from async_schedule.evaluate import (
    feature_statistics,
    frechet_distance,
    inception_fid,
    precision_recall,
    write_adm_batch,
)
from papers_cli import UserError


def test_frechet_distance_matches_the_closed_form_for_two_gaussians():
    rng = np.random.default_rng(0)
    mu1, mu2 = rng.normal(size=4), rng.normal(size=4)
    var1, var2 = rng.uniform(0.5, 2, size=4), rng.uniform(0.5, 2, size=4)
    closed = ((mu1 - mu2) ** 2).sum() + (var1 + var2 - 2 * np.sqrt(var1 * var2)).sum()
    rotation, _ = np.linalg.qr(rng.normal(size=(4, 4)))  # the distance is rotation invariant
    sigma1, sigma2 = rotation @ np.diag(var1) @ rotation.T, rotation @ np.diag(var2) @ rotation.T
    assert frechet_distance(mu1, sigma1, mu2, sigma2) == pytest.approx(closed, rel=1e-8)
    assert frechet_distance(mu1, sigma1, mu1, sigma1) == pytest.approx(0, abs=1e-8)


def test_frechet_distance_of_samples_converges_to_the_closed_form():
    rng = np.random.default_rng(1)
    a = rng.normal(0.0, 1.0, size=(200_000, 3))
    b = rng.normal(1.0, 2.0, size=(200_000, 3))
    closed = 3 * 1.0 + 3 * (1 + 4 - 2 * 2)  # |mu|^2 + Tr(S1 + S2 - 2 sqrt(S1 S2)) = 3 + 3
    assert frechet_distance(*feature_statistics(a), *feature_statistics(b)) == pytest.approx(
        closed, rel=0.02
    )


def test_precision_recall_identical_and_disjoint_sets():
    real = torch.randn(300, 8, generator=torch.Generator().manual_seed(0))
    assert precision_recall(real, real.clone()) == (1.0, 1.0)
    assert precision_recall(real, real + 100) == (0.0, 0.0)
    collapsed = real[:5].repeat(60, 1)  # mode collapse: precise, poor recall
    precision, recall = precision_recall(real, collapsed)
    assert precision == 1.0 and recall < 0.2


def test_adm_batch_has_the_reference_evaluator_layout(tmp_path):
    images = torch.rand(3, 3, 8, 8) * 2 - 1
    path = write_adm_batch(tmp_path / "samples.npz", images)
    with np.load(path) as batch:
        assert batch.files == ["arr_0"]
        assert batch["arr_0"].dtype == np.uint8 and batch["arr_0"].shape == (3, 8, 8, 3)


def test_fid_without_local_inception_weights_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match="Inception"):
        inception_fid(str(tmp_path / "missing.pth"))
    with pytest.raises(UserError, match="--inception_weights"):
        inception_fid(None)


def test_sample_command_decodes_a_checkpoint_into_an_adm_batch(tmp_path):
    """Paper-scale path on a tiny fixture: a DiT over a 4-channel latent, saved as a checkpoint,
    sampled, decoded by a tiny AutoencoderKL and written as ADM's arr_0 (uint8 NHWC)."""
    import lightning
    from diffusers import AutoencoderKL

    from async_schedule.model import AsyncDiffusionModule
    from async_schedule.sample import sample_to_adm

    vae = AutoencoderKL(
        block_out_channels=(8, 8),
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        latent_channels=4,
        norm_num_groups=4,
        layers_per_block=1,
    )
    vae.save_pretrained(tmp_path / "vae")
    model = AsyncDiffusionModule(
        schedule="power", lag_channels=4, lag_size=8, lead_channels=3, lead_size=4, patch=2,
        width=16, depth=1, heads=2, num_classes=3, sample_steps=2,
    )  # fmt: skip
    checkpoint = tmp_path / "tiny.ckpt"
    torch.save(
        {
            "state_dict": model.state_dict(),
            "hyper_parameters": dict(model.hparams),
            "pytorch-lightning_version": lightning.__version__,
        },
        checkpoint,
    )
    out = tmp_path / "samples.npz"
    result = sample_to_adm(
        ["--ckpt_path", str(checkpoint), "--vae_path", str(tmp_path / "vae"), "--out", str(out),
         "--num_samples", "5", "--batch_size", "2", "--device", "cpu"]
    )  # fmt: skip
    with np.load(out) as batch:
        assert batch.files == ["arr_0"]
        assert batch["arr_0"].dtype == np.uint8 and batch["arr_0"].shape == (5, 16, 16, 3)
    assert result["protocol"]["steps"] == 2 and (tmp_path / "samples.json").is_file()
    with pytest.raises(SystemExit) as info:  # a wrong VAE is a clear error, exit 2
        sample_to_adm(
            ["--ckpt_path", str(checkpoint), "--vae_path", str(tmp_path / "none"), "--out",
             str(out), "--device", "cpu"]
        )  # fmt: skip
    assert info.value.code == 2
