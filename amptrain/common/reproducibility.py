"""Seeds and kernel choices: what makes a run repeat itself."""
from __future__ import annotations

import os
import random

import numpy as np
import torch


def seed_everything(seed: int, deterministic: bool = False) -> None:
    """Seed python, numpy and torch (all devices); optionally force deterministic kernels."""
    random.seed(seed)
    np.random.seed(seed % (2 ** 32))
    torch.manual_seed(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False


#: The moments a run's random numbers start again from ``--seed``, in the order a run
#: reaches them. Both are needed: the model's weights come from the seed however long
#: building the data took (``MODEL_INIT``, runner.build_run_model), and training's random
#: numbers (data order, dropout, augmentation) from the seed whatever the model's
#: construction drew, also for a library caller's own model (``TRAINING``, the Trainer's
#: set-up; it also applies ``--deterministic``).
MODEL_INIT = "model-init"
TRAINING = "training"
SEED_PHASES = (MODEL_INIT, TRAINING)


def seed_phase(phase: str, seed: int, *, deterministic: bool = False) -> None:
    """Start ``phase``'s random numbers from ``seed``: the one place a run applies its
    seed (see :data:`SEED_PHASES`). ``deterministic`` is applied with training's."""
    if phase not in SEED_PHASES:
        raise ValueError(f"unknown seed phase {phase!r}; the phases are {SEED_PHASES}")
    seed_everything(seed, deterministic and phase == TRAINING)


def tune_backends(device: torch.device, deterministic: bool) -> None:
    """Let cuDNN time its convolution algorithms once per input shape and keep the fastest.

    Worth it for the fixed shapes of a training loop (timm and torchvision's references
    do the same); off with ``--deterministic``, where the choice must not vary by run.
    """
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = not deterministic
