"""The attacks that induce the tasks, behind one interface: ``make_attack(name, budget)`` returns
``attack(model, x, y, seed) -> x_adv``.

PGD-Linf, PGD-L2, FGSM, Square (black-box) and AutoAttack come from torchattacks; the sparse L1
PGD (Tramer & Boneh 2019), which torchattacks lacks, is written here with its L1-ball projection
(``core.project_l1_ball``). Inputs live in [0, 1] (normalisation is a layer of the model); every
attack runs with the model in eval mode (batch-norm statistics untouched) under
``torch.enable_grad()`` and restores the model's mode; ``seed`` fixes random starts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import torchattacks

from lrrf.core import project_l1_ball, sparse_l1_direction
from papers_cli import ConfigError

ATTACKS = ("linf", "l2", "l1", "fgsm", "square", "autoattack")
NORM_OF = {"linf": "Linf", "l2": "L2", "l1": "L1", "fgsm": "Linf", "square": "Linf",
           "autoattack": "Linf"}  # fmt: skip


@dataclass(frozen=True)
class Budget:
    """An attack's budget: radius ``eps`` in its norm, ``steps`` iterations (queries for Square)
    of size ``step_fraction * eps`` (PGD), ``sparsity`` (share of coordinates an L1 step moves)."""

    eps: float
    steps: int = 10
    step_fraction: float = 0.25
    sparsity: float = 0.1
    random_start: bool = True


def check_inputs(x: torch.Tensor) -> None:
    """Attacks and models take images in [0, 1]; normalisation lives inside the model."""
    if x.numel() and (x.min() < 0 or x.max() > 1):
        raise ConfigError(
            f"inputs must lie in [0, 1] (got min {x.min().item():.3g}, max {x.max().item():.3g}):"
            " normalisation is a layer of the model; pass raw pixel intensities scaled to [0, 1]"
        )


def sparse_l1_pgd(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, budget: Budget
) -> torch.Tensor:
    """Sparse L1 PGD: steps of L1 length ``step_fraction * eps`` along the top-``sparsity``
    coordinates of the gradient (those that can still move inside [0, 1]), then projection onto
    the L1 ball of radius eps and clipping to the box (which only shrinks |delta|)."""
    flat = x.flatten(1)
    delta = torch.zeros_like(flat)
    if budget.random_start:
        noise = torch.randn_like(flat)
        length = budget.eps * torch.rand(len(flat), 1, device=x.device, dtype=x.dtype)
        delta = noise / noise.abs().sum(1, keepdim=True).clamp_min(1e-12) * length
        delta = (flat + delta).clamp(0, 1) - flat
    step = budget.step_fraction * budget.eps
    for _ in range(budget.steps):
        delta.requires_grad_(True)
        loss = F.cross_entropy(model((flat + delta).view_as(x)), y)
        (grad,) = torch.autograd.grad(loss, delta)
        current = flat + delta.detach()
        blocked = ((current >= 1) & (grad > 0)) | ((current <= 0) & (grad < 0))
        grad = grad.masked_fill(blocked, 0.0)
        delta = delta.detach() + step * sparse_l1_direction(grad, budget.sparsity)
        delta = project_l1_ball(delta, budget.eps)
        delta = (flat + delta).clamp(0, 1) - flat
    return (flat + delta.detach()).view_as(x)


def _torchattack(name: str, model: torch.nn.Module, budget: Budget, num_classes: int):
    alpha = budget.step_fraction * budget.eps
    if name == "linf":
        return torchattacks.PGD(
            model, eps=budget.eps, alpha=alpha, steps=budget.steps, random_start=budget.random_start
        )
    if name == "l2":
        return torchattacks.PGDL2(
            model, eps=budget.eps, alpha=alpha, steps=budget.steps, random_start=budget.random_start
        )
    if name == "fgsm":
        return torchattacks.FGSM(model, eps=budget.eps)
    if name == "square":
        return torchattacks.Square(
            model, eps=budget.eps, n_queries=budget.steps, n_restarts=1, seed=0
        )
    return torchattacks.AutoAttack(
        model, norm="Linf", eps=budget.eps, n_classes=num_classes, seed=0
    )


def make_attack(name: str, budget: Budget, num_classes: int = 10) -> Callable[..., torch.Tensor]:
    """``attack(model, x, y, seed=None) -> x_adv`` for an attack of ``ATTACKS`` (``num_classes``
    matters only to AutoAttack's targeted and FAB parts)."""
    if name not in ATTACKS:
        raise ConfigError(f"unknown attack {name!r}; choose from {', '.join(ATTACKS)}")
    if not budget.eps > 0:
        raise ConfigError(f"the budget of attack {name!r} must be positive, got eps={budget.eps}")
    if budget.steps < 1 or not 0 < budget.sparsity <= 1 or not budget.step_fraction > 0:
        raise ConfigError(
            f"attack {name!r}: steps must be >= 1, sparsity in (0, 1] and step_fraction > 0, "
            f"got {budget}"
        )

    def attack(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, seed: int | None = None):
        check_inputs(x)
        was_training = model.training
        model.eval()
        try:
            with torch.enable_grad(), torch.random.fork_rng(devices=[]):
                if seed is not None:
                    torch.manual_seed(seed)
                x, y = x.detach().clone(), y.detach().clone()
                if name == "l1":
                    x_adv = sparse_l1_pgd(model, x, y, budget)
                else:
                    x_adv = _torchattack(name, model, budget, num_classes)(x, y)
        finally:
            model.train(was_training)
        return x_adv.detach()

    attack.name, attack.budget = name, budget
    return attack


def perturbation_norm(name: str, x: torch.Tensor, x_adv: torch.Tensor) -> torch.Tensor:
    """Per-item size of x_adv - x in the attack's norm."""
    delta = (x_adv - x).flatten(1)
    order = {"Linf": float("inf"), "L2": 2.0, "L1": 1.0}[NORM_OF[name]]
    return delta.norm(p=order, dim=1)
