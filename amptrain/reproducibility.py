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


def tune_backends(device: torch.device, deterministic: bool) -> None:
    """Let cuDNN time its convolution algorithms once per input shape and keep the fastest.

    Worth it for the fixed shapes of a training loop (timm and torchvision's references
    do the same); off with ``--deterministic``, where the choice must not vary by run.
    """
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = not deterministic
