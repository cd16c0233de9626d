"""V-pretraining for vision (design note section 1.4): learned views valued by the downstream
loss decrease they predict. Pure torch, no Lightning, no I/O. [R] marks a reconstruction: the
abstract fixes the idea, not these equations.

A learner (student backbone f_theta and DINO head) is trained only by self-distillation on views
v_phi = A(x; a_phi(x, z)) that a lightweight designer a_phi builds per unlabeled batch:

    A(x; a)         bounded crop/zoom + shift, blur, contrast, brightness, clamp to [0, 1] (Eq. 1)
    a = lo + (hi - lo) * sigmoid(raw)          every view parameter inside its bounds   (Eq. 2)
    L_ssl(theta; v) = sum_{s != t} H(softmax((g_T(v_t) - c) / tau_T), softmax(g_theta(v_s) / tau_S))
                                                    DINO, two views cross-paired        (Eq. 3)
    c <- m_c c + (1 - m_c) mean g_T(v)          centre of the teacher logits            (Eq. 4)
    xi <- m xi + (1 - m) theta                  EMA teacher                             (Eq. 5)

Downstream value of a construction [R]: one learner step theta' = theta - eta P grad L_ssl gives,
to first order, L_down(theta') ~= L_down(theta) - V(phi) with

    u = P g_down,  g_down = grad_theta L_down(theta)   (P: Adam's diagonal, or I)      (Eq. 6)
    V(phi) = eta <u, grad_theta L_ssl(theta; v_phi)>
           ~= eta [L_ssl(theta + eps u; v_phi) - L_ssl(theta - eps u; v_phi)] / (2 eps) (Eq. 7)

two forwards with perturbed weights, differentiable w.r.t. phi through the views only. The
designer ascends V (Eq. 7) minus a pull towards the identity view (Eq. 8); the learner takes its
DINO step on the views detached, so downstream labels never reach theta.

    R(a) = mean_k ((a_k - a_k^id) / (hi_k - lo_k))^2                                   (Eq. 8)

Downstream losses on frozen patch features h (linear probes, per patch, upsampled to pixels):

    L_down = CE(up(W_s h), mask; ignore) + lambda_d * L1(up(W_d h), depth; depth > 0)  (Eq. 9)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

# The view parameters, in this order along the last axis of every params tensor.
VIEW_PARAMS = ("scale", "shift_x", "shift_y", "brightness", "contrast", "blur_sigma")
NUM_VIEW_PARAMS = len(VIEW_PARAMS)
MIN_BLUR_SIGMA = 1e-2  # a Gaussian this narrow is a unit impulse on the pixel grid


@dataclass(frozen=True)
class ViewBounds:
    """Bounds of Eq. 2: crop side in [min_scale, 1] of the image side, shifts that keep the crop
    inside the image, additive brightness in [-b, b], contrast factor in [1 - c, 1 + c] and blur
    sigma in [0, max_blur_sigma] pixels."""

    min_scale: float = 0.5
    max_brightness: float = 0.3
    max_contrast: float = 0.3
    max_blur_sigma: float = 1.0

    def identity(self, *batch: int) -> torch.Tensor:
        """The parameters of the identity view, shape [*batch, 6]."""
        return torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 0.0]).expand(*batch, NUM_VIEW_PARAMS)


def params_from_unit(unit: torch.Tensor, bounds: ViewBounds) -> torch.Tensor:
    """Eq. 2: map unit coordinates [..., 6] in [0, 1] to view parameters [..., 6] in bounds.

    The shift range depends on the scale, |shift| <= 1 - scale, so that the crop stays inside.
    """
    u_scale, u_x, u_y, u_brightness, u_contrast, u_sigma = unit.unbind(-1)
    scale = bounds.min_scale + (1 - bounds.min_scale) * u_scale
    return torch.stack(
        [
            scale,
            (1 - scale) * (2 * u_x - 1),
            (1 - scale) * (2 * u_y - 1),
            bounds.max_brightness * (2 * u_brightness - 1),
            1 + bounds.max_contrast * (2 * u_contrast - 1),
            bounds.max_blur_sigma * u_sigma,
        ],
        dim=-1,
    )


def identity_distance(params: torch.Tensor, bounds: ViewBounds) -> torch.Tensor:
    """Eq. 8: mean squared distance [...] of params [..., 6] from the identity view, each
    parameter in units of its range (a zero range contributes nothing)."""
    spans = torch.tensor(
        [
            1 - bounds.min_scale,
            1 - bounds.min_scale,
            1 - bounds.min_scale,
            2 * bounds.max_brightness,
            2 * bounds.max_contrast,
            bounds.max_blur_sigma,
        ],
        dtype=params.dtype,
        device=params.device,
    )
    identity = bounds.identity(1).to(params)[0]
    return ((params - identity) / spans.clamp_min(1e-8)).pow(2).mean(-1)


def gaussian_blur(images: torch.Tensor, sigma: torch.Tensor, radius: int) -> torch.Tensor:
    """Separable Gaussian blur of images [N, C, H, W] with a per-image sigma [N] (pixels),
    differentiable in sigma; reflect padding keeps the size."""
    n, c, h, w = images.shape
    offsets = torch.arange(-radius, radius + 1, dtype=images.dtype, device=images.device)
    sigma = sigma.clamp_min(MIN_BLUR_SIGMA)[:, None]  # [N, 1]
    kernel = torch.exp(-0.5 * (offsets / sigma) ** 2)
    kernel = (kernel / kernel.sum(-1, keepdim=True)).repeat_interleave(c, dim=0)  # [N*C, 2r+1]
    flat = images.reshape(1, n * c, h, w)
    flat = F.pad(flat, (radius, radius, 0, 0), mode="reflect")
    flat = F.conv2d(flat, kernel[:, None, None, :], groups=n * c)
    flat = F.pad(flat, (0, 0, radius, radius), mode="reflect")
    flat = F.conv2d(flat, kernel[:, None, :, None], groups=n * c)
    return flat.reshape(n, c, h, w)


def apply_views(
    images: torch.Tensor, params: torch.Tensor, bounds: ViewBounds = ViewBounds()
) -> torch.Tensor:
    """Eq. 1: views [N, C, H, W] of images [N, C, H, W] in [0, 1] under params [N, 6].

    Crop/zoom by an affine sampling grid (output keeps the input size), then blur, contrast
    around each view's mean, brightness, and a clamp to the valid pixel range. Differentiable in
    params (except where the clamp saturates); the identity params reproduce the input.
    """
    scale, shift_x, shift_y, brightness, contrast, sigma = params.unbind(-1)  # each [N]
    zero = torch.zeros_like(scale)
    affine = torch.stack(
        [torch.stack([scale, zero, shift_x], -1), torch.stack([zero, scale, shift_y], -1)], -2
    )  # [N, 2, 3]
    grid = F.affine_grid(affine, list(images.shape), align_corners=False)
    views = F.grid_sample(images, grid, mode="bilinear", padding_mode="border", align_corners=False)
    radius = max(1, math.ceil(3 * bounds.max_blur_sigma))
    views = gaussian_blur(views, sigma, radius)
    mean = views.mean(dim=(1, 2, 3), keepdim=True)
    views = (views - mean) * contrast[:, None, None, None] + mean + brightness[:, None, None, None]
    return views.clamp(0.0, 1.0)


def fixed_augment_params(
    batch: int, generator: torch.Generator, bounds: ViewBounds = ViewBounds()
) -> torch.Tensor:
    """The fixed DINO-style baseline: params [batch, 2, 6] of two views per image.

    Crop area uniform in [min_scale^2, 1] (RandomResizedCrop), shift uniform inside the image,
    brightness/contrast jitter with probability 0.8, blur with probability 1.0 on the first view
    and 0.1 on the second (DINO's asymmetric pair), sigma uniform in [0.1, 1] x max_blur_sigma.
    """
    unit = torch.rand(batch, 2, NUM_VIEW_PARAMS, generator=generator)
    area = bounds.min_scale**2 + (1 - bounds.min_scale**2) * unit[..., 0]
    unit[..., 0] = (area.sqrt() - bounds.min_scale) / max(1 - bounds.min_scale, 1e-8)
    jitter = torch.rand(batch, 2, 1, generator=generator) < 0.8
    unit[..., 3:5] = torch.where(jitter, unit[..., 3:5], 0.5)  # 0.5 is no jitter
    blurred = torch.rand(batch, 2, generator=generator) < torch.tensor([1.0, 0.1])
    unit[..., 5] = torch.where(blurred, 0.1 + 0.9 * unit[..., 5], 0.0)
    return params_from_unit(unit, bounds)


def random_view_params(
    batch: int, generator: torch.Generator, bounds: ViewBounds = ViewBounds()
) -> torch.Tensor:
    """The random-views baseline: params [batch, 2, 6] uniform in the unit cube of Eq. 2, i.e.
    the designer's range with no designer."""
    return params_from_unit(torch.rand(batch, 2, NUM_VIEW_PARAMS, generator=generator), bounds)


class ViewDesigner(nn.Module):
    """a_phi(x, z): a tiny CNN from an image and per-view noise to bounded params (Eq. 2), the
    Viewmaker recipe of bounded learned views [R: architecture]. The noise makes the two views
    of an image differ."""

    def __init__(
        self, in_channels: int, bounds: ViewBounds, width: int = 16, noise_dim: int = 8
    ) -> None:
        super().__init__()
        self.bounds, self.noise_dim = bounds, noise_dim
        self.encoder = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, stride=2, padding=1),
            nn.GELU(),
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1),
            nn.GELU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.head = nn.Sequential(
            nn.Linear(2 * width + noise_dim, 2 * width),
            nn.GELU(),
            nn.Linear(2 * width, NUM_VIEW_PARAMS),
        )

    def forward(self, images: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """images [B, C, H, W] (normalised), noise [B, V, noise_dim] -> params [B, V, 6]."""
        features = self.encoder(images)[:, None].expand(-1, noise.shape[1], -1)  # [B, V, F]
        raw = self.head(torch.cat([features, noise], dim=-1))
        return params_from_unit(torch.sigmoid(raw), self.bounds)


class DinoHead(nn.Module):
    """g: the DINO projection head, MLP -> l2-normalised bottleneck -> prototype logits
    (DINO's weight-normalised last layer is a plain linear map here)."""

    def __init__(
        self, in_dim: int, out_dim: int = 128, hidden_dim: int = 128, bottleneck_dim: int = 32
    ) -> None:
        super().__init__()
        self.mlp = nn.Sequential(
            nn.Linear(in_dim, hidden_dim), nn.GELU(), nn.Linear(hidden_dim, bottleneck_dim)
        )
        self.prototypes = nn.Linear(bottleneck_dim, out_dim, bias=False)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """[..., in_dim] -> logits [..., out_dim]."""
        return self.prototypes(F.normalize(self.mlp(features), dim=-1))


def dino_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    center: torch.Tensor,
    student_temp: float,
    teacher_temp: float,
) -> torch.Tensor:
    """Eq. 3: mean over the ordered pairs of different views (s, t) and the batch of the cross
    entropy of the centred, sharpened teacher softmax of view t against the student's
    log-softmax of view s. Logits [V, B, K], center [K].

    No stop-gradient inside: the teacher has no trainable parameters, and the value (Eq. 7)
    needs the gradient through the teacher's views; the learner's step detaches the views.
    """
    targets = F.softmax((teacher_logits - center) / teacher_temp, dim=-1)  # [V, B, K]
    log_probs = F.log_softmax(student_logits / student_temp, dim=-1)  # [V, B, K]
    cross = -torch.einsum("tbk,sbk->tsb", targets, log_probs)  # [V_teacher, V_student, B]
    views = cross.shape[0]
    off_diagonal = ~torch.eye(views, dtype=torch.bool, device=cross.device)
    return cross[off_diagonal].mean()


