"""Baselines and controls: stop rules on the same pi-hat, calibrated to the same train stop rate.

Each rule maps a pi-hat rollout (a Trajectory) to a stop time (core.INF for never). Per-state
scores (ensemble disagreement, k-NN novelty, a train-vs-test domain classifier) stop at the first
state whose score exceeds a threshold kappa chosen on held-out train rollouts of pi-hat
(core.calibrate_threshold); the random-time stop draws a per-step hazard calibrated the same way.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from seqrejectron.core import INF, calibrate_threshold, first_true
from seqrejectron.search import fit_bc, greedy, split_like, stack


def per_state_stop_times(scores: list[np.ndarray], kappa: float) -> np.ndarray:
    return np.array([first_true(s > kappa) for s in scores], dtype=np.int64)


class ScoreRule:
    """'Stop at the first state whose score exceeds kappa', kappa calibrated on train rollouts."""

    def score(self, x: torch.Tensor) -> np.ndarray:  # pragma: no cover - interface
        raise NotImplementedError

    def scores(self, trajs) -> list[np.ndarray]:
        return split_like(self.score(stack(trajs)), trajs)

    def calibrate(self, calibration, rate: float) -> ScoreRule:
        self.kappa = calibrate_threshold([s.max() for s in self.scores(calibration)], rate)
        return self

    def stop_times(self, trajs) -> np.ndarray:
        return per_state_stop_times(self.scores(trajs), self.kappa)


class EnsembleRule(ScoreRule):
    """Fraction of bootstrap BC members whose action differs from pi-hat's (members have
    pi-hat's action count: 3 in (A), 9 in (B))."""

    def __init__(
        self,
        pihat,
        train,
        members: int,
        hidden: int,
        steps: int,
        lr: float,
        seed: int,
        weight_decay: float = 0.0,
    ):
        self.pihat = pihat
        n_actions = [m for m in pihat.modules() if isinstance(m, nn.Linear)][-1].out_features
        self.members = [
            fit_bc(train, hidden, steps, lr, seed * 100 + k + 1, n_actions, True, weight_decay)
            for k in range(members)
        ]

    def score(self, x):
        base = greedy(self.pihat, x)
        return np.mean([greedy(m, x) != base for m in self.members], axis=0)


class NoveltyRule(ScoreRule):
    """Mean distance to the k nearest training states."""

    def __init__(self, train, k: int):
        self.reference, self.k = stack(train), k

    def score(self, x):
        distances = torch.cdist(x, self.reference)
        return distances.topk(self.k, largest=False).values.mean(-1).numpy()


class DomainClassifierRule(ScoreRule):
    """Logit of 'this state comes from the test dynamics', trained on the train demonstrations'
    states against the unlabelled test trajectories' states."""

    def __init__(self, train, test, hidden: int, steps: int, lr: float, seed: int):
        torch.manual_seed(seed)
        x = torch.cat([stack(train), stack(test)])
        y = torch.cat([torch.zeros(sum(map(len, train))), torch.ones(sum(map(len, test)))])
        self.net = nn.Sequential(nn.Linear(x.shape[1], hidden), nn.ReLU(), nn.Linear(hidden, 1))
        optimizer = torch.optim.Adam(self.net.parameters(), lr=lr)
        for _ in range(steps):
            optimizer.zero_grad()
            nn.functional.binary_cross_entropy_with_logits(self.net(x).squeeze(-1), y).backward()
            optimizer.step()

    @torch.no_grad()
    def score(self, x):
        return self.net(x).squeeze(-1).numpy()


class RandomTimeRule:
    """Negative control: stop at each step with a constant hazard q, independent of the state;
    q is set so that the expected stop rate on the calibration rollouts equals the target."""

    def __init__(self, seed: int):
        self.seed = seed

    def calibrate(self, calibration, rate: float) -> RandomTimeRule:
        lengths = np.array([len(t) for t in calibration])
        low, high = 0.0, 1.0
        for _ in range(60):
            q = (low + high) / 2
            low, high = (q, high) if np.mean(1 - (1 - q) ** lengths) < rate else (low, q)
        self.hazard = low
        return self

    def stop_times(self, trajs) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        return np.array([first_true(rng.random(len(t)) < self.hazard) for t in trajs])


class NeverStop:
    def stop_times(self, trajs) -> np.ndarray:
        return np.full(len(trajs), INF, dtype=np.int64)


class OracleRule:
    """Positive control: stop at pi-hat's first mistake (the expert as the sole validator)."""

    def stop_times(self, trajs) -> np.ndarray:
        return np.array([first_true(t.actions != t.expert) for t in trajs], dtype=np.int64)


class TableRule:
    """Exact SeqRejectron: stop where a chosen table's action over z differs from pi-hat's."""

    def __init__(self, tables: np.ndarray):
        self.tables = tables

    def stop_times(self, trajs) -> np.ndarray:
        out = []
        for t in trajs:
            flags = np.zeros(len(t), dtype=bool)
            for table in self.tables:
                flags |= table[t.z] != t.actions
            out.append(first_true(flags))
        return np.array(out, dtype=np.int64)


class ValidatorRule:
    """Neural SeqRejectron (and per-step Rejectron, random validators): stop at the first state
    where a validator's action differs from pi-hat's."""

    def __init__(self, pihat, validators):
        self.pihat, self.validators = pihat, list(validators)

    def stop_times(self, trajs) -> np.ndarray:
        if not self.validators:
            return np.full(len(trajs), INF, dtype=np.int64)
        x = stack(trajs)
        base = greedy(self.pihat, x)
        flags = np.zeros(len(x), dtype=bool)
        for v in self.validators:
            flags |= greedy(v, x) != base
        return np.array([first_true(f) for f in split_like(flags, trajs)], dtype=np.int64)


def stop_rate(rule, trajs) -> float:
    taus = rule.stop_times(trajs)
    return float(np.mean([tau < len(t) for tau, t in zip(taus, trajs, strict=True)]))
