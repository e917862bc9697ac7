"""Model architectures, registered by name.

The CNN is the one pFedHN, FedFomo and pFedLA share (two 5x5 convolutions, three fully connected
layers); pFedLA adds BatchNorm after each convolution for CIFAR. Every model is a plain `nn.Module`:
the engine trains many clients' copies at once by stacking their parameters and calling the module
functionally (torch.func), so no architecture needs a hand-written batched twin.
"""

from __future__ import annotations

import math
from typing import Annotated
from collections.abc import Callable

import torch
from pydantic import AfterValidator
from torch import nn

# A cell's model spec (one name, or groups of architectures), importable from here as before.
from pflbench.config import MODEL_GROUPS as MODEL_GROUPS
from pflbench.config import group_names as group_names, is_heterogeneous as is_heterogeneous
from pflbench.registry import NAME, Registry

ModelBuilder = Callable[[tuple[int, ...], int], nn.Module]
# A builder's `display_name` and `paper` (register(name, display_name=..., paper=...)) are its own.
MODELS: Registry[ModelBuilder] = Registry("model", own_attributes={"display_name": NAME, "paper": ""})


class CNN(nn.Module):
    """Conv5x5(16) -> pool -> Conv5x5(32) -> pool -> FC120 -> FC84 -> FC(classes).

    800 inputs to the first FC layer for 3x32x32 images, 512 for 1x28x28.
    `batch_norm=True` puts BatchNorm after each convolution (pFedLA's CIFAR variant).
    """

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, batch_norm: bool = False) -> None:
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

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, hidden: int = 64) -> None:
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
def cnn(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return CNN(input_shape, num_classes, batch_norm=False)


@MODELS.register("cnn-bn")
def cnn_bn(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return CNN(input_shape, num_classes, batch_norm=True)


@MODELS.register("mlp")
def mlp(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return MLP(input_shape, num_classes)


# ---- the survey's backbone: torchvision's MobileNetV3-Large, adapted to 32x32 inputs ----------------
# torchvision's ImageNet network downsamples 32x (a stride-2 stem and five stride-2 blocks), so a
# 32x32 image would be 1x1 from the 112-channel stage on. Changed, nothing else: the stem conv takes
# the dataset's channels (3, or 1 for grey images) at stride 1 instead of 2, so the network
# downsamples 16x and the last feature map of a 32x32 input is 2x2 (28x28: 2x2 too). Making the first
# stride-2 block stride 1 as well (8x, 4x4 maps) was measured 3.1x slower on one CPU core (37 vs 117
# samples/s, batch 32, forward + backward) for a survey spec that must also run on a CPU. Everything
# else is torchvision's (hard-swish, squeeze-excitation, BatchNorm eps 1e-3 momentum 0.01, the
# 960 -> 1280 -> classes head with dropout 0.2). Randomly initialized, no ImageNet weights (none offline;
# the engine redraws each layer with its PyTorch default initialization from the cell seed).
# Parameters: 4,214,842 for 10 classes, 4,330,132 for 100 (the stem's input channels are the only
# other difference: 3 -> 1 removes 288).
# Engine paths: every parameter layer (Conv2d, depthwise too; BatchNorm2d; Linear) has a stacked twin,
# so clients train natively batched or in the client loop (the two agree: tests); the vmap fallback
# (`ClientModel(native=False)`) cannot train it, as VGG8 neither: torch.func refuses the dropout's
# random draws under vmap (randomness='error').


def mobilenet_v3_large_32(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    from torchvision.models import mobilenet_v3_large

    channels, _, _ = _image_shape(input_shape, "mobilenetv3-large")
    model = mobilenet_v3_large(num_classes=num_classes)
    stem = model.features[0][0]
    model.features[0][0] = nn.Conv2d(
        channels, stem.out_channels, stem.kernel_size, stride=1, padding=stem.padding, bias=False
    )
    return model


MODELS.register("mobilenetv3-large")(mobilenet_v3_large_32)


def default_model(input_shape: tuple[int, ...]) -> str:
    """pFedLA's choice: BatchNorm CNN for 3-channel images (CIFAR), plain CNN for grey ones; MLP for vectors."""
    if len(input_shape) == 3:
        return "cnn-bn" if input_shape[0] == 3 else "cnn"
    return "mlp"


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    if name == "auto":
        name = default_model(input_shape)
    return MODELS.get(name)(tuple(input_shape), num_classes)


# ---- MH-pFedHN's client architectures (github.com/DangDang1895/MH-pFL models.py, bias=True) -------
# Five families of different sizes for model-heterogeneous cells. They are written for any
# (C, H, W) input: 3x32x32 gives exactly the official parameter counts (CIFAR-10: 234,006 /
# 268,814 / 347,178 / 523,242 / 565,386); 1x28x28 (MNIST-like) only changes the first layer and the
# flattened size (global average pooling replaces the official AvgPool(8), identical at 32x32).


def _flat_side(side: int, pools: int) -> int:
    for _ in range(pools):
        side //= 2
    return side


class MHCNN(nn.Module):
    """conv3x3(16, pad 1) -> pool -> conv3x3(32, pad 1) -> pool -> FC108 -> FC64 -> FC(classes)."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        channels, height, width = _image_shape(input_shape, "mh-cnn")
        self.conv1 = nn.Conv2d(channels, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * _flat_side(height, 2) * _flat_side(width, 2), 108)
        self.fc2 = nn.Linear(108, 64)
        self.fc3 = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.relu(self.fc1(x.flatten(1)))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


class VGG8(nn.Module):
    """Six 3x3 convolutions (16,16 | 32,32 | 64,64, a pool after each pair), FC180 -> FC64 -> FC(classes),
    dropout 0.5 before the last two."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        channels, height, width = _image_shape(input_shape, "vgg8")
        layers: list[nn.Module] = []
        for width_in, width_out in ((channels, 16), (16, 32), (32, 64)):
            layers += [
                nn.Conv2d(width_in, width_out, 3, padding=1),
                nn.ReLU(),
                nn.Conv2d(width_out, width_out, 3, padding=1),
                nn.ReLU(),
                nn.MaxPool2d(2),
            ]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Linear(64 * _flat_side(height, 3) * _flat_side(width, 3), 180),
            nn.ReLU(),
            nn.Dropout(),
            nn.Linear(180, 64),
            nn.ReLU(),
            nn.Dropout(),
            nn.Linear(64, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))


class ResNetBlock(nn.Module):
    """Two 3x3 conv + BN; where the width changes, stride 2 and a 1x1 stride-2 conv shortcut."""

    def __init__(self, width_in: int, width_out: int) -> None:
        super().__init__()
        stride = 1 if width_in == width_out else 2
        self.shortcut = nn.Identity() if stride == 1 else nn.Conv2d(width_in, width_out, 1, stride=2)
        self.conv1 = nn.Conv2d(width_in, width_out, 3, stride=stride, padding=1)
        self.conv2 = nn.Conv2d(width_out, width_out, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(width_out)
        self.bn2 = nn.BatchNorm2d(width_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


# Block widths of the official ResNet10/12/18 (the downsampling blocks are where the width changes).
RESNET_WIDTHS = {
    10: [16, 16, 16, 32, 32, 32, 64, 64, 64, 64],
    12: [16, 32, 32, 32, 32, 32, 64, 64, 64, 64, 64, 64],
    18: [16] * 6 + [32] * 6 + [64] * 6,
}


class ResNet(nn.Module):
    """Stem conv3x3(16) + BN, basic blocks of widths RESNET_WIDTHS[depth], global average pool, FC."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, depth: int) -> None:
        super().__init__()
        channels, _, _ = _image_shape(input_shape, f"resnet{depth}")
        self.conv1 = nn.Conv2d(channels, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        widths = RESNET_WIDTHS[depth]
        self.res_net = nn.Sequential(*(ResNetBlock(w_in, w_out) for w_in, w_out in zip([16, *widths], widths)))
        self.final = nn.Linear(widths[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.res_net(torch.relu(self.bn1(self.conv1(x))))
        return self.final(x.mean(dim=(2, 3)))


def _image_shape(input_shape: tuple[int, ...], name: str) -> tuple[int, int, int]:
    if len(input_shape) != 3:
        raise ValueError(f"model {name!r} needs image inputs (C, H, W), got shape {tuple(input_shape)}")
    return tuple(input_shape)  # type: ignore[return-value]


@MODELS.register("mh-cnn")
def mh_cnn(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return MHCNN(input_shape, num_classes)


@MODELS.register("vgg8")
def vgg8(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return VGG8(input_shape, num_classes)


def _resnet(depth: int) -> ModelBuilder:
    return lambda input_shape, num_classes: ResNet(input_shape, num_classes, depth)


for _depth in RESNET_WIDTHS:
    MODELS.register(f"resnet{_depth}")(_resnet(_depth))


# ---- heterogeneous cells: which client gets which architecture (the spec: pflbench.config) -----------------


def check_model_spec(spec: str) -> str:
    """`spec` if every name in it is a registered model, else ValueError naming the allowed ones."""
    names = group_names(spec)
    for name in names:
        if name != "auto" and name not in MODELS:
            raise UnknownModelError(name)
    if len(names) > 1 and "auto" in names:
        raise ValueError(f"'auto' cannot be one of a heterogeneous model list ({spec!r}); name each model")
    return spec


def check_model_name(name: str) -> str:
    """`name` if it is "auto" or one registered model (not a group), else ValueError naming the allowed."""
    from pflbench.registry import unknown_message

    if name != "auto" and name not in MODELS:
        raise ValueError(unknown_message("model", name, ["auto", *MODELS.names()]))
    return name


# A hyperparameter that names one model (e.g. MH-pFedHNGD's `global_model`): checked when the cell is
# resolved, so a wrong name is refused by the dry-run, not when the cell runs.
ModelName = Annotated[str, AfterValidator(check_model_name)]


class UnknownModelError(ValueError):
    def __init__(self, name: str) -> None:
        from pflbench.registry import unknown_message

        super().__init__(
            unknown_message("model", name, ["auto", *MODELS.names(), *MODEL_GROUPS, "NAME,NAME,... (equal groups)"])
        )


def client_groups(spec: str, num_clients: int) -> list[tuple[str, list[int]]]:
    """(architecture, client ids) per group: contiguous, equal sizes, remainder to the first groups.
    A group may be empty when there are fewer clients than architectures."""
    names = group_names(spec)
    base, extra = divmod(num_clients, len(names))
    groups, start = [], 0
    for g, name in enumerate(names):
        size = base + (g < extra)
        groups.append((name, list(range(start, start + size))))
        start += size
    return groups
