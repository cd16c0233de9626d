"""Baselines: the hand-designed asynchronous schedules LAS is compared with.

- Synchronous joint diffusion (ReDi-style): f = identity, i.e. ``PowerSchedule(1)``.
- The simple hand-tuned family f(tau) = tau^p (convex for p >= 1), searched over ``POWER_GRID``;
  this grid stands in for the grid searches of prior hand-designed schedules.
- SFD's shifted schedule (Pan et al., ``yuemingPAN/SFD`` transport.py): with a global
  u = (1 + D) tau in [0, 1 + D],

      t_lead = min(1, u),    t_lag = max(0, u - D),

  i.e. the semantics start D ahead and finish D early (D is searched over ``SFD_GRID``, as SFD
  tunes it). This path is not a bijection (the texture is frozen at noise for u < D, the
  semantics at data for u > 1), so it is outside the convex family and keeps its own three-phase
  sampler: a uniform grid on [0, 1 + D] through Eq. 9, where a representation whose time is
  clamped simply does not move (SFD's channel masks).
"""

from __future__ import annotations

import torch
from torch import nn

POWER_GRID = (1.0, 1.5, 2.0, 3.0)  # p = 1 is the synchronous schedule
SFD_GRID = (
    0.15,
    0.3,
    0.5,
    0.7,
)  # SFD tunes its offset D by grid search; 0.3 is its published value


class PowerSchedule(nn.Module):
    """f(tau) = tau^p: convex, monotone, f(0) = 0, f(1) = 1 for p >= 1 (p = 1: synchronous)."""

    def __init__(self, exponent: float = 1.0) -> None:
        super().__init__()
        if exponent < 1:
            raise ValueError(f"tau^p is convex (leading semantics) only for p >= 1, got {exponent}")
        self.exponent = float(exponent)

    def forward(self, tau: torch.Tensor) -> torch.Tensor:
        return tau.clamp(0, 1) ** self.exponent

    def derivative(self, tau: torch.Tensor) -> torch.Tensor:
        return self.exponent * tau.clamp(0, 1) ** (self.exponent - 1)

    def inverse(self, s: torch.Tensor) -> torch.Tensor:
        return s.clamp(0, 1) ** (1 / self.exponent)


class SFDShiftedPath(nn.Module):
    """SFD's hand-designed schedule with offset D: its training times and its sampling grid."""

    def __init__(self, delta: float = 0.3) -> None:
        super().__init__()
        if not 0 < delta < 1:
            raise ValueError(f"the SFD offset D must lie in (0, 1), got {delta}")
        self.delta = float(delta)

    def times(self, tau: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(t_lead, t_lag) for global times tau in [0, 1]."""
        u = (1 + self.delta) * tau
        return u.clamp(0, 1), (u - self.delta).clamp(0, 1)

    def lag_speed(self, tau: torch.Tensor) -> torch.Tensor:
        """dt_lag/dtau: 1 + D while the texture moves, 0 while it is held at noise."""
        return torch.where((1 + self.delta) * tau > self.delta, 1 + self.delta, 0.0).to(tau)

    def time_grid(self, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The three-phase sampling grid: ``steps`` uniform steps of u over [0, 1 + D]."""
        lead, lag = self.times(torch.linspace(0, 1, steps + 1, dtype=torch.float64))
        return lead.float(), lag.float()
