"""The small locally trained networks of the miniature (not the paper's method).

- ``SemanticEncoder``: the DINOv2 stand-in. A small CNN classifier trained on the training
  digits; its 32-d penultimate (image-level) features, reduced by PCA to a few channels (as
  ReDi reduces DINOv2 features), are the semantic representation x_lead: one global vector per
  image, which says which digit it is and which is hard to read off a noisy texture.
- ``DigitEvaluator``: a *separately* trained classifier (other architecture, other seed) whose
  64-d penultimate features define the miniature's quality metric (FD-digit, precision/recall).

Both are trained once per data seed and cached on disk (``papers_data.cached_generate``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


class SemanticEncoder(nn.Module):
    """16x16 digit -> 32-d penultimate features (and class logits for its training)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * 4 * 4, 32), nn.ReLU(),
        )  # fmt: skip
        self.classify = nn.Linear(32, 10)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)  # [B, 32]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classify(self.body(x))


class DigitEvaluator(nn.Module):
    """16x16 digit -> 64-d features -> 10 logits; a different architecture from the encoder."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, 32, 5, padding=2), nn.GELU(), nn.AvgPool2d(2),
            nn.Conv2d(32, 48, 3, padding=1), nn.GELU(), nn.AvgPool2d(2),
            nn.Flatten(), nn.Linear(48 * 4 * 4, 64), nn.GELU(),
        )  # fmt: skip
        self.classify = nn.Linear(64, 10)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classify(self.body(x))


def train_classifier(
    make_net: type[nn.Module], images: np.ndarray, labels: np.ndarray, epochs: int, seed: int
) -> nn.Module:
    """Build (seeded init) and train with Adam on cross-entropy with small random shifts;
    returns the net in eval mode. Same seed, same weights."""
    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():  # leave the caller's RNG stream as it was (cache hit or not)
        torch.manual_seed(seed)
        net = make_net()
    x, y = torch.from_numpy(images), torch.from_numpy(labels)
    optimizer = torch.optim.Adam(net.parameters(), lr=2e-3)
    net.train()
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator)
        for batch in order.split(128):
            shift = torch.randint(-1, 2, (2,), generator=generator).tolist()
            inputs = torch.roll(x[batch], shifts=shift, dims=(2, 3))
            loss = F.cross_entropy(net(inputs), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return net.eval()


def accuracy(net: nn.Module, images: np.ndarray, labels: np.ndarray) -> float:
    with torch.no_grad():
        predicted = net(torch.from_numpy(images)).argmax(1).numpy()
    return float((predicted == labels).mean())


def state_arrays(net: nn.Module) -> dict[str, np.ndarray]:
    """A state dict as numpy arrays (the form ``cached_generate`` stores)."""
    return {k: v.detach().cpu().numpy() for k, v in net.state_dict().items()}


def load_state_arrays(net: nn.Module, arrays: dict[str, np.ndarray]) -> nn.Module:
    net.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in arrays.items()})
    return net.eval()
