"""Learned convex asynchronous schedules (LAS) for joint two-representation flow matching.

Pure torch: the math of the method, no Lightning, no I/O. Notation (SiT convention, t=0 is noise,
t=1 is data). Every image has two representations: the *leading* one (semantic latent, x_lead)
and the *lagging* one (texture latent, x_lag). Both are noised with the linear interpolant

    x_t = t * x_data + (1 - t) * eps,    target velocity  u = x_data - eps           (Eq. 1)

at their own times. The leading representation runs on the global time tau, the lagging one on
the schedule f:

    t_lead = tau,    t_lag = f(tau)                                                   (Eq. 2)

f is a convex, monotone bijection of [0, 1] with f(0) = 0 and f(1) = 1. Convexity and the end
points give f(tau) <= tau (the chord lies above a convex function): the texture is never
cleaner than the semantics. f is parameterised so that these constraints hold by construction
(no projection): a "monotone-slope spline" with K bins whose knot slopes

    g_0 = 1,   g_k = 1 + sum_{j<=k} softplus(a_j)   (positive, non-decreasing)          (Eq. 3)

define a piecewise-linear density g; f(tau) = G(tau) / G(1) with G(tau) = int_0^tau g is
piecewise quadratic, C^1 and convex. a -> -inf gives the identity (synchronous), large late
increments give strongly lagging shapes.

Global times are drawn from p = (1 - rho) * logit-normal(m, s) + rho * uniform            (Eq. 4)

The schedule-corrected objective [reconstruction: the paper only says it "keeps each
representation's local noising-time weights fixed as the schedule changes"] weights the lagging
loss by the density ratio that makes the marginal weight of each lag time t equal to the
reference pi = p, whatever f is:

    w(tau) = pi(f(tau)) * f'(tau) / p(tau)                                             (Eq. 5)
    L = lambda_lead * E ||v_lead - u_lead||^2 + E[ w(tau) ||v_lag - u_lag||^2 ]

The uniform share rho keeps p >= rho > 0, so w is finite on all of [0, 1], with w(0) = f'(0) and
w(1) = f'(1). The mild speed (kinetic-energy) regulariser is [reconstruction]

    R(f) = int_0^1 f'(tau)^2 dtau - 1 >= 0     (= 0 iff f is the identity, by Jensen)   (Eq. 6)

Probe stage: f and the model are optimised jointly on L + beta * R for a short run. The stable
window is the final stretch of the probe in which f moves less than delta (sup norm on a grid)
over `lag` steps (Eq. 7; by default delta is a share of f's total movement over the probe);
f* is the mean of the schedules in that window. A mean of members of the family is a member of
the family: the normalised knot slopes s_k = g_k / G(1) average to non-decreasing positive
slopes (Eq. 8). f* is frozen and reused for the main stage.

Sampling integrates the joint ODE over the global time with per-representation time grids,

    x_lead <- x_lead + (t_lead[i+1] - t_lead[i]) v_lead,
    x_lag  <- x_lag  + (t_lag[i+1]  - t_lag[i])  v_lag                                 (Eq. 9)

(Euler; Heun adds the trapezoidal corrector on all but the last step), i.e.
dx_lag/dtau = f'(tau) v_lag. Guidance (classifier-free, or AutoGuidance where the "bad"
prediction comes from a weaker model):

    v = v_bad + w_cfg * (v_good - v_bad)                                               (Eq. 10)
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

Velocity = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]
]


def interpolate(
    x_data: torch.Tensor, noise: torch.Tensor, t: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 1: the noisy sample x_t and the velocity target u for times t [B]."""
    t = t.reshape(-1, *([1] * (x_data.dim() - 1)))  # [B, 1, 1, 1]
    return t * x_data + (1 - t) * noise, x_data - noise


