"""Sample quality: FD-digit and k-NN precision/recall in the miniature, FID at paper scale.

The miniature's metric is the Frechet distance in the 64-d features of a separately trained
digit classifier ("FD-digit"). It ranks models like FID does, but it is not FID and its values
are not comparable with FID numbers. Paper scale: torchmetrics' FrechetInceptionDistance with
Inception weights from a local file (nothing is downloaded), plus the ADM ``.npz`` sample batch
(``arr_0`` uint8 [N, H, W, 3]) that the reference evaluator of Dhariwal & Nichol reads.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from scipy import linalg

from papers_cli import UserError


def frechet_distance(
    mu1: np.ndarray, sigma1: np.ndarray, mu2: np.ndarray, sigma2: np.ndarray
) -> float:
    """d^2 = |mu1 - mu2|^2 + Tr(S1 + S2 - 2 (S1 S2)^{1/2}), the Frechet distance of Gaussians."""
    covmean = linalg.sqrtm(sigma1 @ sigma2)
    if not np.isfinite(covmean).all():  # singular product: regularise as pytorch-fid does
        offset = np.eye(len(mu1)) * 1e-6
        covmean = linalg.sqrtm((sigma1 + offset) @ (sigma2 + offset))
    covmean = covmean.real
    return float(((mu1 - mu2) ** 2).sum() + np.trace(sigma1 + sigma2 - 2 * covmean))


def feature_statistics(features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    features = np.asarray(features, dtype=np.float64)
    return features.mean(0), np.cov(features, rowvar=False)


def precision_recall(real: torch.Tensor, fake: torch.Tensor, k: int = 3) -> tuple[float, float]:
    """Improved precision and recall (Kynkaanniemi et al. 2019): the share of fake samples
    inside the union of real k-NN balls, and of real samples inside the fake k-NN balls."""

    def radii(x: torch.Tensor) -> torch.Tensor:
        return torch.cdist(x, x).kthvalue(k + 1, dim=1).values  # k+1: skip the point itself

    def coverage(points: torch.Tensor, centres: torch.Tensor) -> float:
        inside = torch.cdist(points, centres) <= radii(centres)[None]
        return inside.any(1).float().mean().item()

    real, fake = real.double(), fake.double()
    return coverage(fake, real), coverage(real, fake)


@torch.no_grad()
def digit_quality(
    evaluator: torch.nn.Module, generated: torch.Tensor, reference: torch.Tensor
) -> dict[str, float]:
    """FD-digit, precision and recall of generated digits [N, 1, 16, 16] against real ones."""
    fake = evaluator.features(generated.clamp(-1, 1))
    real = evaluator.features(reference)
    precision, recall = precision_recall(real, fake)
    return {
        "fd_digit": frechet_distance(
            *feature_statistics(fake.numpy()), *feature_statistics(real.numpy())
        ),
        "precision": precision,
        "recall": recall,
    }


@torch.no_grad()
def class_coverage_tv(
    evaluator: torch.nn.Module, generated: torch.Tensor, reference_labels: torch.Tensor
) -> float:
    """Mode coverage: total variation between the evaluator's class histogram of the samples
    and the class histogram of the real digits (0 = every class as often as in the data)."""
    classes = 10
    predicted = evaluator(generated.clamp(-1, 1)).argmax(1)
    fake = torch.bincount(predicted, minlength=classes).double() / len(predicted)
    real = torch.bincount(reference_labels.long(), minlength=classes).double()
    return float((fake - real / real.sum()).abs().sum() / 2)


class QualityCurve(Callback):
    """Quality vs training steps: at each main-stage step in ``at_steps`` the EMA model samples
    ``num_samples`` digits (fixed seed) and FD-digit / precision / recall are recorded."""

    def __init__(
        self,
        evaluator: torch.nn.Module,
        reference: torch.Tensor,
        at_steps: list[int],
        num_samples: int = 1000,
        sample_steps: int = 16,
        seed: int = 1234,
    ) -> None:
        self.evaluator, self.reference = evaluator, reference
        self.at_steps, self.num_samples = sorted(at_steps), num_samples
        self.sample_steps, self.seed = sample_steps, seed
        self.history: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer: Trainer, module: LightningModule, *args) -> None:
        step = module.main_stage_step
        if step in self.at_steps and not any(h["step"] == step for h in self.history):
            generator = torch.Generator().manual_seed(self.seed)
            _, texture = module.generate(self.num_samples, self.sample_steps, generator)
            self.history.append(
                {"step": step, **digit_quality(self.evaluator, texture.cpu(), self.reference)}
            )


def to_uint8_images(images: torch.Tensor) -> np.ndarray:
    """[N, 3, H, W] in [-1, 1] -> uint8 [N, H, W, 3] (the ADM batch layout)."""
    pixels = ((images.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return pixels.permute(0, 2, 3, 1).cpu().numpy()


def write_adm_batch(path: str | Path, images: torch.Tensor) -> Path:
    """Save samples as the ADM reference evaluator's ``.npz`` (key ``arr_0``, uint8 NHWC)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, arr_0=to_uint8_images(images))
    return path


