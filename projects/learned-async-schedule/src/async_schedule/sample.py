"""Paper scale: a trained checkpoint -> samples -> VAE decode -> the ADM evaluator's ``.npz``.

    uv run learned-async-schedule-sample --ckpt_path runs/.../last.ckpt \\
        --vae_path /models/sd-vae-ft-ema --out samples.npz --num_samples 50000

writes ``arr_0`` (uint8 [N, 256, 256, 3]), the batch the ADM reference evaluator of Dhariwal &
Nichol reads (``python evaluator.py VIRTUAL_imagenet256_labeled.npz samples.npz``). Class labels
cycle through all classes (balanced, as ADM samples); ``--guidance_scale`` applies CFG. Given
``--inception_weights`` (torch-fidelity's local FID Inception file) and ``--reference_npz`` (an
ADM reference batch with ``arr_0`` images), FID is also computed here with torchmetrics.
The sampling protocol (steps, solver, guidance, seed, batch) is stored beside the npz as json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from async_schedule.data import require_pretrained
from async_schedule.evaluate import inception_fid, to_uint8_images
from async_schedule.model import AsyncDiffusionModule
from papers_cli import UserError, user_errors


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="learned-async-schedule-sample", description=__doc__)
    p.add_argument("--ckpt_path", required=True, help="a checkpoint written by `train`")
    p.add_argument("--vae_path", required=True, help="diffusers AutoencoderKL folder")
    p.add_argument("--out", default="samples.npz")
    p.add_argument("--num_samples", type=int, default=50_000)
    p.add_argument("--batch_size", type=int, default=250)
    p.add_argument("--steps", type=int, default=None, help="default: the model's sample_steps")
    p.add_argument("--guidance_scale", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--inception_weights", default=None)
    p.add_argument("--reference_npz", default=None)
    return p


@torch.no_grad()
def decode(vae, latents: torch.Tensor) -> torch.Tensor:
    """Texture latents (scaled as the data module encodes them) -> images in [-1, 1]."""
    return vae.decode(latents.to(vae.dtype) / vae.config.scaling_factor).sample.float()


@torch.no_grad()
def sample_to_adm(argv: list[str] | None = None) -> dict:
    """Sample, decode and write the ADM batch; returns {"path", "protocol"[, "fid"]}."""
    with user_errors():
        return _sample_to_adm(parser().parse_args(argv))


def main() -> None:
    """Console entry point of `learned-async-schedule-sample`."""
    sample_to_adm()


def _sample_to_adm(args: argparse.Namespace) -> dict:
    from diffusers import AutoencoderKL

    if not Path(args.ckpt_path).is_file():
        raise UserError(f"--ckpt_path {args.ckpt_path!r} is not a file: pass a `train` checkpoint")
    if args.num_samples < 1 or args.batch_size < 1:
        raise UserError("--num_samples and --batch_size must be positive")
    if (args.inception_weights is None) != (args.reference_npz is None):
        raise UserError("FID here needs both --inception_weights and --reference_npz (or neither)")
    model = AsyncDiffusionModule.load_from_checkpoint(
        args.ckpt_path, map_location=args.device, weights_only=False
    ).eval()
    vae = AutoencoderKL.from_pretrained(
        require_pretrained(args.vae_path, "texture VAE (diffusers AutoencoderKL)", "--vae_path")
    )
    vae = vae.to(args.device).eval()
    if vae.config.latent_channels != model.hparams.lag_channels:
        raise UserError(
            f"the VAE has {vae.config.latent_channels} latent channels, the model's texture "
            f"latent {model.hparams.lag_channels}: pass the VAE the model was trained with"
        )
    generator = torch.Generator().manual_seed(args.seed)
    classes = model.hparams.num_classes
    batches = []
    for start in range(0, args.num_samples, args.batch_size):
        n = min(args.batch_size, args.num_samples - start)
        labels = (torch.arange(start, start + n) % classes).to(args.device) if classes else None
        _, latents = model.generate(
            n, args.steps, generator, labels=labels, guidance_scale=args.guidance_scale
        )
        batches.append(to_uint8_images(decode(vae, latents)))
    images = np.concatenate(batches)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(out, arr_0=images)
    h = model.hparams
    protocol = {
        "checkpoint": str(args.ckpt_path),
        "num_samples": args.num_samples,
        "steps": args.steps or h.sample_steps,
        "ode_method": h.ode_method,
        "guidance_scale": h.guidance_scale if args.guidance_scale is None else args.guidance_scale,
        "seed": args.seed,
        "batch_size": args.batch_size,
        "schedule": h.schedule,
        "schedule_slopes": model.schedule_slopes()
        if hasattr(model.schedule, "raw_increments")
        else None,
    }
    result = {"path": str(out), "protocol": protocol}
    if args.inception_weights is not None:
        result["fid"] = fid_against_reference(
            images, args.reference_npz, args.inception_weights, args.device
        )
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return result


def fid_against_reference(
    images: np.ndarray, reference_npz: str, inception_weights: str, device: str
) -> float:
    """torchmetrics FID between uint8 NHWC samples and an ADM reference batch's ``arr_0``."""
    if not Path(reference_npz).is_file():
        raise UserError(f"--reference_npz {reference_npz!r} is not a file")
    fid = inception_fid(inception_weights, device)
    with np.load(reference_npz) as reference:
        real = reference["arr_0"]
    for batch, is_real in ((real, True), (images, False)):
        for chunk in np.array_split(batch, max(1, len(batch) // 250)):
            tensor = torch.from_numpy(chunk).permute(0, 3, 1, 2).float().div(255).to(device)
            fid.update(tensor, real=is_real)
    return float(fid.compute())
