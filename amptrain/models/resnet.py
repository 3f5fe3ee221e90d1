"""``resnet18`` and ``resnet50`` (He et al. 2016), written here so that amptrain does not
depend on torchvision.

Small inputs (CIFAR, MNIST, digits) get the CIFAR-style stem -- one 3x3 convolution at
stride 1 and no max-pooling -- because the ImageNet stem (7x7 at stride 2, then a
max-pool) would shrink a 32x32 image to 8x8 before the first block. Inputs of 96 pixels
and more get the ImageNet stem. The classifier is called ``head``.
"""
from __future__ import annotations

import torch
from torch import nn

from ..common.errors import UserError
from .core import ModelInputs, image_channels, parse_options, register, require_positive

#: Smallest input side (pixels) for which ``stem=auto`` picks the ImageNet stem.
IMAGENET_STEM_MIN_SIZE = 96


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection (ResNet-18/34)."""

    expansion = 1

    def __init__(self, c_in: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU()
        self.shortcut = _shortcut(c_in, planes * self.expansion, stride)

    def last_norm(self) -> nn.BatchNorm2d:
        return self.bn2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carrying the stride, as in torchvision's "v1.5"), 1x1 expand."""

    expansion = 4

    def __init__(self, c_in: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU()
        self.shortcut = _shortcut(c_in, planes * self.expansion, stride)

    def last_norm(self) -> nn.BatchNorm2d:
        return self.bn3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + self.shortcut(x))


def _shortcut(c_in: int, c_out: int, stride: int) -> nn.Module:
    if stride == 1 and c_in == c_out:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False),
                         nn.BatchNorm2d(c_out))


class ResNet(nn.Module):
    """A ResNet classifier: stem, four stages (widths w, 2w, 4w, 8w), global pool, ``head``."""

    def __init__(self, block: type[BasicBlock] | type[Bottleneck], layers: list[int],
                 in_channels: int, num_classes: int, width: int = 64,
                 imagenet_stem: bool = False) -> None:
        super().__init__()
        if imagenet_stem:
            self.stem = nn.Sequential(nn.Conv2d(in_channels, width, 7, stride=2, padding=3,
                                                bias=False),
                                      nn.BatchNorm2d(width), nn.ReLU(),
                                      nn.MaxPool2d(3, stride=2, padding=1))
        else:
            self.stem = nn.Sequential(nn.Conv2d(in_channels, width, 3, padding=1, bias=False),
                                      nn.BatchNorm2d(width), nn.ReLU())
        stages, c_in = [], width
        for i, blocks in enumerate(layers):
            planes = width * 2 ** i
            stage = []
            for j in range(blocks):
                stage.append(block(c_in, planes, stride=2 if (i > 0 and j == 0) else 1))
                c_in = planes * block.expansion
            stages.append(nn.Sequential(*stage))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(c_in, num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        # Zero-init the last norm of each residual branch: every block starts as the
        # identity, which makes early training (and large-batch training) more stable.
        for m in self.modules():
            if isinstance(m, (BasicBlock, Bottleneck)):
                nn.init.zeros_(m.last_norm().weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.head(self.pool(x))


def _resnet(name: str, block: type[BasicBlock] | type[Bottleneck], layers: list[int],
            argument: str, inputs: ModelInputs) -> ResNet:
    spec = f"{name}:{argument}" if argument else name
    o = parse_options(argument, {"width": 64, "stem": "auto"}, spec, positional="width")
    if o["stem"] not in ("auto", "cifar", "imagenet"):
        raise UserError(f"--model {spec}: stem must be auto, cifar or imagenet (got {o['stem']})")
    require_positive(o, spec, "width")
    channels = image_channels(inputs, spec)
    small_side = min(inputs.input_shape[1:])
    imagenet = o["stem"] == "imagenet" or (o["stem"] == "auto"
                                           and small_side >= IMAGENET_STEM_MIN_SIZE)
    return ResNet(block, layers, channels, inputs.num_classes, o["width"], imagenet)


@register("resnet18")
def resnet18(argument: str, inputs: ModelInputs) -> nn.Module:
    """``resnet18[:width=64][,stem=auto|cifar|imagenet]`` (11M parameters at width 64)."""
    return _resnet("resnet18", BasicBlock, [2, 2, 2, 2], argument, inputs)


@register("resnet50")
def resnet50(argument: str, inputs: ModelInputs) -> nn.Module:
    """``resnet50[:width=64][,stem=auto|cifar|imagenet]`` (24M parameters at width 64)."""
    return _resnet("resnet50", Bottleneck, [3, 4, 6, 3], argument, inputs)