class ConvexSchedule(nn.Module):
    """Eq. 3: f(tau) = G(tau) / G(1), a convex monotone bijection of [0, 1] by construction.

    ``raw_increments`` [K] are the a_k. ``init_increment`` sets every a_k: very negative gives
    (numerically) the identity, 0 a clearly lagging shape.
    """

    def __init__(self, bins: int = 8, init_increment: float = -3.0) -> None:
        super().__init__()
        if bins < 1:
            raise ValueError(f"a schedule needs at least one bin, got bins={bins}")
        self.raw_increments = nn.Parameter(torch.full((bins,), float(init_increment)))

    @property
    def bins(self) -> int:
        return self.raw_increments.numel()

    def knot_slopes(self) -> torch.Tensor:
        """The unnormalised knot slopes g_0..g_K of Eq. 3 [K + 1]."""
        increments = F.softplus(self.raw_increments)
        ones = torch.ones(1, dtype=increments.dtype, device=increments.device)
        return torch.cat([ones, 1 + torch.cumsum(increments, 0)])

    def normalised_slopes(self) -> torch.Tensor:
        """s_k = g_k / G(1): the knot values of f' (so that int_0^1 f' = 1) [K + 1]."""
        g = self.knot_slopes()
        return g / self._integral(g, torch.ones(1, dtype=g.dtype, device=g.device))

    def _integral(self, g: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
        """G(tau) = int_0^tau g for the piecewise-linear g with knots g [K + 1]; tau [N]."""
        bins = g.numel() - 1
        scaled = tau.clamp(0, 1) * bins
        k = scaled.floor().clamp(max=bins - 1).long()  # bin index [N]
        u = scaled - k  # position inside the bin, in [0, 1]
        bin_areas = (g[:-1] + g[1:]) / (2 * bins)
        before = torch.cat([g.new_zeros(1), torch.cumsum(bin_areas, 0)])[k]
        g_k, g_next = g[k], g[k + 1]
        return before + (g_k * u + 0.5 * (g_next - g_k) * u * u) / bins

    def forward(self, tau: torch.Tensor) -> torch.Tensor:
        """f(tau), elementwise. G(1) goes through the same arithmetic as G(tau), so f(1) = 1
        exactly in floating point, and f(0) = 0 exactly."""
        g = self.knot_slopes().to(tau.dtype)
        flat = tau.reshape(-1)
        total = self._integral(g, torch.ones(1, dtype=tau.dtype, device=tau.device))
        return (self._integral(g, flat) / total).reshape(tau.shape)

    def derivative(self, tau: torch.Tensor) -> torch.Tensor:
        """f'(tau): the piecewise-linear, non-decreasing slope (Eq. 3)."""
        s = self.normalised_slopes().to(tau.dtype)
        scaled = tau.reshape(-1).clamp(0, 1) * self.bins
        k = scaled.floor().clamp(max=self.bins - 1).long()
        u = scaled - k
        return (s[k] + (s[k + 1] - s[k]) * u).reshape(tau.shape)

    def inverse(self, s: torch.Tensor, iterations: int = 60) -> torch.Tensor:
        """f^{-1}(s) by bisection (f is strictly increasing); 60 halvings reach float64 ulp."""
        lo, hi = torch.zeros_like(s), torch.ones_like(s)
        with torch.no_grad():
            for _ in range(iterations):
                mid = (lo + hi) / 2
                below = self(mid) < s
                lo, hi = torch.where(below, mid, lo), torch.where(below, hi, mid)
        return (lo + hi) / 2

    def kinetic_excess(self) -> torch.Tensor:
        """Eq. 6 in closed form: int f'^2 over each bin of a linear f' is (a^2 + ab + b^2)/3K."""
        s = self.normalised_slopes()
        a, b = s[:-1], s[1:]
        return ((a * a + a * b + b * b) / 3).sum() / self.bins - 1

    @classmethod
    def from_normalised_slopes(cls, slopes: torch.Tensor) -> ConvexSchedule:
        """The member of the family whose f' has knot values ``slopes`` [K + 1] (positive,
        strictly increasing); the inverse of ``normalised_slopes``."""
        increments = torch.diff(slopes / slopes[0])
        if not bool((slopes > 0).all() and (increments > 0).all()):
            raise ValueError("knot slopes must be positive and strictly increasing")
        schedule = cls(bins=slopes.numel() - 1)
        with torch.no_grad():  # softplus^{-1}(y) = y + log(-expm1(-y)), stable for small y
            schedule.raw_increments.copy_(increments + torch.log(-torch.expm1(-increments)))
        return schedule


def sample_global_time(
    n: int,
    generator: torch.Generator | None = None,
    loc: float = 0.0,
    scale: float = 1.0,
    uniform_share: float = 0.1,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Eq. 4: n draws of tau from the logit-normal / uniform mixture p [n]."""
    normal = torch.randn(n, generator=generator, device=device) * scale + loc
    uniform = torch.rand(n, generator=generator, device=device)
    pick_uniform = torch.rand(n, generator=generator, device=device) < uniform_share
    return torch.where(pick_uniform, uniform, torch.sigmoid(normal))


def global_time_density(
    tau: torch.Tensor, loc: float = 0.0, scale: float = 1.0, uniform_share: float = 0.1
) -> torch.Tensor:
    """The density p(tau) of Eq. 4; the logit-normal part is 0 at the end points (its limit)."""
    inside = (tau > 0) & (tau < 1)
    safe = torch.where(inside, tau, torch.full_like(tau, 0.5))
    logit = torch.log(safe) - torch.log1p(-safe)
    logit_normal = torch.exp(-0.5 * ((logit - loc) / scale) ** 2) / (
        scale * math.sqrt(2 * math.pi) * safe * (1 - safe)
    )
    return (1 - uniform_share) * torch.where(inside, logit_normal, 0) + uniform_share


def schedule_corrected_weight(
    tau: torch.Tensor, t_lag: torch.Tensor, lag_speed: torch.Tensor, **density: float
) -> torch.Tensor:
    """Eq. 5 for any lag path t_lag(tau) with speed dt_lag/dtau: pi(t_lag) t_lag' / p(tau).
    For a frozen stretch of the path (SFD's texture held at noise) the speed and weight are 0."""
    return global_time_density(t_lag, **density) * lag_speed / global_time_density(tau, **density)


def corrected_lag_weight(
    tau: torch.Tensor, schedule: ConvexSchedule, **density: float
) -> torch.Tensor:
    """Eq. 5: w(tau) = p(f(tau)) f'(tau) / p(tau), finite on [0, 1] because p >= rho > 0."""
    return schedule_corrected_weight(tau, schedule(tau), schedule.derivative(tau), **density)


def joint_flow_matching_loss(
    velocity_lead: torch.Tensor,
    velocity_lag: torch.Tensor,
    target_lead: torch.Tensor,
    target_lag: torch.Tensor,
    lag_weight: torch.Tensor | None = None,
    lead_weight: float = 1.0,
) -> dict[str, torch.Tensor]:
    """Eq. 5 (Eq. 2's plain joint loss when ``lag_weight`` is None): per-representation mean
    squared velocity errors, the lag term weighted per sample by w(tau) [B]."""
    lead = (velocity_lead - target_lead).pow(2).flatten(1).mean(1)  # [B]
    lag = (velocity_lag - target_lag).pow(2).flatten(1).mean(1)  # [B]
    weighted_lag = lag if lag_weight is None else lag_weight * lag
    total = lead_weight * lead.mean() + weighted_lag.mean()
    return {"loss": total, "loss_lead": lead.mean(), "loss_lag": lag.mean()}


def detect_stable_window(
    curves: torch.Tensor,
    lag: int,
    threshold: float,
    fallback_share: float = 0.3,
    relative: bool = False,
) -> int:
    """Eq. 7: the first index of the final stretch of probe curves [S, G] in which every curve
    differs from the one ``lag`` steps before by less than ``threshold`` (sup norm). With
    ``relative``, the threshold is a share of f's total movement over the probe (the largest
    sup-norm distance of any curve from the first), so a slowly but steadily moving f is not
    called stable. When the probe never settles that long, the last ``fallback_share`` of the
    probe is used instead."""
    steps = curves.shape[0]
    fallback = max(0, steps - max(1, math.ceil(fallback_share * steps)))
    if steps <= lag:
        return fallback
    if relative:
        threshold = threshold * float((curves - curves[0]).abs().amax())
    change = (curves[lag:] - curves[:-lag]).abs().amax(dim=1)  # [S - lag]
    start = steps
    for i in range(change.numel() - 1, -1, -1):
        if change[i] >= threshold:
            break
        start = i  # curve i + lag is still stable; its window reaches back to i
    return start if start < steps - 1 else fallback


def average_schedules(normalised_slopes: torch.Tensor) -> ConvexSchedule:
    """Eq. 8: the mean of schedules given by their normalised knot slopes [W, K + 1]. The mean
    of f equals the f of the mean slopes (f is linear in s), so f* stays in the family."""
    return ConvexSchedule.from_normalised_slopes(normalised_slopes.mean(0))


def guided_velocity(
    good: tuple[torch.Tensor, torch.Tensor],
    bad: tuple[torch.Tensor, torch.Tensor],
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 10 for both representations: CFG (bad = unconditional) or AutoGuidance (bad = a
    weaker model); scale 1 returns the good prediction."""
    return tuple(b + scale * (g - b) for g, b in zip(good, bad, strict=True))


def sample_joint_ode(
    velocity: Velocity,
    x_lead: torch.Tensor,
    x_lag: torch.Tensor,
    lead_times: torch.Tensor,
    lag_times: torch.Tensor,
    method: str = "euler",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 9: integrate both representations from noise (t = 0) to data (t = 1) along the
    per-representation time grids [N + 1]; one network call per step (two for Heun)."""
    if method not in ("euler", "heun"):
        raise ValueError(f"unknown ODE method {method!r}; use 'euler' or 'heun'")
    batch = x_lead.shape[0]
    for i in range(lead_times.numel() - 1):
        t0 = (lead_times[i].expand(batch), lag_times[i].expand(batch))
        t1 = (lead_times[i + 1].expand(batch), lag_times[i + 1].expand(batch))
        d_lead, d_lag = lead_times[i + 1] - lead_times[i], lag_times[i + 1] - lag_times[i]
        v_lead, v_lag = velocity(x_lead, x_lag, *t0)
        next_lead, next_lag = x_lead + d_lead * v_lead, x_lag + d_lag * v_lag
        if method == "heun" and i < lead_times.numel() - 2:  # last step: Euler (as EDM does)
            w_lead, w_lag = velocity(next_lead, next_lag, *t1)
            next_lead = x_lead + d_lead * (v_lead + w_lead) / 2
            next_lag = x_lag + d_lag * (v_lag + w_lag) / 2
        x_lead, x_lag = next_lead, next_lag
    return x_lead, x_lag


def schedule_time_grid(
    schedule: Callable[[torch.Tensor], torch.Tensor], steps: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 2 on a uniform global grid: (tau_i, f(tau_i)), i = 0..steps [steps + 1] each."""
    tau = torch.linspace(0, 1, steps + 1, dtype=torch.float64)
    with torch.no_grad():
        return tau.float(), schedule(tau).float()


def arclength_time_grid(
    schedule: Callable[[torch.Tensor], torch.Tensor], steps: int, resolution: int = 4096
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 2 on a grid uniform in the path's L-infinity length [reconstruction, a sampler
    option]: global times tau_i such that every step moves the faster of the two
    representations by the same amount, max(tau_{i+1} - tau_i, f(tau_{i+1}) - f(tau_i)) =
    L / steps, with L = int_0^1 max(1, f'(tau)) dtau. A uniform tau grid gives the texture few
    steps where f is steep (a strongly lagging f moves most of the texture in its last bins);
    this grid gives it as many as SFD's sampler does (a uniform grid of u over SFD's path is
    uniform in the same length). For the identity it is the uniform grid. Returns (tau_i,
    f(tau_i)) [steps + 1] each, from (0, 0) to (1, 1)."""
    fine = torch.linspace(0, 1, resolution + 1, dtype=torch.float64)
    with torch.no_grad():
        f = schedule(fine).to(torch.float64)
    # f is non-decreasing, so the L-infinity length of a fine segment is the larger increment
    length = torch.cat([fine.new_zeros(1), torch.cumsum(torch.maximum(fine.diff(), f.diff()), 0)])
    levels = torch.linspace(0, float(length[-1]), steps + 1, dtype=torch.float64)
    right = torch.searchsorted(length, levels).clamp(1, resolution)
    share = (levels - length[right - 1]) / (length[right] - length[right - 1])
    tau = fine[right - 1] + share * (fine[right] - fine[right - 1])
    tau[0], tau[-1] = 0.0, 1.0
    with torch.no_grad():
        return tau.float(), schedule(tau).float()


# --- The family's reach (issue 54; evidence and the in-family control, not the method) ---------
# A schedule is a path of (t_lead, t_lag) pairs from (0, 0) to (1, 1). LAS's family only holds
# the paths (tau, f(tau)) with f convex; SFD's shifted path leaves it (its semantics reach data
# before the end). How close the family comes to a given path is measured between the two
# paths as point sets, sampled densely along their global time.


def path_hausdorff(path_a: torch.Tensor, path_b: torch.Tensor) -> torch.Tensor:
    """The Hausdorff distance between two paths given as points [N, 2] and [M, 2] (Euclidean
    in the (t_lead, t_lag) plane): the largest distance from a point of one to the other."""
    distances = torch.cdist(path_a, path_b)
    return torch.maximum(distances.min(1).values.max(), distances.min(0).values.max())


def path_chamfer(path_a: torch.Tensor, path_b: torch.Tensor) -> torch.Tensor:
    """The symmetric mean squared nearest-point distance between two paths [N, 2], [M, 2]: a
    smooth stand-in for the Hausdorff distance, used as the fitting objective."""
    distances = torch.cdist(path_a, path_b)
    return distances.min(1).values.pow(2).mean() + distances.min(0).values.pow(2).mean()


def schedule_path(schedule: Callable[[torch.Tensor], torch.Tensor], points: int = 401):
    """A member of the family as a path: (tau, f(tau)) at ``points`` uniform global times."""
    tau = torch.linspace(0, 1, points, dtype=torch.float64)
    return torch.stack([tau, schedule(tau).to(torch.float64)], 1)


def fit_schedule_to_path(
    target: torch.Tensor,
    bins: int = 8,
    steps: int = 3000,
    lr: float = 0.5,
    init_increment: float = -3.0,
) -> ConvexSchedule:
    """The member of the ``bins``-bin family (Eq. 3) closest to a target path [M, 2]: Adam on
    the a_k, minimising ``path_chamfer`` between (tau, f(tau)) and the target, deterministic
    (float64, full batch). A tool for the in-family control and the reach evidence; the method
    never sees a target path."""
    schedule = ConvexSchedule(bins, init_increment).double()
    optimizer = torch.optim.Adam(schedule.parameters(), lr=lr)
    target = target.to(torch.float64)
    for _ in range(steps):
        loss = path_chamfer(schedule_path(schedule), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return schedule.requires_grad_(False)
