"""The vision LightningModule: a DINOv3 learner trained by DINO self-distillation on views that a
designer builds to increase the downstream value (vision_core, Eqs. 1-9). Wiring only.

One training step [R: the loop of design note 1.5]:

1. every ``refresh_every`` steps: refit the dense heads a few steps on frozen features of a
   feedback minibatch, then g_down through the backbone with the heads fixed, u = P g_down
   (Eq. 6), cached in the checkpoint (``value_direction=random``: a random u of the same norm);
2. views of the unlabeled batch: designer (``learned``), fixed DINO augmentations (``fixed``) or
   uniform random params (``random``);
3. designer objective: -V / (eta ||u||) + identity_weight * R(a) (Eqs. 7, 8), V by the central
   difference with perturbed weights, differentiable only through the views;
4. learner objective: DINO (Eq. 3) on the views DETACHED; EMA teacher (Eq. 5) after the step.

The designer's and the learner's objectives are summed into one backward and one optimizer
step: AdamW with two parameter groups, the learner's (``lr``, ``weight_decay``) and the
designer's (``designer_lr``, no weight decay: Adam). Their gradients are disjoint (the value
sees theta detached, the learner sees the views detached), so this equals a designer step then a
learner step on the views built before it (the loop of 1.5), while ``global_step`` counts
learner steps, Lightning's gradient clipping, accumulation and DDP apply unchanged, and
resuming restores both groups' state.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from jsonargparse.typing import (
    ClosedUnitInterval,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
)
from lightning.pytorch import LightningModule
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from torch.func import functional_call
from transformers import DINOv3ViTConfig, DINOv3ViTModel

from papers_cli import ConfigError
from papers_gpu import derived_seed, run_seed
from vpretrain.vision_core import (
    VIEW_PARAMS,
    DenseHeads,
    DinoHead,
    ViewBounds,
    ViewDesigner,
    adam_preconditioner,
    apply_views,
    dino_loss,
    downstream_direction,
    downstream_loss,
    ema_update,
    finite_difference_value,
    fit_dense_heads,
    fixed_augment_params,
    global_norm,
    identity_distance,
    patch_grid,
    per_image_depth_rmse,
    per_image_miou,
    random_direction_like,
    random_view_params,
    update_center,
)

# DINOv3's RoPE augmentations draw random coordinates in training mode; the value's two
# perturbed forwards must see the same function, so they are switched off.
DETERMINISTIC_ROPE = {"pos_embed_shift": None, "pos_embed_jitter": None, "pos_embed_rescale": None}


def build_backbone(
    pretrained: str | None,
    image_size: int,
    num_channels: int,
    patch_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_register_tokens: int,
) -> DINOv3ViTModel:
    """A DINOv3 ViT from a local checkpoint folder, or built from a small config."""
    if pretrained is not None:
        if not (Path(pretrained) / "config.json").is_file():
            raise ConfigError(
                f"--model.pretrained={pretrained} is not a folder with a DINOv3 checkpoint "
                "(config.json and model.safetensors, as save_pretrained writes them); download "
                "one from the DINOv3 release and pass its local path (nothing is fetched here)."
            )
        return DINOv3ViTModel.from_pretrained(pretrained, **DETERMINISTIC_ROPE)
    config = DINOv3ViTConfig(
        image_size=image_size,
        num_channels=num_channels,
        patch_size=patch_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_register_tokens=num_register_tokens,
        **DETERMINISTIC_ROPE,
    )
    return DINOv3ViTModel(config)


def fit_linear_probe(features: np.ndarray, labels: np.ndarray):
    """The "don't collapse" guard: logistic regression on standardised pooled features."""
    probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
    return probe.fit(features, labels)


class VisionVPretrainModule(LightningModule):
    """Learner (student DINOv3 + DINO head, EMA teacher), designer and dense heads.

    ``view_mode``: learned (the method), fixed (DINO augmentations), random (uniform params).
    ``value_direction``: downstream (u = P g_down) or random (same norm: the negative control).
    ``preconditioner``: adam (the learner's second moments; identity before the first step) or
    identity.
    """

    def __init__(
        self,
        pretrained: str | None = None,
        image_size: PositiveInt = 32,
        num_channels: PositiveInt = 1,
        num_classes: PositiveInt = 11,
        ignore_index: NonNegativeInt = 255,
        patch_size: PositiveInt = 4,
        hidden_size: PositiveInt = 64,
        num_layers: PositiveInt = 2,
        num_heads: PositiveInt = 4,
        num_register_tokens: NonNegativeInt = 2,
        pixel_mean: tuple[NonNegativeFloat, ...] = (0.5,),
        pixel_std: tuple[PositiveFloat, ...] = (0.5,),
        view_mode: Literal["learned", "fixed", "random"] = "learned",
        value_direction: Literal["downstream", "random"] = "downstream",
        preconditioner: Literal["adam", "identity"] = "adam",
        lr: PositiveFloat = 1e-3,
        weight_decay: NonNegativeFloat = 0.04,
        designer_lr: PositiveFloat = 1e-3,
        dino_out_dim: PositiveInt = 128,
        student_temp: PositiveFloat = 0.1,
        teacher_temp: PositiveFloat = 0.04,
        center_momentum: ClosedUnitInterval = 0.9,
        teacher_momentum: ClosedUnitInterval = 0.99,
        min_scale: ClosedUnitInterval = 0.5,
        max_brightness: NonNegativeFloat = 0.3,
        max_contrast: NonNegativeFloat = 0.3,
        max_blur_sigma: NonNegativeFloat = 1.0,
        identity_weight: NonNegativeFloat = 0.1,
        fd_radius: PositiveFloat = 1e-2,
        refresh_every: PositiveInt = 5,
        head_refit_steps: PositiveInt = 10,
        head_lr: PositiveFloat = 0.05,
        depth_weight: NonNegativeFloat = 1.0,
        eval_head_steps: PositiveInt = 200,
        eval_head_lr: PositiveFloat = 0.05,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        if len(pixel_mean) != len(pixel_std) or len(pixel_mean) not in (1, num_channels):
            raise ConfigError(
                f"--model.pixel_mean and --model.pixel_std need 1 or num_channels={num_channels} "
                f"values each (got {len(pixel_mean)} and {len(pixel_std)})"
            )
        self.backbone = build_backbone(
            pretrained,
            image_size,
            num_channels,
            patch_size,
            hidden_size,
            num_layers,
            num_heads,
            num_register_tokens,
        )
        config = self.backbone.config
        self.num_prefix_tokens = 1 + config.num_register_tokens  # CLS + registers
        self.grid = (image_size // config.patch_size,) * 2
        self.head = DinoHead(config.hidden_size, dino_out_dim)
        self.teacher_backbone = copy.deepcopy(self.backbone).requires_grad_(False)
        self.teacher_head = copy.deepcopy(self.head).requires_grad_(False)
        self.bounds = ViewBounds(min_scale, max_brightness, max_contrast, max_blur_sigma)
        self.designer = ViewDesigner(config.num_channels, self.bounds)
        self.heads = DenseHeads(config.hidden_size, num_classes)
        self.register_buffer("pixel_mean", torch.tensor(pixel_mean).view(1, -1, 1, 1))
        self.register_buffer("pixel_std", torch.tensor(pixel_std).view(1, -1, 1, 1))
        self.register_buffer("center", torch.zeros(dino_out_dim))
        num_backbone = sum(p.numel() for p in self.backbone.parameters())
        self.register_buffer("direction", torch.zeros(num_backbone))  # the cached u, flat
        self.register_buffer("designer_init", self.flat_designer().clone())

    # ----------------------------------------------------------------- features and logits

    def normalise(self, images: torch.Tensor) -> torch.Tensor:
        return (images - self.pixel_mean) / self.pixel_std

    def student_logits(self, views: torch.Tensor, backbone_params=None) -> torch.Tensor:
        """DINO logits [N, K] of views [N, C, H, W] under the student's backbone, or under
        ``backbone_params`` (name -> tensor) with the head's weights detached."""
        pixels = self.normalise(views)
        if backbone_params is None:
            return self.head(self.backbone(pixel_values=pixels).pooler_output)
        output = functional_call(self.backbone, backbone_params, (), {"pixel_values": pixels})
        head_params = {name: p.detach() for name, p in self.head.named_parameters()}
        return functional_call(self.head, head_params, (output.pooler_output,))

    def teacher_logits(self, views: torch.Tensor) -> torch.Tensor:
        """The EMA teacher's logits [N, K]; differentiable w.r.t. the views only."""
        return self.teacher_head(
            self.teacher_backbone(pixel_values=self.normalise(views)).pooler_output
        )

    def features(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The student backbone's pooled features [B, 2D] (CLS and mean patch token, DINOv2's
        linear-probe input) and patch map [B, D, h, w]."""
        output = self.backbone(pixel_values=self.normalise(images))
        patches = patch_grid(output.last_hidden_state, self.num_prefix_tokens, self.grid)
        return torch.cat([output.pooler_output, patches.mean(dim=(2, 3))], dim=-1), patches

    # ----------------------------------------------------------------- the downstream direction

    def backbone_params(self) -> dict[str, torch.Tensor]:
        return dict(self.backbone.named_parameters())

    def direction_dict(self) -> dict[str, torch.Tensor]:
        """The cached u as name -> tensor shaped like the backbone's parameters."""
        params = self.backbone_params()
        pieces = self.direction.split([p.numel() for p in params.values()])
        return {
            name: piece.view_as(p) for (name, p), piece in zip(params.items(), pieces, strict=True)
        }

    def adam_state_preconditioner(self) -> dict[str, torch.Tensor] | None:
        """P of Eq. 6 from the learner's AdamW state; None (P = I) when ``preconditioner`` is
        identity or before the first step (no second moments yet)."""
        if self.hparams.preconditioner == "identity":
            return None
        optimizer = self.optimizers().optimizer
        states = {name: optimizer.state.get(p, {}) for name, p in self.backbone_params().items()}
        if not all("exp_avg_sq" in state for state in states.values()):
            return None
        group = optimizer.param_groups[0]
        step = int(next(iter(states.values()))["step"])
        second_moments = {name: state["exp_avg_sq"] for name, state in states.items()}
        return adam_preconditioner(second_moments, step, group["betas"][1], group["eps"])

    def refresh_direction(
        self, feedback: dict[str, torch.Tensor], preconditioner, refresh_index: int
    ) -> float:
        """Step 1: refit the dense heads on frozen features of ``feedback``, then cache
        u = P g_down (or a random direction of the same norm). Returns the downstream loss."""
        h = self.hparams
        images, masks, depth = (feedback[k].to(self.device) for k in ("image", "mask", "depth"))
        with torch.no_grad():
            frozen = self.features(images)[1]
        fit_dense_heads(
            self.heads,
            frozen,
            masks,
            depth,
            h.head_refit_steps,
            h.head_lr,
            h.ignore_index,
            h.depth_weight,
        )
        params = self.backbone_params()
        with torch.enable_grad():
            loss = downstream_loss(
                self.heads, self.features(images)[1], masks, depth, h.ignore_index, h.depth_weight
            )
            # autograd.grad, not backward: nothing is accumulated into the learner's .grad. The
            # mask token (used only for masked inputs) gets a zero gradient.
            gradient = torch.autograd.grad(
                loss, list(params.values()), allow_unused=True, materialize_grads=True
            )
        direction = downstream_direction(dict(zip(params, gradient, strict=True)), preconditioner)
        if h.value_direction == "random":
            generator = torch.Generator().manual_seed(derived_seed(run_seed(), refresh_index))
            direction = random_direction_like(direction, generator)
        self.direction.copy_(torch.cat([d.flatten() for d in direction.values()]))
        return loss.item()

    # ----------------------------------------------------------------- views and objectives

    def view_params(self, images: torch.Tensor) -> torch.Tensor:
        """Step 2: params [B, 2, 6] of two views per image, drawn from the global generator
        (re-seeded every step by the CLI, so a resumed run draws the same)."""
        batch = images.shape[0]
        mode = self.hparams.view_mode
        if mode == "learned":
            noise = torch.randn(batch, 2, self.designer.noise_dim).to(images)
            return self.designer(self.normalise(images), noise)
        generator = torch.Generator().manual_seed(int(torch.randint(0, 2**62, ())))
        draw = fixed_augment_params if mode == "fixed" else random_view_params
        return draw(batch, generator, self.bounds).to(images)

    def value(self, views: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
        """Eq. 7: V of the views [2B, C, H, W] along the cached u, differentiable through the
        views (and the teacher's logits of them) only; in float32 even under mixed precision,
        since it is the difference of two nearly equal losses."""
        h = self.hparams

        def ssl_loss(backbone_params):
            student = self.student_logits(views, backbone_params).view(teacher_logits.shape)
            return dino_loss(student, teacher_logits, self.center, h.student_temp, h.teacher_temp)

        with torch.autocast(self.device.type, enabled=False):
            return finite_difference_value(
                ssl_loss, self.backbone_params(), self.direction_dict(), h.lr, h.fd_radius
            )

    def losses(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """Steps 2-4 on an unlabeled batch [B, C, H, W]: the learner's DINO loss on detached
        views, the designer's objective (0 unless learned) and what they came from."""
        h = self.hparams
        batch = images.shape[0]
        params = self.view_params(images)  # [B, 2, 6]
        views = apply_views(
            images.repeat(2, 1, 1, 1),
            params.transpose(0, 1).reshape(-1, len(VIEW_PARAMS)),
            self.bounds,
        )  # [2B, C, H, W], view-major
        teacher = self.teacher_logits(views).view(2, batch, -1)  # [2, B, K]
        student = self.student_logits(views.detach()).view(2, batch, -1)
        ssl = dino_loss(student, teacher.detach(), self.center, h.student_temp, h.teacher_temp)
        out = {"ssl": ssl, "params": params, "views": views, "teacher_logits": teacher.detach()}
        if h.view_mode == "learned":
            value = self.value(views, teacher)
            per_unit_step = value / (h.lr * global_norm(self.direction_dict()).clamp_min(1e-30))
            regulariser = identity_distance(params, self.bounds).mean()
            out.update(value=value, designer=-per_unit_step + h.identity_weight * regulariser)
        else:
            out["designer"] = torch.zeros((), device=self.device)
        return out

    # ----------------------------------------------------------------- Lightning hooks

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        h = self.hparams
        if self.global_step % h.refresh_every == 0:
            refresh = self.global_step // h.refresh_every
            feedback = self.trainer.datamodule.feedback_batch(refresh)
            down = self.refresh_direction(feedback, self.adam_state_preconditioner(), refresh)
            self.log("train/downstream_loss", down)
        out = self.losses(batch["image"])
        self.center.copy_(update_center(self.center, out["teacher_logits"], h.center_momentum))
        identity = self.bounds.identity(1).to(out["params"])[0]
        deviation = (out["params"].detach() - identity).abs().mean(dim=(0, 1))  # [6]
        self.log_dict(
            {
                f"views/{name}_from_identity": d
                for name, d in zip(VIEW_PARAMS, deviation, strict=True)
            }
        )
        self.log("train/ssl_loss", out["ssl"], prog_bar=True)
        self.log("train/direction_norm", self.direction.norm())
        if "value" in out:
            self.log("train/value", out["value"].detach(), prog_bar=True)
            self.log("train/designer_movement", self.designer_movement())
        return out["ssl"] + out["designer"]

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        momentum = self.hparams.teacher_momentum
        ema_update(self.teacher_backbone, self.backbone, momentum)
        ema_update(self.teacher_head, self.head, momentum)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        h = self.hparams
        learner = [*self.backbone.parameters(), *self.head.parameters()]
        return torch.optim.AdamW(
            [
                {"params": learner, "lr": h.lr, "weight_decay": h.weight_decay},
                {
                    "params": list(self.designer.parameters()),
                    "lr": h.designer_lr,
                    "weight_decay": 0.0,
                },
            ]
        )

    def flat_designer(self) -> torch.Tensor:
        return torch.cat([p.detach().flatten() for p in self.designer.parameters()])

    def designer_movement(self) -> torch.Tensor:
        """||phi - phi_0|| / ||phi_0||: how far the designer has moved from its initialisation."""
        return (self.flat_designer() - self.designer_init).norm() / self.designer_init.norm()

    # ----------------------------------------------------------------- evaluation

    @torch.no_grad()
    def embed(self, loader) -> dict[str, torch.Tensor]:
        """Pooled features, patch maps and every label of a loader's items, on this device."""
        parts: dict[str, list[torch.Tensor]] = {}
        for batch in loader:
            pooled, patches = self.features(batch["image"].to(self.device))
            items = {"pooled": pooled, "patches": patches}
            items.update({k: v.to(self.device) for k, v in batch.items() if k != "image"})
            for key, value in items.items():
                parts.setdefault(key, []).append(value)
        return {key: torch.cat(values) for key, values in parts.items()}

    def on_test_start(self) -> None:
        """Fit the probes on frozen student features: fresh dense heads on the feedback split,
        logistic regression on the probe-train split. Lightning tests under inference mode,
        in which nothing can be fitted by gradient; it is lifted here."""
        with torch.inference_mode(False):
            self.fit_probes()

    def fit_probes(self) -> None:
        h, data = self.hparams, self.trainer.datamodule
        feedback = self.embed(data.loader(data.splits["feedback"], data.hparams.eval_batch_size))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)  # the same probe initialisation for every method
            self.evaluation_heads = DenseHeads(self.backbone.config.hidden_size, h.num_classes)
        self.evaluation_heads.to(self.device)
        fit_dense_heads(
            self.evaluation_heads,
            feedback["patches"],
            feedback["mask"],
            feedback["depth"],
            h.eval_head_steps,
            h.eval_head_lr,
            h.ignore_index,
            h.depth_weight,
        )
        probe_train = self.embed(
            data.loader(data.splits["probe_train"], data.hparams.eval_batch_size)
        )
        self.probe = fit_linear_probe(
            probe_train["pooled"].float().cpu().numpy(), probe_train["label"].cpu().numpy()
        )
        self.test_items: dict[str, list[np.ndarray]] = {
            "seg_miou": [],
            "depth_rmse": [],
            "probe_correct": [],
        }

    def test_step(self, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Per item: mIoU and depth RMSE on the evaluation scenes (loader 0), probe correctness
        on the probe test set (loader 1); averaged in on_test_epoch_end."""
        pooled, patches = self.features(batch["image"])
        if dataloader_idx == 0:
            logits, depth = self.evaluation_heads(patches, tuple(batch["mask"].shape[-2:]))
            miou = per_image_miou(
                logits.argmax(1), batch["mask"], self.hparams.num_classes, self.hparams.ignore_index
            )
            self.test_items["seg_miou"].append(miou.cpu().numpy())
            self.test_items["depth_rmse"].append(
                per_image_depth_rmse(depth, batch["depth"]).cpu().numpy()
            )
        else:
            predicted = self.probe.predict(pooled.float().cpu().numpy())
            correct = (predicted == batch["label"].cpu().numpy()).astype(np.float64)
            self.test_items["probe_correct"].append(correct)

    def on_test_epoch_end(self) -> None:
        items = self.per_item_results()
        self.log("test/seg_miou", float(np.nanmean(items["seg_miou"])))
        self.log("test/depth_rmse", float(np.nanmean(items["depth_rmse"])))
        self.log("test/probe_accuracy", float(items["probe_correct"].mean()))

    def per_item_results(self) -> dict[str, np.ndarray]:
        """The last test run's per-item metrics: seg_miou and depth_rmse per evaluation scene,
        probe_correct (0/1) per probe test item."""
        return {key: np.concatenate(parts) for key, parts in self.test_items.items()}
