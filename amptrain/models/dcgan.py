"""``dcgan``: a DCGAN-style generator/discriminator pair (Radford et al. 2015), sized from
the data's image shape.

One :class:`DCGAN` module holds both parts, ``.generator`` and ``.discriminator``, so a
checkpoint's ``model`` entry, ``--keep-fp32`` names and ``eval`` treat it as one model;
the ``gan`` task (:mod:`amptrain.tasks.gan`) trains the two parts with two optimizers.
``forward(x)`` is the discriminator's logit for a batch of images (what evaluation and
``diagnose`` call on real data); :meth:`DCGAN.sample` draws images.

The generator maps ``z ~ N(0, I)`` (``latent`` values) through a linear layer to a
``4 x`` ... ``7 x`` pixel map, doubles it with stride-2 transposed convolutions (BatchNorm,
ReLU) up to the image size, and ends in tanh mapped to the data's value range: the
buffers ``out_low``/``out_high`` (per channel; [-1, 1] until :meth:`DCGAN.set_output_range`
sets the range of the standardised training images, which the gan task does). The
discriminator mirrors it with stride-2 convolutions and LeakyReLU(0.2) (BatchNorm after
the first) and a linear layer to one logit. Weights are initialised as in DCGAN: N(0, 0.02)
for convolutions and linear layers, N(1, 0.02) for BatchNorm scales, zero biases.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from ..common.errors import UserError
from .core import ModelInputs, parse_options, register, require_positive

#: The smallest image side the pair supports (one stride-2 step down to 2 pixels).
MIN_SIDE = 4


def doublings(side: int) -> int:
    """Stride-2 steps between the generator's first map and an image of side ``side``:
    the first map is 4 to 7 pixels (8 px: 1 step from 4; 28 px: 2 from 7; 32 px: 3 from 4)."""
    return max(1, int(math.floor(math.log2(side / 4)))) if side >= 8 else 1


def _init_dcgan(module: nn.Module) -> None:
    if isinstance(module, (nn.Conv2d, nn.ConvTranspose2d, nn.Linear)):
        nn.init.normal_(module.weight, 0.0, 0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d)):
        nn.init.normal_(module.weight, 1.0, 0.02)
        nn.init.zeros_(module.bias)


class Generator(nn.Module):
    """``z [N, latent]`` -> images ``[N, C, H, W]`` in [``out_low``, ``out_high``]."""

    out_low: torch.Tensor
    out_high: torch.Tensor

    def __init__(self, channels: int, height: int, width: int, latent: int = 64,
                 base: int = 32) -> None:
        super().__init__()
        steps = doublings(min(height, width))
        self.latent = latent
        self.size = (height, width)
        self.start = (math.ceil(height / 2 ** steps), math.ceil(width / 2 ** steps))
        c = base * 2 ** (steps - 1)
        self.project = nn.Linear(latent, c * self.start[0] * self.start[1], bias=False)
        self.start_channels = c
        layers: list[nn.Module] = [nn.BatchNorm2d(c), nn.ReLU(inplace=True)]
        for _ in range(steps - 1):
            layers += [nn.ConvTranspose2d(c, c // 2, 4, 2, 1, bias=False), nn.BatchNorm2d(c // 2),
                       nn.ReLU(inplace=True)]
            c //= 2
        layers += [nn.ConvTranspose2d(c, channels, 4, 2, 1), nn.Tanh()]
        self.body = nn.Sequential(*layers)
        self.register_buffer("out_low", -torch.ones(1, channels, 1, 1))
        self.register_buffer("out_high", torch.ones(1, channels, 1, 1))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        x = self.project(z).view(len(z), self.start_channels, *self.start)
        x = self.body(x)[:, :, :self.size[0], :self.size[1]]  # the first map was rounded up
        # tanh's [-1, 1] to the data's range, per channel.
        return self.out_low + (x + 1) * (0.5 * (self.out_high - self.out_low))


class Discriminator(nn.Module):
    """Images ``[N, C, H, W]`` -> one real/fake logit per image ``[N]``."""

    def __init__(self, channels: int, height: int, width: int, base: int = 32) -> None:
        super().__init__()
        steps = doublings(min(height, width))
        layers: list[nn.Module] = [nn.Conv2d(channels, base, 4, 2, 1),
                                   nn.LeakyReLU(0.2, inplace=True)]
        c, h, w = base, height // 2, width // 2
        for _ in range(steps - 1):
            layers += [nn.Conv2d(c, 2 * c, 4, 2, 1, bias=False), nn.BatchNorm2d(2 * c),
                       nn.LeakyReLU(0.2, inplace=True)]
            c, h, w = 2 * c, h // 2, w // 2
        self.features = nn.Sequential(*layers, nn.Flatten())
        self.head = nn.Linear(c * h * w, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x)).squeeze(-1)


class DCGAN(nn.Module):
    """The pair; ``forward`` is the discriminator (see the module docstring)."""

    def __init__(self, channels: int, height: int, width: int, latent: int = 64,
                 base: int = 32) -> None:
        super().__init__()
        self.latent = latent
        self.image_shape = (channels, height, width)
        self.generator = Generator(channels, height, width, latent, base)
        self.discriminator = Discriminator(channels, height, width, base)
        self.apply(_init_dcgan)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.discriminator(x)

    def set_output_range(self, low: Sequence[float], high: Sequence[float]) -> None:
        """The generator's output range per channel (one value per channel, or one for all)."""
        g = self.generator
        for buffer, values in ((g.out_low, low), (g.out_high, high)):
            t = torch.as_tensor(list(values), dtype=torch.float32)
            buffer.copy_(t.reshape(1, -1, 1, 1).expand_as(buffer).to(buffer))

    def output_range(self) -> tuple[list[float], list[float]]:
        """(low, high) per channel."""
        g = self.generator
        return g.out_low.flatten().tolist(), g.out_high.flatten().tolist()

    def latents(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``n`` latent vectors ``z ~ N(0, I)`` on the generator's device, in its dtype."""
        weight = self.generator.project.weight
        device = generator.device if generator is not None else weight.device
        z = torch.randn(n, self.latent, generator=generator, device=device)
        return z.to(weight.device, weight.dtype)

    def sample(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``n`` generated images, ``z`` drawn with ``generator`` (torch's global one when
        None); the generator's mode (train/eval) is the caller's."""
        return self.generator(self.latents(n, generator))


@register("dcgan", task="gan")
def dcgan(argument: str, inputs: ModelInputs) -> nn.Module:
    """``dcgan[:width=32,latent=64]``: a generator/discriminator pair for the data's image
    size (``width``: the channels next to the image; they double per halving)."""
    spec = f"dcgan:{argument}" if argument else "dcgan"
    o = parse_options(argument, {"width": 32, "latent": 64}, spec, positional="width")
    require_positive(o, spec, "width", "latent")
    shape = tuple(inputs.input_shape)
    if inputs.kind != "image" or len(shape) != 3 or shape[0] not in (1, 3) \
            or min(shape[1:]) < MIN_SIDE:
        raise UserError(f"--model {spec} generates images: it needs grey or RGB image data "
                        f"(1 or 3 channels, at least {MIN_SIDE}x{MIN_SIDE} pixels: --data "
                        f"digits, idx:DIR, cifar10:DIR or imagefolder:DIR); this data is "
                        f"{inputs.kind} of shape {shape}")
    return DCGAN(shape[0], shape[1], shape[2], o["latent"], o["width"])


__all__ = ["DCGAN", "Discriminator", "Generator", "doublings"]
