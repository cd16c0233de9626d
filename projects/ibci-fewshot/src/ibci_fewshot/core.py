"""Pooled GRU + CTC backbone and a meta-learned alignment layer for few-shot iBCI decoding.

Notation (per 20 ms bin t of a sentence, session d):

- x_t in R^C: binned threshold crossings, C = 192, standardised with held-in statistics and
  smoothed by a Gaussian kernel over time (sigma bins) [R: the public brain-to-text decoder].
- Alignment A_phi (the "lightweight alignment layer", form not stated [G]):
    affine:        A_phi(x) = W x + b,                      phi = (W, b), W_0 = I
    diag_lowrank:  A_phi(x) = (1 + g) * x + U (V^T x) + b,  phi = (g, U, V, b), rank r
    affine_softsign (the session layer of the contrast):    softsign(W x + b)
- Backbone B_theta: linear C -> P, unfold over time (kernel k, stride s), GRU stack, linear to
  K = 32 classes (blank + 31 characters), log-softmax; trained with CTC (eq. 1):
    L(theta, phi; S) = mean_{(x, y) in S} CTC(log_softmax(B_theta(A_phi(x))), y) / |y|.
- Stage 1 (pooled): min_theta sum_{held-in d} L(theta, I; D_d) under drift augmentation, with no
  session-specific input layer.
- Stage 2 (theta frozen), meta-learning over episodes (support S, query Q of one session with a
  random synthetic drift) with per-tensor learned inner step sizes alpha = exp(a) (Meta-SGD):
    phi_{j+1} = phi_j - alpha * grad_phi L(theta, phi_j; S),   j = 0..k-1,  phi_0 learned  (eq. 2)
    min_{phi_0, a} E_episodes L(theta, phi_k; Q)                                          (eq. 3)
  First order: the inner gradients are treated as constants (FOMAML; alpha still gets the
  first-order gradient -sum_j g_j . dL_Q/dphi_k). Second order differentiates through the inner
  gradients; `torch.nn.functional.ctc_loss` has no double backward, so that path uses
  `ctc_loss_pure`, a log-space CTC forward recursion in plain torch (eq. 4).
- Deployment on a new session: eq. 2 from phi_0 on its few calibration sentences, then decode.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import grad

# FALCON H2's characters: a-z, '>' (space), '~' (period), ',', '?', "'". Class 0 is the CTC blank.
CHARSET = "abcdefghijklmnopqrstuvwxyz>~,?'"
BLANK = 0
N_CLASSES = len(CHARSET) + 1
AlignmentForm = Literal["affine", "diag_lowrank", "affine_softsign"]
Params = dict[str, torch.Tensor]


class CharacterError(ValueError):
    """A transcript holds a character outside FALCON H2's 31."""

    user_facing = True


def encode_text(text: str) -> list[int]:
    """Characters -> class indices 1..31 (0 is the blank)."""
    bad = sorted({c for c in text if c not in CHARSET})
    if bad:
        raise CharacterError(
            f"the transcript {text!r} holds {bad}, outside FALCON H2's 31 characters {CHARSET!r}"
        )
    return [CHARSET.index(c) + 1 for c in text]


def decode_indices(indices: list[int]) -> str:
    return "".join(CHARSET[i - 1] for i in indices if i != BLANK)


# --------------------------------------------------------------------------------------------
# CTC
# --------------------------------------------------------------------------------------------


