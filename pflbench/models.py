"""Model architectures, registered by name.

The CNN is the one pFedHN, FedFomo and pFedLA share (two 5x5 convolutions, three fully connected
layers); pFedLA adds BatchNorm after each convolution for CIFAR. Every model is a plain `nn.Module`:
the engine trains many clients' copies at once by stacking their parameters and calling the module
functionally (torch.func), so no architecture needs a hand-written batched twin.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

from pflbench.registry import Registry

ModelBuilder = Callable[[tuple[int, ...], int], nn.Module]
MODELS: Registry[ModelBuilder] = Registry("model")


class CNN(nn.Module):
    """Conv5x5(16) -> pool -> Conv5x5(32) -> pool -> FC120 -> FC84 -> FC(classes).

    800 inputs to the first FC layer for 3x32x32 images, 512 for 1x28x28.
    `batch_norm=True` puts BatchNorm after each convolution (pFedLA's CIFAR variant).
    """

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, batch_norm: bool = False):
        super().__init__()
        if len(input_shape) != 3:
            raise ValueError(f"the CNN needs image inputs (C, H, W), got shape {tuple(input_shape)}")
        channels, height, width = input_shape
        self.conv1 = nn.Conv2d(channels, 16, 5)
        self.bn1 = nn.BatchNorm2d(16) if batch_norm else nn.Identity()
        self.conv2 = nn.Conv2d(16, 32, 5)
        self.bn2 = nn.BatchNorm2d(32) if batch_norm else nn.Identity()
        flat = 32 * ((((height - 4) // 2) - 4) // 2) * ((((width - 4) // 2) - 4) // 2)
        self.fc1 = nn.Linear(flat, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = torch.max_pool2d(torch.relu(self.bn2(self.conv2(x))), 2)
        x = torch.relu(self.fc1(x.flatten(1)))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


class MLP(nn.Module):
    """Two hidden layers for vector data (e.g. the Synthetic dataset's 60 features)."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, hidden: int = 64):
        super().__init__()
        features = math.prod(input_shape)
        self.fc1 = nn.Linear(features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.fc1(x.flatten(1)))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


@MODELS.register("cnn")
def cnn(input_shape, num_classes):
    return CNN(input_shape, num_classes, batch_norm=False)


@MODELS.register("cnn-bn")
def cnn_bn(input_shape, num_classes):
    return CNN(input_shape, num_classes, batch_norm=True)


@MODELS.register("mlp")
def mlp(input_shape, num_classes):
    return MLP(input_shape, num_classes)


def default_model(input_shape: tuple[int, ...]) -> str:
    """pFedLA's choice: BatchNorm CNN for 3-channel images (CIFAR), plain CNN for grey ones; MLP for vectors."""
    if len(input_shape) == 3:
        return "cnn-bn" if input_shape[0] == 3 else "cnn"
    return "mlp"


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    if name == "auto":
        name = default_model(input_shape)
    return MODELS.get(name)(tuple(input_shape), num_classes)