@torch.no_grad()
def update_center(
    center: torch.Tensor, teacher_logits: torch.Tensor, momentum: float
) -> torch.Tensor:
    """Eq. 4: the new centre [K] from teacher logits [V, B, K]."""
    return momentum * center + (1 - momentum) * teacher_logits.mean(dim=(0, 1))


@torch.no_grad()
def ema_update(teacher: nn.Module, student: nn.Module, momentum: float) -> None:
    """Eq. 5, in place: every teacher parameter <- m teacher + (1 - m) student."""
    for teacher_param, student_param in zip(
        teacher.parameters(), student.parameters(), strict=True
    ):
        teacher_param.mul_(momentum).add_(student_param.detach(), alpha=1 - momentum)


Tensors = dict[str, torch.Tensor]


def global_norm(tensors: Tensors) -> torch.Tensor:
    """||x|| of a dict of tensors taken as one flat vector."""
    return torch.sqrt(sum(t.pow(2).sum() for t in tensors.values()))


def adam_preconditioner(exp_avg_sq: Tensors, step: int, beta2: float, eps: float) -> Tensors:
    """P of Eq. 6 for Adam(W) [R]: diag(1 / (sqrt(v_hat) + eps)), v_hat = v / (1 - beta2^step),
    the second-moment state frozen at the current step."""
    correction = 1 - beta2**step
    return {name: 1.0 / ((v / correction).sqrt() + eps) for name, v in exp_avg_sq.items()}