def ctc_loss_pure(
    log_probs: torch.Tensor,  # [T, B, K] log-softmax outputs
    targets: torch.Tensor,  # [B, L] padded label indices (no blanks)
    input_lengths: torch.Tensor,  # [B]
    target_lengths: torch.Tensor,  # [B]
    blank: int = BLANK,
) -> torch.Tensor:
    """Eq. 4: the CTC negative log-likelihood per sequence [B] by the forward recursion over the
    blank-extended label l' (length 2L+1) in log space:

        alpha_1(0) = y_1(blank), alpha_1(1) = y_1(l'_1)
        alpha_t(s) = y_t(l'_s) + logsumexp(alpha_{t-1}(s), alpha_{t-1}(s-1),
                                          alpha_{t-1}(s-2) if l'_s != blank and l'_s != l'_{s-2})
        -log p(l | x) = -logsumexp(alpha_T(2L), alpha_T(2L-1))

    Plain torch ops only, so it has second derivatives (F.ctc_loss does not). Every label must
    be non-empty (an empty transcript is not a sentence)."""
    if bool((target_lengths < 1).any()):
        raise ValueError("ctc_loss_pure needs target_lengths >= 1 (empty transcripts)")
    n_steps, batch, _ = log_probs.shape
    max_label = targets.shape[1]
    n_states = 2 * max_label + 1
    extended = torch.full((batch, n_states), blank, dtype=torch.long, device=targets.device)
    extended[:, 1::2] = targets
    # l'_s == l'_{s-2} or l'_s is blank: the skip transition s-2 -> s is not allowed
    same = torch.zeros_like(extended, dtype=torch.bool)
    same[:, 2:] = extended[:, 2:] == extended[:, :-2]
    skip_allowed = (extended != blank) & ~same
    neg_inf = torch.finfo(log_probs.dtype).min / 4
    emit = log_probs.gather(2, extended.unsqueeze(0).expand(n_steps, -1, -1))  # [T, B, S]
    first = torch.full((batch, n_states), neg_inf, dtype=log_probs.dtype, device=log_probs.device)
    first[:, 0] = emit[0, :, 0]
    first[:, 1] = emit[0, :, 1]
    alpha = first
    pad = torch.full((batch, 1), neg_inf, dtype=log_probs.dtype, device=log_probs.device)
    for t in range(1, n_steps):
        shift1 = torch.cat([pad, alpha[:, :-1]], dim=1)
        shift2 = torch.cat([pad, pad, alpha[:, :-2]], dim=1)
        shift2 = torch.where(skip_allowed, shift2, torch.full_like(shift2, neg_inf))
        stacked = torch.stack([alpha, shift1, shift2], dim=0)
        updated = torch.logsumexp(stacked, dim=0) + emit[t]
        active = (t < input_lengths).unsqueeze(1)  # past a sequence's end alpha stays put
        alpha = torch.where(active, updated, alpha)
    last = 2 * target_lengths  # index of the final blank in l'
    end_blank = alpha.gather(1, last.unsqueeze(1)).squeeze(1)
    end_label = alpha.gather(1, (last - 1).unsqueeze(1)).squeeze(1)
    return -torch.logaddexp(end_blank, end_label)


def ctc_loss(
    log_probs: torch.Tensor,  # [B, T, K]
    targets: torch.Tensor,  # [B, L]
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    impl: Literal["torch", "pure"] = "torch",
) -> torch.Tensor:
    """Eq. 1's CTC term: mean over the batch of the per-sequence loss divided by its label length
    (F.ctc_loss's reduction='mean'). ``impl='pure'`` supports second order."""
    if impl not in ("torch", "pure"):
        raise ValueError(f"ctc_loss: impl must be 'torch' or 'pure', got {impl!r}")
    time_major = log_probs.transpose(0, 1)  # [T, B, K]
    if impl == "torch":
        return F.ctc_loss(
            time_major,
            targets,
            input_lengths,
            target_lengths,
            blank=BLANK,
            reduction="mean",
            zero_infinity=True,
        )
    per_sequence = ctc_loss_pure(time_major, targets, input_lengths, target_lengths)
    return (per_sequence / target_lengths.clamp(min=1).to(per_sequence.dtype)).mean()


def greedy_decode(log_probs: torch.Tensor, lengths: torch.Tensor) -> list[list[int]]:
    """Best path: argmax per step, merge repeats, drop blanks. [B, T, K] -> label lists."""
    best = log_probs.argmax(-1).cpu()
    decoded = []
    for row, length in zip(best, lengths.cpu().tolist(), strict=True):
        out, previous = [], BLANK
        for k in row[:length].tolist():
            if k != previous and k != BLANK:
                out.append(k)
            previous = k
        decoded.append(out)
    return decoded


# --------------------------------------------------------------------------------------------
# Preprocessing and augmentation
# --------------------------------------------------------------------------------------------