def inception_fid(inception_weights: str | None, device: str | torch.device = "cpu"):
    """torchmetrics' FID (2048-d pool features) with Inception weights from a local file."""
    if inception_weights is None or not Path(inception_weights).is_file():
        raise UserError(
            "FID needs the FID Inception-v3 weights as a local file (torch-fidelity's "
            "weights-inception-2015-12-05-6726825d.pth, passed to learned-async-schedule-sample "
            "as --inception_weights); got "
            f"{inception_weights!r}. Nothing is downloaded at run time; copy the file here, or "
            "score the ADM .npz sample batch with the reference evaluator elsewhere."
        )
    from torchmetrics.image.fid import FrechetInceptionDistance

    return FrechetInceptionDistance(
        feature=2048, normalize=True, feature_extractor_weights_path=str(inception_weights)
    ).to(device)


class TrainingReport(Callback):
    """What a `uv run train` run learned, written when the fit ends into ``<log dir>/report/``:
    ``samples.png`` (64 unconditional samples, EMA weights), ``schedule.png`` (the schedule in
    use beside the identity and, for LAS, the probe's start schedule) and ``report.json``
    (FD-digit, precision/recall and class coverage against the validation digits, the probe
    report). Miniature only; paper-scale runs score with ``learned-async-schedule-sample``."""

    def __init__(self, num_samples: int = 500) -> None:
        self.num_samples = num_samples
        self.folder: Path | None = None

    def on_fit_end(self, trainer: Trainer, module: LightningModule) -> None:
        data = getattr(trainer, "datamodule", None)
        if trainer.fast_dev_run or getattr(data, "miniature", None) is None:
            return
        folder = Path(trainer.strategy.broadcast(trainer.log_dir or trainer.default_root_dir))
        if not trainer.is_global_zero:
            return
        self.folder = folder / "report"
        self.folder.mkdir(parents=True, exist_ok=True)
        evaluator = data.evaluator()
        images, labels = data.reference("val")
        module.eval()
        _, texture = module.generate(
            self.num_samples,
            generator=torch.Generator().manual_seed(0),
            labels=balanced_labels(self.num_samples, module.hparams.num_classes, module.device),
        )
        texture = texture.cpu()
        quality = digit_quality(evaluator, texture, images)
        quality["class_tv"] = class_coverage_tv(evaluator, texture, labels)
        curve = module.schedule_curve()
        start = module.probe_curves[0] if module.probe_curves else None
        report = {
            "schedule": module.hparams.schedule,
            "global_step": trainer.global_step,
            "main_stage_step": module.main_stage_step,
            "sample_steps": module.hparams.sample_steps,
            "validation_quality": quality,
            "max_lag": float((torch.linspace(0, 1, len(curve), dtype=curve.dtype) - curve).max()),
            "probe": {k: v for k, v in module.probe_report.items() if k != "gradients"},
        }
        (self.folder / "report.json").write_text(json.dumps(report, indent=1) + "\n")
        save_images(self.folder / "samples.png", texture[:64])
        save_schedule_plot(self.folder / "schedule.png", curve, start)
        print(
            f"[report] FD-digit {quality['fd_digit']:.1f} (validation, {self.num_samples} "
            f"samples), class TV {quality['class_tv']:.3f}, max lag {report['max_lag']:.3f} "
            f"-> {self.folder}"
        )


def balanced_labels(n: int, num_classes: int, device) -> torch.Tensor | None:
    """Every class equally often (conditional models); None for unconditional ones."""
    return torch.arange(n, device=device) % num_classes if num_classes else None


def save_images(path: Path, images: torch.Tensor, columns: int = 8) -> None:
    """[N, 1, H, W] in [-1, 1] -> a grayscale PNG grid."""
    from PIL import Image

    n, _, h, w = images.shape
    rows = -(-n // columns)
    grid = torch.full((rows * h, columns * w), -1.0)
    for i in range(n):
        r, c = divmod(i, columns)
        grid[r * h : (r + 1) * h, c * w : (c + 1) * w] = images[i, 0].clamp(-1, 1)
    pixels = ((grid + 1) * 127.5).round().to(torch.uint8).numpy()
    Image.fromarray(pixels).resize((columns * w * 4, rows * h * 4), Image.NEAREST).save(path)


def save_schedule_plot(path: Path, curve: torch.Tensor, start: torch.Tensor | None) -> None:
    """The schedule t_lag(tau) in use, the identity and (LAS) the probe's start schedule."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tau = np.linspace(0, 1, len(curve))
    fig, ax = plt.subplots(figsize=(4, 3.8), dpi=110)
    ax.plot(tau, tau, color="gray", lw=1, label="synchronous")
    if start is not None:
        ax.plot(tau, start.numpy(), ":", color="black", label="probe start")
    ax.plot(tau, curve.numpy(), lw=2, label="schedule in use (f*)")
    ax.set(xlabel="tau (semantic time)", ylabel="t_lag (texture time)")
    ax.legend(fontsize=8, frameon=False)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
