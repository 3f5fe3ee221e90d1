"""The option of image data finished on the device (``imagefolder:``, ``cifar10:``,
``idx:``; the augmentations are :mod:`.augment`'s), declared once beside it, with its
check and the data it applies to. Torch-free: the command line's parser is built from it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..common.choices import AUGMENTATIONS
from ..common.errors import UserError, flag
from ..common.options import option
from .scope import DataScope

#: Data that --augment applies to (images decoded while training, finished on the device).
AUGMENTED_DATA = ("imagefolder:", "cifar10:", "idx:")


@dataclass
class ImageOptions:
    """Image data's option: the training batches' augmentation, checked when built."""

    SCOPE: ClassVar[DataScope] = DataScope(
        f"image files decoded while training ({', '.join(d + 'DIR' for d in AUGMENTED_DATA)})",
        AUGMENTED_DATA)

    augment: str = option("none", "image data: training-batch augmentation on the device: "
                                  "flip, crop-flip (pad + random crop + flip, CIFAR), rrc-flip "
                                  "(random resized crop + flip, ImageNet)", group="run",
                          choices=AUGMENTATIONS)

    def __post_init__(self) -> None:
        if self.augment not in AUGMENTATIONS:
            raise UserError(f"{flag('augment')} must be one of {', '.join(AUGMENTATIONS)} "
                            f"(got {self.augment!r})")