def gaussian_smooth(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """Causal-free Gaussian smoothing over time of [B, T, C] (kernel +-3 sigma, normalised)."""
    if sigma <= 0:
        return x
    half = max(1, int(math.ceil(3 * sigma)))
    offsets = torch.arange(-half, half + 1, dtype=x.dtype, device=x.device)
    kernel = torch.exp(-0.5 * (offsets / sigma) ** 2)
    kernel = kernel / kernel.sum()
    channels = x.shape[-1]
    weight = kernel.view(1, 1, -1).expand(channels, 1, -1)
    smoothed = F.conv1d(x.transpose(1, 2), weight, padding=half, groups=channels)
    return smoothed.transpose(1, 2)


def drift_augment(
    x: torch.Tensor,  # [B, T, C] standardised
    white_noise: float,
    offset_sd: float,
    gain_sd: float,
) -> torch.Tensor:
    """Stage-1 drift augmentation [R]: per-sentence per-channel gain (log-normal) and constant
    offset, plus white noise (whiteNoiseSD / constantOffsetSD of the public decoder)."""
    batch, _, channels = x.shape
    gain = torch.exp(gain_sd * torch.randn(batch, 1, channels, device=x.device))
    offset = offset_sd * torch.randn(batch, 1, channels, device=x.device)
    return x * gain + offset + white_noise * torch.randn_like(x)


def random_drift(channels: int, gain_sd: float, offset_sd: float, mix_sd: float):
    """One random drift for a whole episode [R]: (gain [C], offset [C], mixing [C, C]) with
    log-normal gains, Gaussian offsets and M = I + mix_sd / sqrt(C) * noise."""
    gain = torch.exp(gain_sd * torch.randn(channels))
    offset = offset_sd * torch.randn(channels)
    mixing = torch.eye(channels) + mix_sd / math.sqrt(channels) * torch.randn(channels, channels)
    return gain, offset, mixing


def apply_drift(x: torch.Tensor, drift) -> torch.Tensor:
    """x [..., C] -> (g * x + o) M."""
    gain, offset, mixing = drift
    return (x * gain + offset) @ mixing


# --------------------------------------------------------------------------------------------
# Alignment layer
# --------------------------------------------------------------------------------------------


def identity_alignment(
    channels: int, form: AlignmentForm, rank: int = 8, generator: torch.Generator | None = None
) -> Params:
    """phi at the identity map (affine: W = I, b = 0; diag_lowrank: g = 0, U = 0, b = 0 and a
    random V, so that U gets a gradient)."""
    if form in ("affine", "affine_softsign"):
        return {"weight": torch.eye(channels), "bias": torch.zeros(channels)}
    v = torch.randn(channels, rank, generator=generator) / math.sqrt(channels)
    return {
        "gain": torch.zeros(channels),
        "u": torch.zeros(channels, rank),
        "v": v,
        "bias": torch.zeros(channels),
    }


def apply_alignment(x: torch.Tensor, phi: Mapping[str, torch.Tensor], form: AlignmentForm):
    """A_phi(x) for x [..., C] (the module docstring's three forms)."""
    if form == "diag_lowrank":
        return (1 + phi["gain"]) * x + (x @ phi["v"]) @ phi["u"].T + phi["bias"]
    out = x @ phi["weight"].T + phi["bias"]
    return F.softsign(out) if form == "affine_softsign" else out


def relative_input_change(x: torch.Tensor, phi: Mapping[str, torch.Tensor], form: AlignmentForm):
    """||A_phi(x) - A_phi0(x)|| / ||A_phi0(x)|| with phi0 the identity: how much the adapted layer
    changes its input (a diagnostic). For the softsign form the reference is softsign(x)."""
    reference = F.softsign(x) if form == "affine_softsign" else x
    return ((apply_alignment(x, phi, form) - reference).norm() / reference.norm()).item()


def change_norms(phi: Mapping[str, torch.Tensor], start: Mapping[str, torch.Tensor]):
    """{name: ||phi[name] - start[name]||_F}: how far adaptation moved each tensor (||dW||_F and
    ||db|| for the affine form), free of the start's own norm (the identity's sqrt(C) would
    swamp a relative distance)."""
    return {k: float((phi[k] - start[k]).detach().norm()) for k in phi}


def step_size_shape(tensor: torch.Tensor, shape: str) -> tuple[int, ...]:
    """Shape of the learned log inner step size of one alignment tensor (eq. 2's alpha):
    ``tensor`` one scalar (MAML with a learned rate), ``row`` one per output row (a 2-D
    tensor's first axis; per element for a vector), ``element`` one per entry (Meta-SGD)."""
    if shape == "tensor":
        return ()
    if shape == "row":
        return (tensor.shape[0],) + (1,) * (tensor.dim() - 1)
    if shape == "element":
        return tuple(tensor.shape)
    raise ValueError(f"unknown step-size shape {shape!r}: tensor, row or element")


def parameter_distance(phi: Mapping[str, torch.Tensor], start: Mapping[str, torch.Tensor]):
    """||phi - start|| / ||start|| over all tensors (how far adaptation moved from its start)."""
    diff = sum(float(((phi[k] - start[k]).detach() ** 2).sum()) for k in phi)
    norm = sum(float((start[k].detach() ** 2).sum()) for k in start)
    return math.sqrt(float(diff) / max(float(norm), 1e-12))


# --------------------------------------------------------------------------------------------
# Backbone
# --------------------------------------------------------------------------------------------


class GRUDecoder(nn.Module):
    """B_theta: linear C -> P, unfold (kernel k, stride s) -> GRU stack -> linear to K classes."""

    def __init__(
        self,
        channels: int = 192,
        projection: int = 64,
        hidden: int = 96,
        layers: int = 2,
        kernel: int = 6,
        stride: int = 3,
        n_classes: int = N_CLASSES,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.kernel, self.stride = kernel, stride
        self.project = nn.Linear(channels, projection)
        self.gru = nn.GRU(
            projection * kernel,
            hidden,
            num_layers=layers,
            batch_first=True,
            dropout=dropout if layers > 1 else 0.0,
        )
        self.readout = nn.Linear(hidden, n_classes)

    def output_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        """Unfolded steps of a sequence of ``lengths`` bins (at least 1)."""
        return ((lengths - self.kernel) // self.stride + 1).clamp(min=1)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor):
        """x [B, T, C] (aligned) -> (log-probs [B, T', K], lengths [B])."""
        if x.shape[1] < self.kernel:
            x = F.pad(x, (0, 0, 0, self.kernel - x.shape[1]))
        z = self.project(x)  # [B, T, P]
        z = z.unfold(1, self.kernel, self.stride)  # [B, T', P, k]
        z = z.flatten(2)  # [B, T', P*k]
        hidden, _ = self.gru(z)
        return F.log_softmax(self.readout(hidden), dim=-1), self.output_lengths(lengths)


class SessionLayers(nn.Module):
    """Session-specific input layers of the contrast: softsign(W_d x + b_d), W_d init I."""

    def __init__(self, n_sessions: int, channels: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.eye(channels).repeat(n_sessions, 1, 1))  # [S, C, C]
        self.bias = nn.Parameter(torch.zeros(n_sessions, channels))

    def forward(self, x: torch.Tensor, session: torch.Tensor) -> torch.Tensor:
        """x [B, T, C], session [B] -> [B, T, C]."""
        out = torch.einsum("btc,bdc->btd", x, self.weight[session]) + self.bias[session, None]
        return F.softsign(out)

    def mean_layer(self) -> Params:
        """The mean held-in layer: the new session's starting point."""
        return {"weight": self.weight.detach().mean(0), "bias": self.bias.detach().mean(0)}


# --------------------------------------------------------------------------------------------
# Meta-learning (torch.func)
# --------------------------------------------------------------------------------------------


def adapt(
    loss_of: Callable[[Params], torch.Tensor],
    start: Params,
    log_step: Params,
    steps: int,
    first_order: bool = True,
) -> Params:
    """Eq. 2: ``steps`` gradient steps phi <- phi - exp(log_step) * grad loss_of(phi) from
    ``start``, with gradients from ``torch.func.grad``. Second order keeps the inner gradients in
    the graph (needs a loss with double backward: the pure CTC); first order detaches them."""
    phi = dict(start)
    loss_grad = grad(loss_of)
    for _ in range(steps):
        gradients = loss_grad(phi)
        if first_order:
            gradients = {k: g.detach() for k, g in gradients.items()}
        phi = {k: phi[k] - torch.exp(log_step[k]) * gradients[k] for k in phi}
    return phi


def episode_loss(
    decoder: GRUDecoder,
    form: AlignmentForm,
    support: Mapping[str, torch.Tensor],
    query: Mapping[str, torch.Tensor],
    start: Params,
    log_step: Params,
    steps: int,
    first_order: bool = True,
) -> tuple[torch.Tensor, Params]:
    """Eq. 3 for one episode: adapt on the support, return the query loss at phi_k (and phi_k).
    First order uses F.ctc_loss; second order the pure CTC."""
    impl = "torch" if first_order else "pure"

    def loss_on(batch: Mapping[str, torch.Tensor]) -> Callable[[Params], torch.Tensor]:
        def loss_of(phi: Params) -> torch.Tensor:
            log_probs, lengths = decoder(apply_alignment(batch["x"], phi, form), batch["lengths"])
            return ctc_loss(log_probs, batch["y"], lengths, batch["y_lengths"], impl=impl)

        return loss_of

    adapted = adapt(loss_on(support), start, log_step, steps, first_order)
    return loss_on(query)(adapted), adapted


def fit_by_gradient(
    loss_of: Callable[[Params], torch.Tensor],
    start: Params,
    lr: float,
    steps: int,
    weight_decay_to_start: float = 0.0,
) -> Params:
    """Plain adaptation (the baselines): Adam on loss_of(phi) from ``start``."""
    phi = {k: v.detach().clone().requires_grad_(True) for k, v in start.items()}
    optimizer = torch.optim.Adam(phi.values(), lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = loss_of(phi)
        if weight_decay_to_start:
            loss = loss + weight_decay_to_start * sum(((phi[k] - start[k]) ** 2).sum() for k in phi)
        loss.backward()
        optimizer.step()
    return {k: v.detach() for k, v in phi.items()}
