"""Halting baselines on the same refinement core: each maps the per-step readouts of a batch
to a step count K(s) in 1..K_max, like AIC's Eq. 6.

- fixed K for every K (the fixed counterpart itself is the same network trained at K_max);
- PonderNet (Banino et al. 2021): lambda_n = sigma(w . z_n), p_n = lambda_n prod_{j<n}(1-lambda_j),
  loss sum_n p_n L_n + beta KL(p || Geometric(lambda_p)); halt where sum_{j<=n} p_j >= 1/2;
- ACT (Graves 2016): halting units h_n = sigma(w . z_n), N = min{n : sum_{j<=n} h_j >= 1-eps},
  p_n = h_n (n < N), remainder R = 1 - sum_{n<N} h_n at N, loss sum_n p_n L_n + tau (N + R);
- confidence exit: halt when max_a pi_k(a) >= c (discrete) or when the action moves less than c
  between consecutive steps (continuous);
- random halting with a given mean K (truncated geometric);
- oracle halting where exact returns are known: K = min{k : max_{j>k} R_j - R_k <= lambda}.

PonderNet and ACT heads are trained on the frozen AIC backbone's per-step features and per-step
losses, so every halting rule shares one backbone and only the halting rule differs.
"""

from __future__ import annotations

import torch
from torch import nn

from aic.core import check_price, voc_targets


def fixed_steps(n: int, k: int) -> torch.Tensor:
    return torch.full((n,), k, dtype=torch.long)


def first_true(mask: torch.Tensor) -> torch.Tensor:
    """1-based index of the first True per row; the last step when none is."""
    mask = mask.clone()
    mask[:, -1] = True
    return mask.float().argmax(1) + 1


def confidence_steps(actions: torch.Tensor, action_kind: str, threshold: float) -> torch.Tensor:
    """Confidence exit on readouts [N, K, A]."""
    if action_kind == "continuous":
        moved = (actions[:, 1:] - actions[:, :-1]).abs().amax(-1)  # [N, K-1]
        stable = torch.cat(
            [torch.zeros_like(moved[:, :1], dtype=torch.bool), moved <= threshold], 1
        )
        return first_true(stable)
    return first_true(actions.softmax(-1).amax(-1) >= threshold)


def random_steps(n: int, k_max: int, mean_steps: float, generator: torch.Generator) -> torch.Tensor:
    """Halt after each step with probability p, p chosen (bisection) so that E[K] = mean_steps."""
    mean_steps = min(max(mean_steps, 1.0), float(k_max))

    def expected(p: float) -> float:
        k = torch.arange(1, k_max + 1, dtype=torch.float64)
        probs = p * (1 - p) ** (k - 1)
        probs[-1] = (1 - p) ** (k_max - 1)
        return float((k * probs).sum())

    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if expected(mid) > mean_steps else (low, mid)
    halt = torch.rand(n, k_max, generator=generator) < (low + high) / 2
    return first_true(halt)


def oracle_steps(true_returns: torch.Tensor, price: float) -> torch.Tensor:
    """Oracle halting from exact per-step returns [N, K]."""
    check_price(price)
    return first_true(voc_targets(true_returns, "cumulative") <= price)


class HaltingUnit(nn.Module):
    """sigma(MLP(z_n)): PonderNet's lambda_n or ACT's h_n, [N, K, D] -> [N, K]."""

    def __init__(self, dim: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, 1))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.net(features).squeeze(-1))


def ponder_distribution(lambdas: torch.Tensor) -> torch.Tensor:
    """p_n = lambda_n prod_{j<n} (1 - lambda_j), with the leftover mass put on the last step."""
    survive = torch.cumprod(1 - lambdas, 1)
    before = torch.cat([torch.ones_like(survive[:, :1]), survive[:, :-1]], 1)
    p = lambdas * before
    return torch.cat([p[:, :-1], before[:, -1:]], 1)


def ponder_loss(lambdas, step_losses, prior: float, beta: float = 0.01) -> torch.Tensor:
    """PonderNet: sum_n p_n L_n + beta KL(p || Geometric(prior)) (truncated, renormalised)."""
    p = ponder_distribution(lambdas)
    k = torch.arange(lambdas.shape[1], device=lambdas.device)
    geometric = prior * (1 - prior) ** k
    geometric = geometric / geometric.sum()
    kl = (p * (p.clamp_min(1e-9).log() - geometric.log())).sum(1).mean()
    return (p * step_losses).sum(1).mean() + beta * kl


def ponder_steps(lambdas: torch.Tensor) -> torch.Tensor:
    return first_true(ponder_distribution(lambdas).cumsum(1) >= 0.5)


def act_distribution(halts: torch.Tensor, eps: float = 0.01):
    """ACT's (p_n [N, K], N [N], remainder [N])."""
    cumulative = halts.cumsum(1)
    n_steps = first_true(cumulative >= 1 - eps)
    k = torch.arange(1, halts.shape[1] + 1, device=halts.device)
    before = k[None] < n_steps[:, None]
    remainder = 1 - (halts * before).sum(1)
    p = halts * before + remainder[:, None] * (k[None] == n_steps[:, None])
    return p, n_steps, remainder


def act_loss(halts, step_losses, tau: float = 0.01, eps: float = 0.01) -> torch.Tensor:
    """ACT: sum_n p_n L_n + tau * (N + R) (ponder cost)."""
    p, n_steps, remainder = act_distribution(halts, eps)
    return (p * step_losses).sum(1).mean() + tau * (n_steps.float() + remainder).mean()


def act_steps(halts: torch.Tensor, eps: float = 0.01) -> torch.Tensor:
    return act_distribution(halts, eps)[1]


def fit_halting_unit(
    features: torch.Tensor, step_losses: torch.Tensor, loss_fn, epochs: int = 30, seed: int = 0
) -> HaltingUnit:
    """Train a PonderNet / ACT halting unit on frozen per-step features [N, K, D]."""
    torch.manual_seed(seed)
    unit = HaltingUnit(features.shape[-1])
    optimizer = torch.optim.Adam(unit.parameters(), lr=3e-3)
    n = features.shape[0]
    for _ in range(epochs):
        for index in torch.randperm(n).split(256):
            loss = loss_fn(unit(features[index]), step_losses[index])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return unit.eval()


def per_sample_step_losses(action_kind: str, actions: torch.Tensor, target: torch.Tensor):
    """L_n per sample and step [N, K] (cross-entropy or squared error)."""
    if action_kind == "continuous":
        return (actions - target[:, None]).pow(2).mean(-1)
    logp = actions.log_softmax(-1)
    return -logp.gather(2, target.long()[:, None, None].expand(-1, logp.shape[1], 1))[..., 0]