def downstream_direction(gradient: Tensors, preconditioner: Tensors | None) -> Tensors:
    """Eq. 6: u = P g_down (P = I when ``preconditioner`` is None)."""
    if preconditioner is None:
        return {name: g.detach().clone() for name, g in gradient.items()}
    return {name: preconditioner[name] * g.detach() for name, g in gradient.items()}


def random_direction_like(direction: Tensors, generator: torch.Generator) -> Tensors:
    """The negative control's direction: Gaussian, rescaled to the global norm of ``direction``,
    so it differs from u in direction only."""
    noise = {
        name: torch.randn(u.shape, generator=generator, dtype=u.dtype).to(u.device)
        for name, u in direction.items()
    }
    ratio = global_norm(direction) / global_norm(noise).clamp_min(1e-30)
    return {name: n * ratio for name, n in noise.items()}


def finite_difference_value(
    ssl_loss: Callable[[Tensors], torch.Tensor],
    params: Tensors,
    direction: Tensors,
    lr: float,
    radius: float,
) -> torch.Tensor:
    """Eq. 7 [R]: V ~= eta [L_ssl(theta + eps u) - L_ssl(theta - eps u)] / (2 eps), a central
    difference whose weight perturbation has norm ``radius`` (eps = radius / ||u||).

    ``ssl_loss(params)`` runs the learner with the given parameters (torch.func.functional_call);
    theta and u are detached, so the result is differentiable only through what ``ssl_loss``
    closes over (the views).
    """
    eps = radius / global_norm(direction).clamp_min(1e-30)
    plus = {name: p.detach() + eps * direction[name] for name, p in params.items()}
    minus = {name: p.detach() - eps * direction[name] for name, p in params.items()}
    return lr * (ssl_loss(plus) - ssl_loss(minus)) / (2 * eps)


