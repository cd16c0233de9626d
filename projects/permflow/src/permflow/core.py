"""PermFlow: conditional flow matching on the affine hull of the Birkhoff polytope.

Notation (rows = items, columns = ranks / assigned items; ``J = 1 1^T``, ``H = I - J/n``):

    (1) A_n = {X in R^{n x n} : X 1 = 1, X^T 1 = 1}           affine subspace, dim (n-1)^2
        T_n = {V : V 1 = 0, V^T 1 = 0}                          its tangent space
    (2) Pi(V) = H V H                                          orthogonal projector onto T_n
    (3) X -> H X H + J/n                                       orthogonal projector onto A_n
    (4) x0 = J/n + sigma * H G H,  G_ij ~ N(0, 1)              base distribution on A_n
    (5) k* = argmax_k <x0, P_k>,  x1 = P_{k*}                  nearest-target coupling over the
                                                               valid set V(c) = {P_1, .., P_K}
        (independent coupling: k* uniform over V(c), the ablation)
    (6) x_t = (1 - t) x0 + t x1,   u = x1 - x0                 interpolant and target velocity
    (7) L = || Pi(v_theta(x_t, t, c)) - u ||_F^2 / n^2         CFM loss (Pi dropped in the ablation)
        Endpoint parameterisation (option): the network predicts x1_hat and
        v = (x1_hat - x_t) / (1 - t); then Pi(v) - u = Pi(x1_hat - x1) / (1 - t), and we train on
        || Pi(x1_hat - x1) ||^2 / n^2, Eq. (7) reweighted by (1 - t)^2: same minimiser E[x1 | x_t].
        Since rows of x1 are one-hot, x1_hat may also be a row-softmax trained with row-wise
        cross-entropy, another proper scoring rule whose minimiser is again E[x1 | x_t, c].
    (8) x <- x + h Pi(v(x, t))                                 Euler step;  Heun: average the
        x <- x + h/2 [Pi(v(x, t)) + Pi(v(x', t + h))]          slopes at x and the Euler guess x'
                                                               (the last step is Euler: at t = 1
                                                               the endpoint form divides by 0)
    (9) P = argmax_{P in S_n} <x_1, P>                         Hungarian decode = nearest
                                                               permutation in Frobenius norm
   (10) viol(X) = max(|X 1 - 1|_inf, |X^T 1 - 1|_inf)          constraint violation
   (11) neg(X) = sum_ij max(-X_ij, 0) / n                      negative mass (A_n is not the
                                                               polytope: entries may go below 0)
   (12) E[x1 | x_t] = sum_k w_k P_k,  w_k ∝ N(x0_k; J/n, s^2) 1[x0_k in cell k],
        x0_k = (x_t - t P_k) / (1 - t)                         exact posterior endpoint for the
                                                               nearest-target coupling (oracle)

Because every P_k, x0 and the interpolant lie in A_n and the projected velocity lies in T_n, each
Euler/Heun iterate stays in A_n up to float rounding: the constraints hold by construction, no
Sinkhorn-style correction is needed. Non-negativity is not enforced (the flow lives in the affine
hull, not in the polytope itself).
"""

from collections.abc import Callable

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

VelocityFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x [B,n,n], t [B]) -> [B,n,n]


def tangent_project(v: torch.Tensor) -> torch.Tensor:
    """Eq. (2): Pi(V) = H V H, computed as double centring (no n x n matmuls)."""
    row_mean = v.mean(dim=-1, keepdim=True)  # [..., n, 1]
    col_mean = v.mean(dim=-2, keepdim=True)  # [..., 1, n]
    total_mean = v.mean(dim=(-2, -1), keepdim=True)  # [..., 1, 1]
    return v - row_mean - col_mean + total_mean


def affine_project(x: torch.Tensor) -> torch.Tensor:
    """Eq. (3): orthogonal projection onto A_n, X -> H X H + J/n."""
    n = x.shape[-1]
    return tangent_project(x) + 1.0 / n


