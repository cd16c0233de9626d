"""Adaptive Internal Computation (AIC): the method in pure torch (no Lightning, no I/O).

A policy refines a latent state and reads out an action after every refinement step:

    x = E(s),  h_0 = x,  h_k = F_theta(h_{k-1}, x)                    k = 1..K_max  (Eq. 1)
    z_k = phi(pool(h_k)),  pi_k(. | s) = pi(z_k),  u_k = u_psi(z_k, k / K_max, c_k, d_k)  (Eq. 2)

where the halting head also sees the readout's own signal (``readout_signals``, detached):
its confidence c_k = max_a pi_k(a | s) and its change between steps
d_k = 1/2 ||pi_k - pi_{k-1}||_1 (d_1 = 0); continuous actions: c_k = 0,
d_k = mean_a |mu_k - mu_{k-1}|. [G] The design note allows the head any state feature; these
two are the ones confidence exit halts on.

The value of the action readout after k steps is its expected return

    R_k(s) = Q(s, argmax_a pi_k(a | s))        discrete control, critic Q (learned or exact)
    R_k(s) = log pi_k(y | s)                   language modelling (the return is log-likelihood)
    R_k(s) = -||mu_k(s) - a*(s)||^2 / A        continuous imitation of an expert a*   (Eq. 3)

and the value of computation (VoC) of refining beyond step k is the gain it buys,

    g_k = R_{k+1} - R_k                        (one-step, the abstract's "per-step gain")
    G_k = max_{j > k} R_j - R_k                (cumulative; robust to one-step plateaus)  (Eq. 4)

with g_{K_max} = G_{K_max} = 0. The halting head regresses the *detached* VoC target,

    L_halt = sum_k Huber(u_k, sg[g_k])                                              (Eq. 5)

or [G] (``halt_objective="classifier"``) classifies whether the next step pays its price,
u_k = sigmoid(l_k) ~ P(g_k > lambda_train), with class-balanced binary cross-entropy

    L_halt = -sum_k [w_+ y_k log u_k + w_- (1 - y_k) log(1 - u_k)]                  (Eq. 5')
    y_k = 1[sg[g_k] > lambda_train],  w_+ = N / (2 N_+),  w_- = N / (2 N_-)

(the gain is zero on most (state, step) pairs, so the regression mostly learns the per-step
mean; the classifier is then halted with a probability threshold in place of the price).

and inference halts at the first step whose predicted gain no longer pays the price lambda:

    K(s) = min{k : u_k < lambda} (or K_max),  act with pi_{K(s)}                       (Eq. 6)

Training uses deep supervision so every intermediate readout is a usable policy:

    L = 1/K_max sum_k L_policy(pi_k) + c_Q L_critic + beta L_halt                     (Eq. 7)

Compute is counted as the number of refinement steps and as analytic FLOPs per decision
(``flops_per_decision``): the encoder once, the core per step, and only the heads a rule really
runs (a fixed-K policy reads out once; AIC runs its halting head per step and reads out
once). ``adaptive_act`` runs Eq. 6 on a compacted batch: halted samples are
dropped from the batch, so they really skip the remaining steps.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from aic.architectures import FORM_OF, Encoder, check_architecture, make_refiner, pool
from papers_cli import UserError

RETURN_KINDS = ("q", "likelihood", "imitation")


def check_price(price: float) -> float:
    """A price per refinement step must be >= 0 (a negative price rewards computing forever)."""
    if not price >= 0:
        raise UserError(
            f"price_per_step={price} is negative (or NaN). The price is the return one "
            "refinement step must buy to be worth running; use a value >= 0 (e.g. 0.01)."
        )
    return float(price)


class AICPolicy(nn.Module):
    """Encoder, weight-tied refinement core, and the per-step policy / halting heads; a critic
    head Q(s, .) for discrete control (Eq. 1-2)."""

    def __init__(
        self,
        obs_kind: str,
        obs_shape: tuple[int, ...],
        n_actions: int,
        action_kind: str = "discrete",
        architecture: str = "iru",
        dim: int = 64,
        k_max: int = 8,
        vocab: int = 0,
        action_scale: float = 1.0,
        critic: bool = False,
        halt_objective: str = "regression",
    ):
        super().__init__()
        check_architecture(architecture, obs_kind, dim)
        self.architecture, self.k_max, self.action_kind = architecture, k_max, action_kind
        self.action_scale = action_scale
        form = FORM_OF[architecture]
        self.encoder = Encoder(obs_kind, tuple(obs_shape), vocab, dim, form)
        self.refiner = make_refiner(architecture, dim)
        self.feature = nn.Sequential(
            nn.Linear(dim if form == "vector" else 2 * dim, dim), nn.LayerNorm(dim), nn.GELU()
        )
        self.policy_head = nn.Linear(dim, n_actions)
        # input: z_k, k / K_max, and the readout's confidence and change (readout_signals)
        self.halting_head = nn.Sequential(nn.Linear(dim + 3, dim), nn.GELU(), nn.Linear(dim, 1))
        self.halt_objective = halt_objective
        self.critic_head = nn.Linear(dim, n_actions) if critic else None

    def encode(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.encoder(obs)

    def step(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Eq. 1: one refinement step."""
        return self.refiner(h, x)

    def features(self, h: torch.Tensor, focus: torch.Tensor | None) -> torch.Tensor:
        return self.feature(pool(h, focus))  # [B, D]

    def act_head(self, z: torch.Tensor) -> torch.Tensor:
        """Eq. 2: logits [B, A] (discrete) or the action mean [B, A] (continuous)."""
        out = self.policy_head(z)
        return torch.tanh(out) * self.action_scale if self.action_kind == "continuous" else out

    def halt_head(self, z: torch.Tensor, k: int, signals: torch.Tensor) -> torch.Tensor:
        """Eq. 2: predicted value of computing beyond step k, [B]; ``signals`` [B, 2] are the
        readout's confidence and change (``readout_signals``). Classifier: P(gain > price)."""
        step = torch.full_like(z[:, :1], k / self.k_max)
        out = self.halting_head(torch.cat([z, step, signals], -1)).squeeze(-1)
        return torch.sigmoid(out) if self.halt_objective == "classifier" else out

    def readout_signals(self, readout: torch.Tensor, previous: torch.Tensor | None) -> torch.Tensor:
        """The readout's confidence c_k and change d_k of Eq. 2, detached, [B, 2]."""
        readout = readout.detach()
        if self.action_kind == "continuous":
            confidence = torch.zeros_like(readout[:, 0])
            change = (
                torch.zeros_like(confidence)
                if previous is None
                else (readout - previous.detach()).abs().mean(-1)
            )
            return torch.stack([confidence, change], -1)
        probs = readout.softmax(-1)
        confidence = probs.amax(-1)
        if previous is None:
            change = torch.zeros_like(confidence)
        else:
            change = 0.5 * (probs - previous.detach().softmax(-1)).abs().sum(-1)
        return torch.stack([confidence, change], -1)

    def forward(self, obs: torch.Tensor, k_max: int | None = None) -> dict[str, torch.Tensor]:
        """All K readouts of a batch: actions [B, K, A], halt [B, K], features [B, K, D] and
        the critic Q(s, .) [B, A] read from the last step."""
        k_max = k_max or self.k_max
        x, focus = self.encode(obs)
        h, actions, halts, feats = x, [], [], []
        for k in range(1, k_max + 1):
            h = self.step(h, x)
            z = self.features(h, focus)
            feats.append(z)
            actions.append(self.act_head(z))
            signals = self.readout_signals(actions[-1], actions[-2] if k > 1 else None)
            halts.append(self.halt_head(z, k, signals))
        out = {
            "actions": torch.stack(actions, 1),
            "halt": torch.stack(halts, 1),
            "features": torch.stack(feats, 1),
        }
        if self.critic_head is not None:
            out["q"] = self.critic_head(feats[-1])
        return out