def patch_grid(hidden_states: torch.Tensor, num_prefix_tokens: int, grid: tuple[int, int]):
    """Patch tokens of a ViT's last hidden states [B, prefix + h*w, D] as a map [B, D, h, w]
    (the prefix is the CLS and register tokens)."""
    patches = hidden_states[:, num_prefix_tokens:]  # [B, h*w, D]
    return patches.transpose(1, 2).reshape(patches.shape[0], -1, *grid)


class DenseHeads(nn.Module):
    """The linear probes of Eq. 9: per-patch segmentation logits and depth (1x1 convolutions),
    bilinearly upsampled to the pixel grid."""

    def __init__(self, feature_dim: int, num_classes: int) -> None:
        super().__init__()
        self.segmentation = nn.Conv2d(feature_dim, num_classes, kernel_size=1)
        self.depth = nn.Conv2d(feature_dim, 1, kernel_size=1)

    def forward(self, features: torch.Tensor, size: tuple[int, int]):
        """features [B, D, h, w] -> (segmentation logits [B, K, H, W], depth [B, H, W])."""
        logits = F.interpolate(
            self.segmentation(features), size=size, mode="bilinear", align_corners=False
        )
        depth = F.interpolate(self.depth(features), size=size, mode="bilinear", align_corners=False)
        return logits, depth[:, 0]


