"""Embedded miniature weather: forced 2-D turbulence ("KolmoWeather") and a linear control.

KolmoWeather: incompressible vorticity on the doubly periodic square [0, 2 pi]^2,

    d omega/dt + J(psi, omega) = nu lap(omega) - mu omega - nu8 lap^4(omega) + F(y),   (S1)
    omega = -lap(psi),  u = d psi/dy,  v = -d psi/dx,  F(y) = k_f cos(k_f y),

pseudo-spectral with 2/3 de-aliasing and an integrating-factor RK4 step (the linear terms are
integrated exactly). The zero Fourier mode (mean vorticity) is conserved exactly; without
forcing and dissipation the truncated system conserves energy and enstrophy.

AdvectWeather (the linear control): a random field with a k^-3 energy spectrum carried by a
constant wind c on the same torus,

    omega_hat_k(t) = omega_hat_k(0) exp(-i k.c t),                                   (S2)

exact in time, so every Fourier amplitude is conserved and any loss of energy in a forecast is
the model's. Both return fields [traj, time, 2 (omega, psi), n, n] at the model step.
"""

from __future__ import annotations

import numpy as np
import torch


def wavenumbers(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Integer wavenumbers kx, ky [n, n//2+1] of an rfft2 on [0, 2 pi]^2 (row index = y)."""
    ky = torch.fft.fftfreq(n, 1 / n, dtype=torch.float32)[:, None].expand(n, n // 2 + 1)
    kx = torch.fft.rfftfreq(n, 1 / n, dtype=torch.float32)[None, :].expand(n, n // 2 + 1)
    return kx, ky


def streamfunction(omega_hat: torch.Tensor, k2: torch.Tensor) -> torch.Tensor:
    """psi_hat = omega_hat / |k|^2 (omega = -lap psi), zero mean."""
    return omega_hat / k2.clamp(min=1) * (k2 > 0)


class KolmogorovFlow:
    """Eq. S1 on an n x n grid, batched over trajectories. The spectral state is complex64
    (float32 fields), as the random initial state is; a test passes complex128 to check the
    invariants. The flow is chaotic, so float rounding differences between machines (BLAS, FFT
    builds) grow: runs are repeatable on one machine, not bit-identical across machines."""

    def __init__(
        self,
        n: int = 64,
        dt: float = 0.04,
        nu: float = 1e-3,
        mu: float = 0.1,
        nu8: float = 1e-9,
        forcing_k: int = 4,
        forcing_amplitude: float | None = None,
    ) -> None:
        self.n, self.dt = n, dt
        self.kx, self.ky = wavenumbers(n)
        self.k2 = self.kx**2 + self.ky**2
        self.dealias = (self.kx.abs() < 2 * n / 6) & (self.ky.abs() < 2 * n / 6)
        linear = -nu * self.k2 - mu - nu8 * self.k2**4
        self.e1, self.e2 = torch.exp(linear * dt), torch.exp(linear * dt / 2)
        y = torch.arange(n, dtype=torch.float32) * 2 * torch.pi / n
        amplitude = forcing_k if forcing_amplitude is None else forcing_amplitude
        force = amplitude * torch.cos(forcing_k * y)[:, None].expand(n, n)
        self.force_hat = torch.fft.rfft2(force)

    def nonlinear(self, w_hat: torch.Tensor) -> torch.Tensor:
        """-J(psi, omega) + F, de-aliased, in spectral space."""
        psi_hat = streamfunction(w_hat, self.k2)
        u = torch.fft.irfft2(1j * self.ky * psi_hat, s=(self.n, self.n))
        v = torch.fft.irfft2(-1j * self.kx * psi_hat, s=(self.n, self.n))
        wx = torch.fft.irfft2(1j * self.kx * w_hat, s=(self.n, self.n))
        wy = torch.fft.irfft2(1j * self.ky * w_hat, s=(self.n, self.n))
        # (k > 0): u.grad(omega) = div(u omega) has zero mean, so mean vorticity is conserved.
        return -torch.fft.rfft2(u * wx + v * wy) * self.dealias * (self.k2 > 0) + self.force_hat

    def step(self, w_hat: torch.Tensor) -> torch.Tensor:
        """One integrating-factor RK4 step of Eq. S1."""
        dt, e1, e2 = self.dt, self.e1, self.e2
        a = self.nonlinear(w_hat)
        b = self.nonlinear(e2 * (w_hat + dt / 2 * a))
        c = self.nonlinear(e2 * w_hat + dt / 2 * b)
        d = self.nonlinear(e1 * w_hat + dt * e2 * c)
        return e1 * w_hat + dt / 6 * (e1 * a + 2 * e2 * (b + c) + d)

    def random_state(self, batch: int, generator: torch.Generator) -> torch.Tensor:
        """Seeded random vorticity [batch, n, n//2+1] with energy near |k| ~ 4."""
        noise = torch.randn(batch, self.n, self.n, generator=generator)
        k = self.k2.sqrt()
        return torch.fft.rfft2(noise) * torch.exp(-((k - 4) ** 2) / 8) * self.dealias * (k > 0)


def kolmogorov_trajectories(
    n_traj: int,
    n_steps: int,
    seed: int,
    n: int = 64,
    dt: float = 0.04,
    substeps: int = 10,
    spinup: float = 10.0,
) -> np.ndarray:
    """Fields [n_traj, n_steps, 2, n, n] (omega, psi) every ``substeps`` solver steps."""
    flow = KolmogorovFlow(n=n, dt=dt)
    gen = torch.Generator().manual_seed(seed)
    w_hat = flow.random_state(n_traj, gen)
    for _ in range(int(round(spinup / dt))):
        w_hat = flow.step(w_hat)
    frames = []
    for _ in range(n_steps):
        psi_hat = streamfunction(w_hat, flow.k2)
        frames.append(torch.stack([torch.fft.irfft2(w_hat), torch.fft.irfft2(psi_hat)], 1))
        for _ in range(substeps):
            w_hat = flow.step(w_hat)
    out = torch.stack(frames, 1)
    if not torch.isfinite(out).all():
        raise FloatingPointError("the Kolmogorov simulation blew up; lower dt")
    return out.float().numpy()


def advect_trajectories(
    n_traj: int,
    n_steps: int,
    seed: int,
    n: int = 64,
    shift: tuple[float, float] = (0.7, 0.3),
    kmax: int = 16,
) -> np.ndarray:
    """Eq. S2: fields [n_traj, n_steps, 2, n, n]; ``shift`` is the wind x step in units of
    2 pi / 32 (a 32-point grid's spacing); spectrum E(k) ~ k^-3 for 1 <= |k| < kmax."""
    gen = torch.Generator().manual_seed(seed)
    kx, ky = wavenumbers(n)
    k = (kx**2 + ky**2).sqrt()
    kmax = min(kmax, n // 2)  # the Nyquist modes cannot be advected (no sine partner)
    band = (k >= 1) & (kx.abs() < kmax) & (ky.abs() < kmax)
    amplitude = torch.where(band, k.clamp(min=1) ** -2.0, torch.zeros_like(k))
    phase = torch.rand(n_traj, n, n // 2 + 1, generator=gen, dtype=torch.float64) * 2 * torch.pi
    w0 = torch.fft.rfft2(torch.fft.irfft2(amplitude * torch.exp(1j * phase), s=(n, n)))
    w0 = w0 / torch.fft.irfft2(w0).std(dim=(-2, -1), keepdim=True) * 3.0
    cx, cy = (s * 2 * np.pi / 32 for s in shift)
    k2 = kx**2 + ky**2
    frames = []
    for t in range(n_steps):
        w_hat = w0 * torch.exp(-1j * (kx * cx + ky * cy) * t)
        psi = torch.fft.irfft2(streamfunction(w_hat, k2), s=(n, n))
        frames.append(torch.stack([torch.fft.irfft2(w_hat, s=(n, n)), psi], 1))
    return torch.stack(frames, 1).float().numpy()


def coarse_grain(fields: np.ndarray, n_out: int) -> np.ndarray:
    """Spectral truncation of periodic fields [..., n, n] to [..., n_out, n_out]."""
    n = fields.shape[-1]
    f = torch.fft.rfft2(torch.from_numpy(fields).double())
    keep = torch.cat(
        [f[..., : n_out // 2, : n_out // 2 + 1], f[..., -n_out // 2 :, : n_out // 2 + 1]], -2
    )
    keep[..., n_out // 2, :] = 0  # drop the Nyquist row, which has no partner
    keep[..., :, n_out // 2] = 0
    return (torch.fft.irfft2(keep, s=(n_out, n_out)) * (n_out / n) ** 2).float().numpy()


def energy_and_enstrophy(
    w_hat: torch.Tensor, k2: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Kinetic energy sum |k|^2 |psi_hat|^2 and enstrophy sum |omega_hat|^2 (rfft weights)."""
    weight = torch.full_like(k2, 2.0)
    weight[:, 0] = 1
    if k2.shape[-1] > 1 and k2.shape[0] % 2 == 0:
        weight[:, -1] = 1
    enstrophy = (weight * w_hat.abs() ** 2).sum((-2, -1))
    energy = (weight * w_hat.abs() ** 2 / k2.clamp(min=1) * (k2 > 0)).sum((-2, -1))
    return energy, enstrophy
