"""Sinkhorn baselines: a deterministic Sinkhorn network and Gumbel-Sinkhorn.

Both map a condition c to logits L(c) in R^{n x n} with the same encoder as PermFlow; only this
head/objective differs.

    (S1) log S = Sinkhorn(L / tau): alternately subtract logsumexp over rows and over columns,
         n_iters times (log domain for stability). After a finite number of iterations S is only
         approximately doubly stochastic: the last normalised axis is exact, the other is not.
    (S2) Sinkhorn network loss: || S - P ||^2 / n^2 (MSE) or -<P, log S> / n (cross-entropy), with P
         a label drawn from the valid set; the minimiser is E[P | c], i.e. 0.5 (P_1 + P_2) under
         ambiguity, which a hard decode turns into a single permutation.
    (S3) Gumbel-Sinkhorn: S = Sinkhorn((L + g) / tau), g_ij ~ Gumbel(0, 1), during training;
         evaluation either noiseless, Hungarian(L), or with m noisy samples, Hungarian(L + g).
"""

import numpy as np
import torch

from permflow.core import hungarian_decode


def log_sinkhorn(logits: torch.Tensor, tau: float, n_iters: int) -> torch.Tensor:
    """Eq. (S1): log of the Sinkhorn-normalised matrix of logits / tau. logits: [B, n, n]."""
    log_s = logits / tau
    for _ in range(n_iters):
        log_s = log_s - torch.logsumexp(log_s, dim=-1, keepdim=True)  # rows sum to 1
        log_s = log_s - torch.logsumexp(log_s, dim=-2, keepdim=True)  # columns sum to 1
    return log_s


def sample_gumbel(shape, generator: torch.Generator | None = None, device="cpu", eps=1e-10):
    """Standard Gumbel noise g = -log(-log U)."""
    u = torch.rand(shape, generator=generator).to(device)
    return -torch.log(-torch.log(u + eps) + eps)


def sinkhorn_loss(log_s: torch.Tensor, target: torch.Tensor, loss: str = "mse") -> torch.Tensor:
    """Eq. (S2): MSE or cross-entropy between the soft permutation and the label permutation."""
    if loss == "mse":
        return (log_s.exp() - target).pow(2).mean()
    if loss == "ce":
        return -(target * log_s).sum(dim=(-2, -1)).mean() / target.shape[-1]
    raise ValueError(f"loss must be 'mse' or 'ce', got {loss!r}")


def gumbel_sinkhorn(
    logits: torch.Tensor,
    tau: float = 1.0,
    n_iters: int = 20,
    noise_scale: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Eq. (S3), training form: log Sinkhorn((L + noise_scale * g) / tau)."""
    g = sample_gumbel(logits.shape, generator, logits.device).to(logits.dtype)
    return log_sinkhorn(logits + noise_scale * g, tau, n_iters)


def decode_noiseless(logits: torch.Tensor, num_samples: int) -> np.ndarray:
    """Eq. (S3), deterministic evaluation: Hungarian(L), repeated. -> perms [B, m, n]."""
    perms = hungarian_decode(logits)  # [B, n]
    return np.repeat(perms[:, None, :], num_samples, axis=1)


def decode_noisy(
    logits: torch.Tensor,
    num_samples: int,
    noise_scale: float = 1.0,
    generator: torch.Generator | None = None,
) -> np.ndarray:
    """Eq. (S3), perturb-and-MAP evaluation: m samples Hungarian(L + g). -> perms [B, m, n]."""
    b, n, _ = logits.shape
    g = sample_gumbel((b, num_samples, n, n), generator, logits.device).to(logits.dtype)
    noisy = logits.unsqueeze(1) + noise_scale * g  # [B, m, n, n]
    return hungarian_decode(noisy.reshape(b * num_samples, n, n)).reshape(b, num_samples, n)