def downstream_loss(
    heads: DenseHeads,
    features: torch.Tensor,
    masks: torch.Tensor,
    depth: torch.Tensor,
    ignore_index: int,
    depth_weight: float = 1.0,
) -> torch.Tensor:
    """Eq. 9: pixel cross entropy over labelled pixels (mask != ignore_index) plus
    depth_weight x L1 over valid depth (> 0). features [B, D, h, w], masks [B, H, W] int64,
    depth [B, H, W] metres. A batch with no labelled pixel of a kind contributes 0 for it (a
    mixture of segmentation-only and depth-only images)."""
    logits, predicted_depth = heads(features, tuple(masks.shape[-2:]))
    labelled = (masks != ignore_index).sum().clamp_min(1)
    cross_entropy = (
        F.cross_entropy(logits, masks, ignore_index=ignore_index, reduction="sum") / labelled
    )
    valid = depth > 0
    l1 = ((predicted_depth - depth).abs() * valid).sum() / valid.sum().clamp_min(1)
    return cross_entropy + depth_weight * l1


def fit_dense_heads(
    heads: DenseHeads,
    features: torch.Tensor,
    masks: torch.Tensor,
    depth: torch.Tensor,
    steps: int,
    lr: float,
    ignore_index: int,
    depth_weight: float = 1.0,
) -> float:
    """Minimise Eq. 9 over the heads only, ``steps`` full-batch Adam steps on frozen features
    (a fresh Adam each call, so nothing outside the heads' weights persists). Returns the last
    loss."""
    features = features.detach()
    optimizer = torch.optim.Adam(heads.parameters(), lr=lr)
    loss = torch.zeros(())
    with torch.enable_grad():
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            loss = downstream_loss(heads, features, masks, depth, ignore_index, depth_weight)
            loss.backward()
            optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def per_image_miou(
    predicted: torch.Tensor, target: torch.Tensor, num_classes: int, ignore_index: int
) -> torch.Tensor:
    """mIoU of each image [B] from label maps [B, H, W]: the mean IoU over the classes present
    in that image's ground truth or prediction, over labelled pixels. NaN for an image without
    a labelled pixel (per-image mIoU is undefined there). Per-image, not ADE20K's dataset-level
    mIoU, so that methods can be compared paired per image."""
    labelled = target != ignore_index  # [B, H, W]
    target_hot = F.one_hot(torch.where(labelled, target, 0), num_classes).bool()
    predicted_hot = F.one_hot(predicted.clamp(0, num_classes - 1), num_classes).bool()
    target_hot &= labelled[..., None]
    predicted_hot &= labelled[..., None]
    intersection = (target_hot & predicted_hot).sum(dim=(1, 2)).float()  # [B, K]
    union = (target_hot | predicted_hot).sum(dim=(1, 2)).float()
    present = union > 0
    miou = (intersection / union.clamp_min(1) * present).sum(1) / present.sum(1).clamp_min(1)
    return torch.where(labelled.flatten(1).any(1), miou, torch.nan)


def per_image_depth_rmse(predicted: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Root mean squared depth error [B] over each image's valid pixels (target > 0), maps
    [B, H, W] in metres; NaN for an image without valid depth."""
    valid = target > 0
    squared = ((predicted - target) ** 2 * valid).flatten(1).sum(1)
    count = valid.flatten(1).sum(1)
    return torch.where(count > 0, (squared / count.clamp_min(1)).sqrt(), torch.nan)
