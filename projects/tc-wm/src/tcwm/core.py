"""TC-WM: task-centric world models from visual foundations: the method, in pure torch (no Lightning, no I/O).

TEMPLATE: replace this example with the paper's method. State the method here with its
equations, and name in each function's docstring the equation it implements.

Example method (so the generated project runs end to end): least-squares regression with an MLP,

    L(theta) = 1/N sum_i (f_theta(x_i) - y_i)^2                              (Eq. 1)
"""

from __future__ import annotations

import torch
from torch import nn

ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU, "tanh": nn.Tanh}


def squared_errors(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The per-item terms of Eq. 1: (f_theta(x_i) - y_i)^2, shape [N]."""
    if prediction.shape != target.shape:
        raise ValueError(f"prediction {tuple(prediction.shape)} vs target {tuple(target.shape)}")
    return (prediction - target).pow(2)


def regression_loss(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Eq. 1: mean squared error between predictions [N] and targets [N]."""
    return squared_errors(prediction, target).mean()


def make_regressor(in_features: int, hidden: int, activation: str = "gelu") -> nn.Module:
    """f_theta: [N, in_features] -> [N, 1], a two-layer MLP."""
    return nn.Sequential(
        nn.Linear(in_features, hidden), ACTIVATIONS[activation](), nn.Linear(hidden, 1)
    )