def step_returns(
    kind: str, actions: torch.Tensor, target: torch.Tensor, q_values: torch.Tensor | None = None
) -> torch.Tensor:
    """Eq. 3: R_k(s) for every step, [B, K].

    kind "q": greedy action under ``q_values`` [B, A]; "likelihood": log pi_k(target);
    "imitation": negative mean squared distance to the expert action ``target`` [B, A].
    """
    if kind == "q":
        greedy = actions.argmax(-1)  # [B, K]
        return q_values.gather(1, greedy)
    if kind == "likelihood":
        logp = actions.log_softmax(-1)
        return logp.gather(2, target.long()[:, None, None].expand(-1, logp.shape[1], 1))[..., 0]
    if kind == "imitation":
        return -(actions - target[:, None]).pow(2).mean(-1)
    raise ValueError(f"unknown return kind {kind!r}; one of {RETURN_KINDS}")


def voc_targets(returns: torch.Tensor, horizon: str = "one_step") -> torch.Tensor:
    """Eq. 4: detached value-of-computation targets [B, K] (last step: 0)."""
    returns = returns.detach()
    if horizon == "one_step":
        gain = returns[:, 1:] - returns[:, :-1]
    elif horizon == "cumulative":
        # best return any later step reaches: reverse cumulative max over j > k
        best_later = returns.flip(1).cummax(1).values.flip(1)[:, 1:]
        gain = best_later - returns[:, :-1]
    else:
        raise ValueError(f"unknown VoC horizon {horizon!r}; use 'one_step' or 'cumulative'")
    return torch.cat([gain, torch.zeros_like(returns[:, :1])], 1)


