"""What a command-line run builds beside the training options: the model, the data, and
the options of the data sources and the task that apply to some data only, each declared
(and checked) beside its owner's code and composed here as a section."""
from __future__ import annotations

from dataclasses import dataclass

from ..common.errors import UserError, flag
from ..common.options import option, section
from ..data.gym_options import GymOptions
from ..data.image_options import ImageOptions
from ..data.scope import Scoped
from ..data.text_options import TextOptions
from ..tasks.ppo_options import PpoOptions
from .train import TrainConfig


@dataclass
class RunConfig(TrainConfig):
    """A command-line run: the training options plus which model and data to build."""

    model: str = option("cnn", "model name (mlp, cnn, resnet18, resnet50, lstm, transformer, "
                               "gpt, module:pkg.mod.factory, timm:NAME, hf:PATH, "
                               "keras:FILE.keras)", group="run")
    data: str = option("digits", "dataset (digits, synthetic-image, synthetic-seq, idx:DIR, "
                                 "cifar10:DIR, imagefolder:DIR, npz:FILE, csv-text:FILE, "
                                 "text:PATH, tokens:DIR, module:pkg.mod.factory)",
                       group="run")
    val_fraction: float = option(0.2, "validation share when the data has no split", group="run")
    # The options of some data only, each section declared beside its owner (flat names as
    # ever: --seq-len, --augment, --num-envs, --clip-coef).
    text: TextOptions = section(TextOptions)          # data/text_options.py
    images: ImageOptions = section(ImageOptions)      # data/image_options.py
    gym: GymOptions = section(GymOptions)             # data/gym_options.py
    ppo: PpoOptions = section(PpoOptions)             # tasks/ppo_options.py

    def __post_init__(self) -> None:
        super().__post_init__()
        # An option set for data it does not apply to does nothing there: each section's
        # scope refuses it, naming both flags (the ppo task's first, as it was).
        scoped: tuple[Scoped, ...] = (self.text, self.images, self.ppo, self.gym)
        for options in scoped:
            options.SCOPE.check(options, str(self.data))
        if not 0.0 < self.val_fraction < 1.0:
            raise UserError(f"{flag('val_fraction')} must be between 0 and 1 "
                            f"(got {self.val_fraction})")
