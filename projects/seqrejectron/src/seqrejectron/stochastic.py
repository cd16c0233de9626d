"""Stochastic SeqRejectron: a sampled log-loss BC pi-hat, validators scored by cumulative
squared Hellinger distance, and the cumulative-Hellinger stop (core.py Eq. 3 and Eq. 5) with eta
calibrated on held-out train rollouts. ``evaluate_stochastic`` runs it on one world (the claim
run reports it on (A) and (B); it is not one of the pre-registered checks).

Reconstruction [R/G, design note]: a validator v starts from pi-hat and maximises

    1/m sum_j min(1, sum_{t < tau_j} H^2(pi-hat(.|s~_t), v(.|s~_t)) / eta_search)
        -  Lambda * (NLL(v) - NLL(pi-hat))

on the labelled train states; it is accepted when the first term exceeds epsilon and its train
NLL is within ``slack`` of pi-hat's; acceptance counts the not-yet-stopped test trajectories
whose cumulative H^2 to the candidate reaches ``eta_search`` (the relaxed term is for
training). tau_j is the cumulative stop at ``eta_search`` under the validators accepted so far;
stopped trajectories no longer count. Deployment: tau = min{t : sum_u max_v H^2 >= eta}, with
eta calibrated.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch
from torch import nn

from seqrejectron.baselines import NeverStop, OracleRule, RandomTimeRule, stop_rate
from seqrejectron.core import (
    INF,
    calibrate_threshold,
    check_epsilon,
    cumulative_stop_time,
    hellinger_sq_categorical,
)
from seqrejectron.experiment import episode_metrics, episode_seeds
from seqrejectron.search import split_like, stack


def sampling_policy(pihat: nn.Module, seed: int):
    """pi-hat as a sampler: a = draw from softmax(pi-hat(s)), seeded per episode."""
    generator = torch.Generator().manual_seed(seed)

    @torch.no_grad()
    def act(feats, z):
        probs = torch.softmax(pihat(torch.from_numpy(feats)[None]), -1)[0]
        return int(torch.multinomial(probs, 1, generator=generator))

    return act


@torch.no_grad()
def step_divergences(pihat: nn.Module, validators, x: torch.Tensor) -> np.ndarray:
    """d_t = max_v H^2(pi-hat(.|s_t), v(.|s_t)) per state. [N]."""
    if not validators:
        return np.zeros(len(x))
    p = torch.softmax(pihat(x), -1)
    return (
        torch.stack([hellinger_sq_categorical(p, torch.softmax(v(x), -1)) for v in validators])
        .max(0)
        .values.numpy()
    )


def hellinger_search(
    pihat: nn.Module,
    train,
    test,
    epsilon: float,
    lam: float = 20.0,
    steps: int = 150,
    lr: float = 0.01,
    slack: float = 0.05,
    eta_search: float = 1.0,
    seed: int = 0,
) -> tuple[list[nn.Module], list[dict]]:
    check_epsilon(epsilon)
    torch.manual_seed(seed)
    train_x, train_a = stack(train), stack(train, "expert")
    test_x = stack(test)
    lengths = [len(t) for t in test]
    owner = torch.repeat_interleave(torch.arange(len(test)), torch.tensor(lengths))
    with torch.no_grad():
        log_p_hat = torch.log_softmax(pihat(test_x), -1)
        base_nll = nn.functional.cross_entropy(pihat(train_x), train_a).item()
    validators: list[nn.Module] = []
    rounds: list[dict] = []
    for _ in range(math.ceil(1 / epsilon)):
        d = step_divergences(pihat, validators, test_x)
        taus = [cumulative_stop_time(part, eta_search) for part in split_like(d, test)]
        # a trajectory the accepted validators already stop (cumulative H^2 reached eta_search)
        # is covered; the search scores the trajectories not yet stopped
        alive = torch.from_numpy(
            np.concatenate([np.full(n, t == INF) for n, t in zip(lengths, taus, strict=True)])
        )
        candidate = copy.deepcopy(pihat).train()
        optimizer = torch.optim.Adam(candidate.parameters(), lr=lr)

        def objective(v, alive=alive):
            # Eq. 3 in log space: sqrt(p q) = exp((log p + log q) / 2) has a finite gradient
            log_q = torch.log_softmax(v(test_x), -1)
            h = (1 - torch.exp(0.5 * (log_p_hat + log_q)).sum(-1)).clamp(0, 1) * alive
            per_traj = (torch.zeros(len(test)).index_add(0, owner, h) / eta_search).clamp(max=1.0)
            nll = nn.functional.cross_entropy(v(train_x), train_a)
            return per_traj.mean(), nll

        for _ in range(steps):
            optimizer.zero_grad()
            gain, nll = objective(candidate)
            (lam * nll - gain).backward()
            optimizer.step()
        with torch.no_grad():
            candidate.eval()
            nll = float(objective(candidate)[1])
            # accepted on the discrete count: not-yet-stopped trajectories it would stop
            d_new = step_divergences(pihat, [candidate], test_x)
            stops = [
                cumulative_stop_time(part, eta_search) < INF for part in split_like(d_new, test)
            ]
            gain = float(np.mean([s and t == INF for s, t in zip(stops, taus, strict=True)]))
        rounds.append({"gain": gain, "nll_increase": nll - base_nll})
        if not gain > epsilon or nll - base_nll > slack:
            break
        validators.append(candidate)
        rounds[-1]["size"] = len(validators)
    return validators, rounds


class HellingerStopRule:
    """tau = first t with sum_{u <= t} max_v H^2 >= eta (Eq. 5); eta calibrated so that at most
    ``rate`` of held-out train rollouts stop."""

    def __init__(self, pihat: nn.Module, validators) -> None:
        self.pihat, self.validators, self.eta = pihat, list(validators), math.inf

    def cumulative(self, trajs) -> list[np.ndarray]:
        d = step_divergences(self.pihat, self.validators, stack(trajs))
        return [np.cumsum(part) for part in split_like(d, trajs)]

    def calibrate(self, calibration, rate: float) -> HellingerStopRule:
        totals = [c[-1] if len(c) else 0.0 for c in self.cumulative(calibration)]
        # 'the sum reaches eta' = 'the total exceeds kappa' for eta just above kappa
        self.eta = float(np.nextafter(calibrate_threshold(totals, rate), np.inf))
        return self

    def stop_times(self, trajs) -> np.ndarray:
        return np.array(
            [
                cumulative_stop_time(np.diff(c, prepend=0.0), self.eta)
                for c in self.cumulative(trajs)
            ],
            dtype=np.int64,
        )


def evaluate_stochastic(
    world, epsilon: float, lam: float = 20.0, steps: int = 150, lr: float = 0.01
) -> dict:
    """On one world (its BC pi-hat, demonstrations and dynamics), pi-hat sampled from its
    softmax: the Hellinger validators, the stop calibrated to ``epsilon`` on held-out sampled
    train rollouts, and per-episode outcomes (``episode_metrics``) on sampled evaluation
    rollouts in both dynamics, for four stop rules on the same episodes: ``stochastic``
    (the method), ``bc`` (never stops), ``random_time`` (the same calibrated train stop rate,
    state-blind) and ``oracle_stop`` (the sampled action's first mistake)."""
    config, seed = world.config, world.seed

    def sampled(env, split, count):
        return [
            env.rollout(sampling_policy(world.pihat, s), s)
            for s in episode_seeds(seed, split, count)
        ]

    validators, rounds = hellinger_search(
        world.pihat, world.train, world.test, epsilon, lam=lam, steps=steps, lr=lr, seed=seed
    )
    calibration = sampled(world.train_env, 12, config.n_calibration)
    eval_p = sampled(world.train_env, 15, config.n_eval)
    eval_q = sampled(world.test_env, 16, config.n_eval)
    rule = HellingerStopRule(world.pihat, validators).calibrate(calibration, epsilon)
    target = max(stop_rate(rule, calibration), epsilon / 2)
    rules = {
        "stochastic": rule,
        "bc": NeverStop(),
        "random_time": RandomTimeRule(seed).calibrate(calibration, target),
        "oracle_stop": OracleRule(),
    }
    return {
        "outcomes": {name: episode_metrics(r, eval_p, eval_q) for name, r in rules.items()},
        "n_validators": len(validators),
        "rounds": rounds,
        "eta": rule.eta,
    }
