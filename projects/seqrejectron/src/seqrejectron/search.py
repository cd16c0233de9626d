"""Fitting: behaviour cloning and SeqRejectron's validator searches (exact and neural).

The math lives in core.py; this file holds the loops that call it.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from seqrejectron.core import (
    INF,
    accepts,
    advance_stop_times,
    check_epsilon,
    make_policy,
    prefix_lengths,
    prefix_weights,
    relaxed_loss,
    validator_score,
)


def stack(trajs, attr: str = "feats") -> torch.Tensor:
    return torch.from_numpy(np.concatenate([getattr(t, attr) for t in trajs]))


def split_like(values: np.ndarray, trajs) -> list[np.ndarray]:
    return np.split(values, np.cumsum([len(t) for t in trajs])[:-1])


def fit_bc(
    trajs,
    hidden: int,
    steps: int,
    lr: float,
    seed: int,
    n_actions: int = 3,
    bootstrap: bool = False,
    weight_decay: float = 0.0,
) -> nn.Module:
    """pi-hat: full-batch cross-entropy (log-loss) behaviour cloning on the expert's actions
    (``weight_decay``: Adam's L2 penalty; 0 in (A), see pointmaze.py for (B))."""
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    if bootstrap:
        picks = torch.randint(len(trajs), (len(trajs),), generator=generator).tolist()
        trajs = [trajs[i] for i in picks]
    x, y = stack(trajs), stack(trajs, "expert")
    policy = make_policy(x.shape[1], hidden, n_actions)
    optimizer = torch.optim.Adam(policy.parameters(), lr=lr, weight_decay=weight_decay)
    for _ in range(steps):
        optimizer.zero_grad()
        nn.functional.cross_entropy(policy(x), y).backward()
        optimizer.step()
    return policy.eval()


@torch.no_grad()
def greedy(policy: nn.Module, x: torch.Tensor) -> np.ndarray:
    return policy(x).argmax(-1).numpy()


@dataclass
class SearchResult:
    validators: list = field(default_factory=list)
    rounds: list[dict] = field(default_factory=list)
    moved: list[float] = field(default_factory=list)  # ||theta_v - theta_pihat|| / ||theta_pihat||


def neural_search(
    pihat: nn.Module,
    train,
    test,
    epsilon: float,
    lam: float,
    steps: int,
    lr: float,
    seed: int,
    sequential: bool = True,
    max_rounds: int | None = None,
    score_lambda: float = 1.0,
) -> SearchResult:
    """SeqRejectron with the argmax of Eq. 2 relaxed to Eq. 6, warm-started from pi-hat.

    ``sequential=False`` is the per-step Rejectron baseline: test states pooled, a state leaves
    the pool once a validator disagrees on it (not its whole suffix), states weighted equally,
    scored per state. A validator is accepted when its score exceeds epsilon and it disagrees
    with the expert on at most epsilon/2 of the train trajectories (states, when pooled).
    """
    check_epsilon(epsilon)
    max_rounds = max_rounds or math.ceil(1 / epsilon)
    torch.manual_seed(seed)
    train_x, train_a = stack(train), stack(train, "expert")
    test_x = stack(test)
    avoid_all = torch.from_numpy(greedy(pihat, test_x))
    taus = np.full(len(test), INF, dtype=np.int64)
    alive = np.ones(len(test_x), dtype=bool)  # pooled variant: states no validator rejected
    reference = torch.cat([p.detach().flatten() for p in pihat.parameters()])
    result = SearchResult()
    for _ in range(max_rounds):
        if sequential:
            lengths = prefix_lengths(taus, [len(tr) for tr in test])
            mask = np.concatenate(
                [np.arange(len(tr)) < n for tr, n in zip(test, lengths, strict=True)]
            )
            weights = prefix_weights(lengths, per_trajectory=True)
        else:
            mask = alive
            weights = prefix_weights([int(alive.sum())], per_trajectory=False)
        index = torch.from_numpy(np.flatnonzero(mask))
        validator = copy.deepcopy(pihat).train()
        optimizer = torch.optim.Adam(validator.parameters(), lr=lr)
        for _ in range(steps):
            optimizer.zero_grad()
            relaxed_loss(
                validator, train_x, train_a, test_x[index], avoid_all[index], weights, lam
            ).backward()
            optimizer.step()
        validator.eval()
        test_dis_all = greedy(validator, test_x) != avoid_all.numpy()
        train_dis_all = greedy(validator, train_x) != train_a.numpy()
        if sequential:
            score, cut, train_rate = validator_score(
                split_like(test_dis_all, test), taus, split_like(train_dis_all, train), score_lambda
            )
        else:
            cut = float((test_dis_all & alive).sum() / len(alive))
            train_rate = float(train_dis_all.mean())
            score = cut - score_lambda * train_rate
        moved = torch.cat([p.detach().flatten() for p in validator.parameters()]) - reference
        diagnostics = {
            "score": score,
            "cut": cut,
            "train": train_rate,
            "moved": float(moved.norm() / reference.norm()),
        }
        result.rounds.append(diagnostics)
        if not accepts(score, train_rate, epsilon):
            break
        result.validators.append(validator)
        result.moved.append(diagnostics["moved"])
        diagnostics["size"] = len(result.validators)
        if sequential:
            taus = advance_stop_times(taus, split_like(test_dis_all, test))
        else:
            alive &= ~test_dis_all
    return result


def perturbed_copies(pihat: nn.Module, count: int, scale: float, seed: int) -> list[nn.Module]:
    """The random-validators control: pi-hat with Gaussian noise of relative size ``scale`` on
    every weight (no disagreement search, no test data)."""
    generator = torch.Generator().manual_seed(seed)
    copies = []
    for _ in range(count):
        v = copy.deepcopy(pihat)
        with torch.no_grad():
            for p in v.parameters():
                p.add_(scale * p.abs().mean() * torch.randn(p.shape, generator=generator))
        copies.append(v.eval())
    return copies


def union_disagreement(
    pihat: nn.Module, validators: Sequence[nn.Module], x: torch.Tensor
) -> np.ndarray:
    """Per state: does any validator's action differ from pi-hat's? [N] bool."""
    base = greedy(pihat, x)
    flags = np.zeros(len(x), dtype=bool)
    for v in validators:
        flags |= greedy(v, x) != base
    return flags