def sample_base(
    batch: int,
    n: int,
    sigma: float,
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Eq. (4): x0 = J/n + sigma * H G H, a Gaussian on A_n centred at the barycentre."""
    g = torch.randn(batch, n, n, generator=generator, dtype=dtype)  # [B, n, n]
    return (tangent_project(sigma * g) + 1.0 / n).to(device)


def permutation_matrices(perms: torch.Tensor) -> torch.Tensor:
    """Permutation indices [..., n] (perm[i] = column of row i) -> one-hot matrices [..., n, n]."""
    n = perms.shape[-1]
    return torch.nn.functional.one_hot(perms.long(), n).float()


def nearest_target_coupling(
    x0: torch.Tensor, targets: torch.Tensor, num_valid: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. (5): pick the valid permutation nearest to x0 in Frobenius norm.

    ``||x0 - P||^2 = ||x0||^2 - 2<x0, P> + n`` for every permutation P, so nearest = argmax
    <x0, P>. x0: [B, n, n]; targets: [B, K, n, n], of which the first ``num_valid[b]`` are valid.
    Returns x1 [B, n, n] and the chosen index [B].
    """
    scores = (x0.unsqueeze(1) * targets).sum(dim=(-2, -1))  # [B, K]
    slot = torch.arange(targets.shape[1], device=x0.device)  # [K]
    valid = slot.unsqueeze(0) < num_valid.unsqueeze(1)  # [B, K]
    chosen = scores.masked_fill(~valid, float("-inf")).argmax(dim=1)  # [B]
    return targets[torch.arange(x0.shape[0], device=x0.device), chosen], chosen


def independent_coupling(
    targets: torch.Tensor, num_valid: torch.Tensor, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. (5), ablation: a valid permutation chosen uniformly at random, independent of x0."""
    u = torch.rand(num_valid.shape[0], generator=generator).to(num_valid.device)  # [B]
    chosen = (u * num_valid).long()  # [B]; u < 1, so chosen < num_valid
    return targets[torch.arange(targets.shape[0], device=targets.device), chosen], chosen


def interpolate(x0: torch.Tensor, x1: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Eq. (6): x_t = (1 - t) x0 + t x1, an affine combination, hence in A_n. t: [B]."""
    t = t.view(-1, 1, 1)  # [B, 1, 1]
    return (1 - t) * x0 + t * x1


def target_velocity(x0: torch.Tensor, x1: torch.Tensor) -> torch.Tensor:
    """Eq. (6): u = x1 - x0, constant along the straight path and already in T_n."""
    return x1 - x0


def cfm_loss(v_pred: torch.Tensor, x0: torch.Tensor, x1: torch.Tensor, project: bool = True):
    """Eq. (7): mean squared error between the (projected) predicted and the target velocity."""
    if project:
        v_pred = tangent_project(v_pred)
    return (v_pred - target_velocity(x0, x1)).pow(2).mean()


def endpoint_loss(x1_pred: torch.Tensor, x1: torch.Tensor, project: bool = True) -> torch.Tensor:
    """Eq. (7) in endpoint form: || Pi(x1_hat - x1) ||^2 / n^2 (the (1-t)^2-weighted CFM loss)."""
    error = x1_pred - x1
    return (tangent_project(error) if project else error).pow(2).mean()


def endpoint_cross_entropy(logits: torch.Tensor, x1: torch.Tensor) -> torch.Tensor:
    """Eq. (7), softmax endpoint form: -sum_ij x1_ij log softmax_j(logits)_ij / n."""
    return -(x1 * torch.log_softmax(logits, dim=-1)).sum(dim=(-2, -1)).mean() / x1.shape[-1]


def velocity_from_endpoint(
    x1_pred: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor, min_gap: float = 1e-3
) -> torch.Tensor:
    """Eq. (7) endpoint form: v = (x1_hat - x_t) / (1 - t), with 1 - t floored at ``min_gap``."""
    gap = (1 - t).clamp(min=min_gap).view(-1, 1, 1)  # [B, 1, 1]
    return (x1_pred - x_t) / gap


def integrate(
    velocity: VelocityFn,
    x0: torch.Tensor,
    steps: int,
    method: str = "euler",
    *,
    project: bool,
) -> torch.Tensor:
    """Eq. (8): integrate dx/dt = Pi(v(x, t)) from t=0 to t=1 with Euler or Heun (2nd order).

    ``project=False`` integrates the raw velocity (the no-projector ablation), which is free to
    leave A_n.
    """
    if method not in ("euler", "heun"):
        raise ValueError(f"sampler must be 'euler' or 'heun', got {method!r}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")

    def field(x: torch.Tensor, t: float) -> torch.Tensor:
        v = velocity(x, torch.full((x.shape[0],), t, device=x.device, dtype=x.dtype))
        return tangent_project(v) if project else v

    h = 1.0 / steps
    x = x0
    for step in range(steps):
        t = step * h
        slope = field(x, t)
        # Heun's corrector evaluates the field at t + h; on the last step that is t = 1, where an
        # endpoint-parameterised velocity (x1_hat - x) / (1 - t) is undefined. The last step is
        # therefore an Euler step, which lands exactly on the predicted endpoint.
        if method == "heun" and step < steps - 1:
            slope = 0.5 * (slope + field(x + h * slope, t + h))
        x = x + h * slope
    return x


def hungarian_decode(x: torch.Tensor) -> np.ndarray:
    """Eq. (9): nearest permutation, argmax_P <X, P>, per matrix. x: [B, n, n] -> perms [B, n]."""
    scores = x.detach().float().cpu().numpy()
    perms = np.empty(scores.shape[:2], dtype=np.int64)
    for b, matrix in enumerate(scores):
        _, cols = linear_sum_assignment(matrix, maximize=True)
        perms[b] = cols
    return perms


def negative_mass(x: torch.Tensor) -> torch.Tensor:
    """Eq. (11): total mass of the negative entries per matrix, divided by n. x: [B, n, n] -> [B].

    0 for every point of the Birkhoff polytope; the flow lives in the affine hull A_n, so its
    end points may have negative entries that the Hungarian decode hides.
    """
    return (-x).clamp(min=0).sum(dim=(-2, -1)) / x.shape[-1]


def posterior_endpoint(
    x_t: torch.Tensor,
    t: torch.Tensor,
    targets: torch.Tensor,
    num_valid: torch.Tensor,
    sigma: float,
) -> torch.Tensor:
    """Eq. (12): E[x1 | x_t] under the base (4) and the nearest-target coupling (5), in closed form.

    x_t: [B, n, n]; t: [B]; targets: [B, K, n, n] of which the first ``num_valid[b]`` are valid.
    Given x1 = P_k, x_t determines x0_k = (x_t - t P_k) / (1 - t); the pair (x0_k, k) has density
    N(x0_k; J/n, sigma^2 on T_n) when k is x0_k's nearest valid target, else 0. The common Jacobian
    (1 - t)^-d cancels in the weights. If no slot is consistent (x_t off the data's support), the
    Gaussian factor alone decides. This is the field a perfect network would learn: integrating
    it (the positive control) shows what the sampler can reach.
    """
    b, k, n, _ = targets.shape
    tt = t.view(b, 1, 1, 1)  # [B, 1, 1, 1]
    gap = (1 - tt).clamp(min=1e-6)
    x0 = (x_t.unsqueeze(1) - tt * targets) / gap  # [B, K, n, n]
    log_density = -((x0 - 1.0 / n) ** 2).sum(dim=(-2, -1)) / (2 * sigma**2)  # [B, K]
    slot = torch.arange(k, device=x_t.device)
    valid = slot.unsqueeze(0) < num_valid.unsqueeze(1)  # [B, K]
    # cell indicator: slot k is x0_k's nearest valid target (ties count as inside)
    scores = (x0.unsqueeze(2) * targets.unsqueeze(1)).sum(dim=(-2, -1))  # [B, K(x0), K(target)]
    scores = scores.masked_fill(~valid.unsqueeze(1), float("-inf"))
    own = scores.diagonal(dim1=1, dim2=2)  # [B, K]
    consistent = valid & (own >= scores.amax(dim=2))  # [B, K]
    allowed = torch.where(consistent.any(dim=1, keepdim=True), consistent, valid)
    weights = torch.softmax(log_density.masked_fill(~allowed, float("-inf")), dim=1)  # [B, K]
    return (weights.view(b, k, 1, 1) * targets).sum(dim=1)  # [B, n, n]


def constraint_violation(x: torch.Tensor) -> torch.Tensor:
    """Eq. (10): largest deviation of any row or column sum from 1. x: [B, n, n] -> [B]."""
    row = (x.sum(dim=-1) - 1).abs().amax(dim=-1)  # [B]
    col = (x.sum(dim=-2) - 1).abs().amax(dim=-1)  # [B]
    return torch.maximum(row, col)