def halting_loss(predicted: torch.Tensor, target: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Eq. 5: Huber regression of the halting head on the detached VoC target."""
    return F.smooth_l1_loss(predicted / scale, target.detach() / scale, beta=1.0)


def halting_classifier_loss(
    probability: torch.Tensor, gain: torch.Tensor, price: float
) -> torch.Tensor:
    """Eq. 5': class-balanced binary cross-entropy of P(g_k > price) on the detached gain; each
    class present in the batch carries an equal share of the weight (one class: plain BCE)."""
    label = (gain.detach() > price).float()
    n = label.numel()
    n_pos = label.sum()
    n_neg = n - n_pos
    classes = (n_pos > 0).float() + (n_neg > 0).float()
    w_pos = n / (classes * n_pos.clamp(min=1))
    w_neg = n / (classes * n_neg.clamp(min=1))
    weight = label * w_pos + (1 - label) * w_neg
    p = probability.clamp(1e-6, 1 - 1e-6)
    return F.binary_cross_entropy(p, label, weight=weight)


def policy_losses(kind: str, actions: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-step imitation / language-modelling loss [K] (cross-entropy or squared error)."""
    if kind == "continuous":
        return (actions - target[:, None]).pow(2).mean((0, 2))
    steps = actions.shape[1]
    logits = actions.reshape(-1, actions.shape[-1])
    labels = target.long()[:, None].expand(-1, steps).reshape(-1)
    return F.cross_entropy(logits, labels, reduction="none").view(-1, steps).mean(0)


def deep_supervision_loss(per_step: torch.Tensor, deep: bool = True) -> torch.Tensor:
    """Eq. 7's policy term: mean over all steps (deep) or the last step only (fixed-K)."""
    return per_step.mean() if deep else per_step[-1]


def halting_steps(halt: torch.Tensor, price: float) -> torch.Tensor:
    """Eq. 6: K(s) = first k (1-based) with u_k < price, else K_max; halt [B, K] -> [B]."""
    check_price(price)
    below = halt < price
    below[:, -1] = True
    return below.float().argmax(1) + 1


def select_steps(actions: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """The readout of each sample at its own step count: [B, K, A], [B] -> [B, A]."""
    return actions[torch.arange(actions.shape[0]), steps.long() - 1]


@torch.no_grad()
def adaptive_act(
    policy: AICPolicy, obs: torch.Tensor, price: float, k_max: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 6 with compacted batches: returns (action readout [B, A], steps [B]).

    After every step the halted samples leave the batch, so later steps run only on the
    samples still refining; the work done is sum_b K(s_b) steps, not B * max_b K(s_b).
    """
    check_price(price)
    k_max = k_max or policy.k_max
    x, focus = policy.encode(obs)
    batch = obs.shape[0]
    active = torch.arange(batch, device=obs.device)
    h = x
    actions, previous = None, None
    steps = torch.zeros(batch, dtype=torch.long, device=obs.device)
    for k in range(1, k_max + 1):
        h = policy.step(h, x)
        z = policy.features(h, focus)
        readout = policy.act_head(z)  # the halting head reads its confidence and change
        halt_now = policy.halt_head(z, k, policy.readout_signals(readout, previous)) < price
        if k == k_max:
            halt_now[:] = True
        if halt_now.any():
            done = active[halt_now]
            if actions is None:
                actions = readout.new_zeros(batch, readout.shape[-1])
            actions[done] = readout[halt_now]
            steps[done] = k
        keep = ~halt_now
        if not keep.any():
            break
        active, h, x, previous = active[keep], h[keep], x[keep], readout[keep]
        focus = None if focus is None else focus[keep]
    return actions, steps


def count_flops(policy: AICPolicy, obs: torch.Tensor) -> dict[str, int]:
    """Analytic FLOPs of one sample (torch.utils.flop_counter; matmuls and convolutions), per
    part: the encoder (paid once), one refinement step of the core, the feature map
    phi(pool(h)), the policy head pi and the halting head u (Eq. 1-2)."""
    obs = obs[:1]
    was_training = policy.training
    policy.train()  # the training path has no fused kernels the counter cannot see
    parts = {}
    with torch.no_grad():
        with FlopCounterMode(display=False) as counter:
            x, focus = policy.encode(obs)
        parts["encoder"] = counter.get_total_flops()
        with FlopCounterMode(display=False) as counter:
            h = policy.step(x, x)
        parts["core"] = counter.get_total_flops()
        with FlopCounterMode(display=False) as counter:
            z = policy.features(h, focus)
        parts["feature"] = counter.get_total_flops()
        with FlopCounterMode(display=False) as counter:
            readout = policy.act_head(z)
        parts["policy"] = counter.get_total_flops()
        with FlopCounterMode(display=False) as counter:
            policy.halt_head(z, 1, policy.readout_signals(readout, None))
        parts["halt"] = counter.get_total_flops()
    policy.train(was_training)
    return {name: int(value) for name, value in parts.items()}


# What a halting rule must compute at every step it runs, besides the core step:
#   "none":     nothing (fixed K, random halting): one readout at the end;
#   "halt":     the features and a halting head (PonderNet, ACT), one readout at the end;
#   "readout":  the features and the policy readout (confidence exit, exact-value oracle);
#   "readout_halt": the features, the readout and a halting head reading it (AIC).
PER_STEP_WORK = ("none", "halt", "readout", "readout_halt")


def flops_per_decision(
    flops: dict[str, int], steps: torch.Tensor | float, per_step: str, halt_flops: int | None = None
) -> torch.Tensor | float:
    """FLOPs of one decision that ran ``steps`` refinement steps under a halting rule:

        fixed K / random:  encoder + K core + feature + policy                (one readout)
        halting head:      encoder + K (core + feature + halt) + policy
        readout each step: encoder + K (core + feature + policy)
        AIC (head reads the readout): encoder + K (core + feature + policy + halt)

    ``halt_flops`` replaces the AIC halting head's cost for another head (PonderNet, ACT)."""
    halt = flops["halt"] if halt_flops is None else halt_flops
    once = flops["encoder"]
    if per_step == "none":
        return once + steps * flops["core"] + flops["feature"] + flops["policy"]
    if per_step == "halt":
        return once + steps * (flops["core"] + flops["feature"] + halt) + flops["policy"]
    if per_step == "readout":
        return once + steps * (flops["core"] + flops["feature"] + flops["policy"])
    if per_step == "readout_halt":
        return once + steps * (flops["core"] + flops["feature"] + flops["policy"] + halt)
    raise ValueError(f"unknown per-step work {per_step!r}; one of {PER_STEP_WORK}")
