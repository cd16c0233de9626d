"""Networks: feature extractor g and classifier h, with input normalisation as the first layer
(attacks see [0, 1] images; foolbox #550, auto-attack #103)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Normalize(nn.Module):
    """(x - mean) / std per channel, a fixed layer of the model."""

    def __init__(self, mean: list[float], std: list[float]) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


class SmallCNN(nn.Module):
    """The miniature's g: two conv-BN-ReLU blocks (the second strided) and a feature layer."""

    def __init__(self, channels: int, image_size: int, width: int, feature_dim: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels, width, 3, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(2 * width * ((image_size + 1) // 2) ** 2, feature_dim),
            nn.ReLU(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)  # [B, feature_dim]


class PreActBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.bn1, self.conv1 = nn.BatchNorm2d(cin), nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn2, self.conv2 = nn.BatchNorm2d(cout), nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.shortcut = (
            nn.Conv2d(cin, cout, 1, stride, bias=False) if stride != 1 or cin != cout else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(x))
        skip = self.shortcut(out) if self.shortcut is not None else x
        out = self.conv1(out)
        out = self.conv2(F.relu(self.bn2(out)))
        return out + skip


class PreActResNet18(nn.Module):
    """The paper-scale g: PreAct ResNet-18 (He et al. 2016), 512-d features."""

    def __init__(self, channels: int = 3) -> None:
        super().__init__()
        self.stem = nn.Conv2d(channels, 64, 3, 1, 1, bias=False)
        layers, cin = [], 64
        for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
            layers += [PreActBlock(cin, cout, stride), PreActBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.bn = nn.BatchNorm2d(512)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn(self.layers(self.stem(x))))
        return F.adaptive_avg_pool2d(out, 1).flatten(1)  # [B, 512]


class Classifier(nn.Module):
    """f = h o g o normalise; ``features`` gives g's output, ``forward`` the logits."""

    def __init__(self, extractor: nn.Module, feature_dim: int, num_classes: int,
                 mean: list[float], std: list[float]) -> None:  # fmt: skip
        super().__init__()
        self.normalize = Normalize(mean, std)
        self.extractor = extractor
        self.head = nn.Linear(feature_dim, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.extractor(self.normalize(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def build_network(arch: str, channels: int, image_size: int, num_classes: int, width: int,
                  feature_dim: int, mean: list[float], std: list[float]) -> Classifier:  # fmt: skip
    if arch == "preact_resnet18":
        return Classifier(PreActResNet18(channels), 512, num_classes, mean, std)
    extractor = SmallCNN(channels, image_size, width, feature_dim)
    return Classifier(extractor, feature_dim, num_classes, mean, std)
