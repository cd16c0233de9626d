"""TC-WM's math in pure torch: projection, state alignment, reconstruction, latent dynamics, CEM.

Notation (design note, section 1): ``e_t`` in R^{P x D} are the frozen encoder's patch tokens of
frame t; TC-WM projects them linearly, per patch, to ``z_t = W e_t`` in R^{P x d} (d << D),
splits ``z_t = [z^s_t ; z^c_t]`` into a task-centric part of ``aligned_dims`` channels and a
context part, aligns ``u_t = mean_p z^s_{t,p}`` with the agent's physical state by InfoNCE,
reconstructs ``e_t`` from ``z_t`` and learns latent dynamics ``z_{t+1} = f(z_{t-h+1:t}, a_t)``:

    L = L_dyn + alpha * L_nce + beta * L_rec                                   (eq. 1)

The abstract gives (i) the linear projection, (ii) the contrastive alignment of a designated
subspace, (iii) the reconstruction. Which channels are aligned, the pooling over patches, the
critic, the temperature, the stop-gradient on dynamics targets and the weights alpha, beta are
reconstructed from the first author's DINO-WM fork (MinghaoFu/dino_wm: half of the projected
channels are the "state" part, averaged over patches) or guessed; every one is a config value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

Critic = Literal["neg_sq_dist", "dot"]


class LinearProjection(nn.Module):
    """z = W e per patch token (no bias, no non-linearity: the abstract's "linearly projects").

    ``mode``: ``learned`` (trained by eq. 1), ``random`` (a fixed random orthonormal map: the
    random-projection ablation) or ``pca`` (fixed to the top principal directions of the training
    embeddings by :func:`pca_directions`: the PCA ablation). The fixed modes do not train.
    """

    def __init__(
        self, in_dim: int, out_dim: int, mode: Literal["learned", "random", "pca"] = "learned"
    ):
        super().__init__()
        if out_dim > in_dim:
            raise ValueError(
                f"the latent ({out_dim}) must be smaller than the embedding ({in_dim})"
            )
        self.mode = mode
        self.weight = nn.Parameter(torch.empty(out_dim, in_dim), requires_grad=mode == "learned")
        if mode == "learned":
            nn.init.kaiming_uniform_(self.weight, a=5**0.5)  # nn.Linear's initialisation
        else:
            # Orthonormal rows, so a fixed map neither squashes nor inflates the embedding.
            q, _ = torch.linalg.qr(torch.randn(in_dim, out_dim))
            self.weight.data.copy_(q.T)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return tokens @ self.weight.T

    @torch.no_grad()
    def set_pca(self, embeddings: torch.Tensor) -> None:
        """Fix W to the top principal directions of ``embeddings`` [N, D] (centred)."""
        self.weight.copy_(pca_directions(embeddings, self.weight.shape[0]))


def pca_directions(embeddings: torch.Tensor, k: int) -> torch.Tensor:
    """The top-k principal directions [k, D] of the rows of ``embeddings`` (centred)."""
    centred = embeddings - embeddings.mean(0, keepdim=True)
    _, _, vh = torch.linalg.svd(centred, full_matrices=False)
    return vh[:k]


def aligned_summary(z: torch.Tensor, aligned_dims: int) -> torch.Tensor:
    """u = mean over patches of the first ``aligned_dims`` channels: [..., P, d] -> [..., k]."""
    if aligned_dims > z.shape[-1]:
        raise ValueError(f"aligned_dims={aligned_dims} exceeds the latent size {z.shape[-1]}")
    return z[..., :aligned_dims].mean(-2)


def critic_logits(u: torch.Tensor, v: torch.Tensor, temperature: float, critic: Critic):
    """Pairwise scores [B, B] of the summaries u_i against the state encodings v_j = g(s_j).

    ``neg_sq_dist``: -||u_i - v_j||^2 / T (the critic under which contrastive learning is known
    to invert the generating map up to an affine one [G]); ``dot``: <u_i, v_j> / T.
    """
    if critic == "neg_sq_dist":
        return -torch.cdist(u, v).pow(2) / temperature
    if critic == "dot":
        return u @ v.T / temperature
    raise ValueError(f"unknown critic {critic!r}")


def info_nce(u: torch.Tensor, v: torch.Tensor, temperature: float, critic: Critic = "neg_sq_dist"):
    """Symmetric InfoNCE (design note, L_nce): the mean of

        -(1/B) sum_i log exp(l_ii) / sum_j exp(l_ij)   and   the same with i, j swapped,

    where l = critic_logits(u, v). Positives are the pairs (u_i, g(s_i)) of the same frame.
    """
    logits = critic_logits(u, v, temperature, critic)
    target = torch.arange(len(u), device=u.device)
    return 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target))


def reconstruction_loss(reconstructed: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """L_rec = mean ||R(z) - e||^2 over tokens and channels (design note)."""
    return (reconstructed - tokens).pow(2).mean()


def dynamics_loss(predicted: torch.Tensor, target: torch.Tensor, stop_gradient: bool = True):
    """L_dyn = mean ||z_hat_{t+1} - sg(z_{t+1})||^2; ``stop_gradient`` is reconstructed [G]:
    without it the projection may shrink the latent to lower the dynamics error."""
    return (predicted - (target.detach() if stop_gradient else target)).pow(2).mean()


def vc_regularizer(z: torch.Tensor, eps: float = 1e-4) -> tuple[torch.Tensor, torch.Tensor]:
    """VICReg's variance and covariance terms on rows of ``z`` [N, d] (the PLDM baseline):

    variance = mean_j relu(1 - sqrt(Var(z_j) + eps)); covariance = sum_{i != j} C_ij^2 / d.
    """
    z = z - z.mean(0)
    std = torch.sqrt(z.var(0) + eps)
    variance = F.relu(1.0 - std).mean()
    cov = (z.T @ z) / max(len(z) - 1, 1)
    off_diagonal = cov - torch.diag(torch.diag(cov))
    return variance, off_diagonal.pow(2).sum() / z.shape[1]


def temporal_smoothness(z: torch.Tensor) -> torch.Tensor:
    """PLDM's time-similarity term: mean ||z_{t+1} - z_t||^2 over the steps of windows
    ``z`` [B, T, ...] (slow features; Sobal et al. 2025)."""
    return (z[:, 1:] - z[:, :-1]).pow(2).flatten(2).sum(-1).mean()


def inverse_dynamics_loss(
    head: nn.Module, z_t: torch.Tensor, z_next: torch.Tensor, action: torch.Tensor
) -> torch.Tensor:
    """PLDM's inverse-dynamics term: mean ||head([z_t ; z_{t+1}]) - a_t||^2, so the latent
    keeps what the action changes (rows of ``z_t``, ``z_next`` [B, d])."""
    return (head(torch.cat([z_t, z_next], -1)) - action).pow(2).mean()


class ObservationEncoder(nn.Module):
    """The PLDM baseline's own encoder: the whole observation [..., P, D], flattened, through an
    MLP to one latent token [..., 1, d]. It learns its representation from the raw observation
    (no frozen foundation features, no state labels), from scratch with the world model."""

    def __init__(self, n_tokens: int, embed_dim: int, latent_dim: int, width: int = 64) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(n_tokens * embed_dim, width),
            nn.GELU(),
            nn.Linear(width, width),
            nn.GELU(),
            nn.Linear(width, latent_dim),
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.net(tokens.flatten(-2))[..., None, :]


class Predictor(nn.Module):
    """Latent dynamics f(z_{t-h+1:t}, a_t) -> z_{t+1} over P tokens of width ``dim``.

    The h history frames are concatenated per token (DINO-WM feeds history frames as tokens;
    per-token concatenation keeps the token count, and the cost, of one frame), the action
    enters as one extra token, a small Transformer mixes the tokens and the output is a residual
    on the last frame: z_{t+1} = z_t + head(...). An optional proprio vector (DINO-WM's proprio
    tokens) enters and leaves as one more token.
    """

    def __init__(
        self,
        dim: int,
        n_tokens: int,
        action_dim: int,
        history: int = 1,
        width: int = 64,
        layers: int = 2,
        heads: int = 4,
        proprio_dim: int = 0,
    ):
        super().__init__()
        self.history, self.proprio_dim = history, proprio_dim
        self.inp = nn.Linear(history * dim, width)
        self.action = nn.Linear(action_dim, width)
        self.position = nn.Parameter(torch.zeros(n_tokens + 1 + (proprio_dim > 0), width))
        nn.init.normal_(self.position, std=0.02)
        if proprio_dim:
            self.proprio_in = nn.Linear(history * proprio_dim, width)
            self.proprio_out = nn.Linear(width, proprio_dim)
        layer = nn.TransformerEncoderLayer(
            width, heads, 2 * width, dropout=0.0, batch_first=True, norm_first=True
        )
        self.mixer = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.out = nn.Linear(width, dim)

    def forward(self, z_hist: torch.Tensor, action: torch.Tensor, proprio_hist=None):
        """z_hist [B, h, P, d], action [B, A], proprio_hist [B, h, S] or None -> z [B, P, d],
        proprio [B, S] or None."""
        b, h, p, d = z_hist.shape
        if h != self.history:
            raise ValueError(f"the predictor takes {self.history} history frames, got {h}")
        tokens = [self.inp(z_hist.permute(0, 2, 1, 3).reshape(b, p, h * d))]
        tokens.append(self.action(action)[:, None])
        if self.proprio_dim:
            tokens.append(self.proprio_in(proprio_hist.reshape(b, 1, -1)))
        mixed = self.mixer(torch.cat(tokens, 1) + self.position)
        z_next = z_hist[:, -1] + self.out(mixed[:, :p])
        if not self.proprio_dim:
            return z_next, None
        return z_next, proprio_hist[:, -1] + self.proprio_out(mixed[:, -1])


class StatePredictor(nn.Module):
    """The state oracle's dynamics: s_{t+1} = s_t + MLP([s_{t-h+1:t}, a_t])."""

    def __init__(self, state_dim: int, action_dim: int, history: int = 1, width: int = 64):
        super().__init__()
        self.history = history
        self.net = nn.Sequential(
            nn.Linear(history * state_dim + action_dim, width),
            nn.GELU(),
            nn.Linear(width, width),
            nn.GELU(),
            nn.Linear(width, state_dim),
        )

    def forward(self, s_hist: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return s_hist[:, -1] + self.net(torch.cat([s_hist.flatten(1), action], -1))


def cem_plan(
    cost: Callable[[torch.Tensor], torch.Tensor],
    action_dim: int,
    horizon: int,
    samples: int = 256,
    iterations: int = 8,
    elites: int = 32,
    init_std: float = 1.0,
    generator: torch.Generator | None = None,
    low: float = -1.0,
    high: float = 1.0,
) -> torch.Tensor:
    """The cross-entropy method (as DINO-WM's planner): sample action sequences from a Gaussian,
    keep the ``elites`` lowest-cost ones, refit mean and std, repeat; returns the final mean
    [horizon, action_dim]. ``cost`` maps candidates [N, horizon, A] (clipped to [low, high]) to
    costs [N]."""
    mean = torch.zeros(horizon, action_dim)
    std = torch.full((horizon, action_dim), init_std)
    for _ in range(iterations):
        noise = torch.randn(samples, horizon, action_dim, generator=generator)
        candidates = (mean + std * noise).clamp(low, high)
        best = candidates[cost(candidates).topk(elites, largest=False).indices]
        mean, std = best.mean(0), best.std(0) + 1e-3
    return mean.clamp(low, high)


def latent_cost(
    predicted: torch.Tensor,
    goal: torch.Tensor,
    aligned_dims: int | None = None,
    context_weight: float = 0.0,
) -> torch.Tensor:
    """Planning cost of final latents [N, P, d] against the goal's [P, d].

    ``aligned_dims=None``: the mean squared distance over all tokens and channels (DINO-WM's
    cost on full embeddings). Otherwise TC-WM's: the squared distance of the aligned summaries
    u plus ``context_weight`` times the mean squared distance of the context channels (design
    note: "only z^s, or weighted [z^s; z^c]").
    """
    if aligned_dims is None:
        return (predicted - goal).pow(2).flatten(1).mean(1)
    summary = aligned_summary(predicted, aligned_dims) - aligned_summary(goal, aligned_dims)
    cost = summary.pow(2).sum(-1)
    if context_weight:
        context = (predicted[..., aligned_dims:] - goal[..., aligned_dims:]).pow(2)
        cost = cost + context_weight * context.flatten(1).mean(1)
    return cost
