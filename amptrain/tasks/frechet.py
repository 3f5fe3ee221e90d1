"""The gan task's quality measure: a Fréchet distance in the feature space of a small
classifier trained on the real training images (the FID idea without Inception weights).

What it is, exactly:

1. **Features.** A :class:`~amptrain.models.basic.SmallCNN` (``width`` 16: 64 features,
   the output of its global average pool) is trained as a classifier on the real
   *training* split: seed :data:`FEATURE_SEED`, fp32 (autocast off), Adam (lr 1e-3),
   :data:`FEATURE_STEPS` steps of :data:`FEATURE_BATCH` images drawn from a seeded sample
   of at most :data:`POOL` training images. It is trained once per run (per task object)
   and never sees generated images; the global RNG is left untouched.
2. **Statistics.** For every validation batch the evaluation draws as many generated
   images (fixed seeded latents, so every evaluation of a run sees the same ``z``) and
   sums, in float64 on the device, the count, the feature sum and the sum of outer
   products of the real and of the generated features; processes' sums are added.
3. **Distance.** With means ``mu_r, mu_g`` and (unbiased) covariances ``S_r, S_g``:
   ``FD = |mu_r - mu_g|^2 + tr(S_r + S_g - 2 (S_r S_g)^(1/2))``, where
   ``tr (S_r S_g)^(1/2)`` is the sum of the square roots of the eigenvalues of the
   symmetric ``S_r^(1/2) S_g S_r^(1/2)`` (``eigh`` twice, float64).

It is **not** comparable to published FIDs: different network (a 64-feature CNN trained for
a few hundred steps on this data, not Inception-v3 on ImageNet), different resolution,
and a sample size set by the validation split. Use it to compare runs on the same data
(first vs last evaluation, one precision vs another), not against numbers from papers.
Data with fewer than two classes cannot train a classifier: the features are then those
of the same network at its seeded initialisation (a random-feature FD), and the report says so.
"""
from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

import torch
from torch.nn import functional as F

from ..data.protocol import MapData, columns_of, finish_of
from ..common.errors import UserError
from ..models.basic import SmallCNN

if TYPE_CHECKING:
    from ..models.basic import SmallCNN

#: The feature network's seed, training steps, batch size, width and data sample.
log = logging.getLogger("amptrain")

FEATURE_SEED = 0
FEATURE_STEPS = 300
FEATURE_BATCH = 64
FEATURE_WIDTH = 16
POOL = 10_000
#: Streamed (file) datasets are decoded once into a smaller sample.
FILE_POOL = 2_048


def frechet_distance(mu1: torch.Tensor, cov1: torch.Tensor, mu2: torch.Tensor,
                     cov2: torch.Tensor) -> float:
    """``|mu1 - mu2|^2 + tr(cov1 + cov2 - 2 (cov1 cov2)^(1/2))`` in float64 (see the
    module docstring for the square root's trace)."""
    mu1, mu2, cov1, cov2 = (t.detach().double().cpu() for t in (mu1, mu2, cov1, cov2))
    cov1 = (cov1 + cov1.T) / 2
    cov2 = (cov2 + cov2.T) / 2
    values, vectors = torch.linalg.eigh(cov1)
    root1 = (vectors * values.clamp(min=0).sqrt()) @ vectors.T
    product = root1 @ cov2 @ root1
    trace_root = torch.linalg.eigvalsh((product + product.T) / 2).clamp(min=0).sqrt().sum()
    diff = mu1 - mu2
    return float(diff @ diff + torch.trace(cov1) + torch.trace(cov2) - 2 * trace_root)


class FeatureSums:
    """Count, sum and sum of outer products of feature vectors, float64 on the device."""

    def __init__(self, dim: int, device: torch.device) -> None:
        self.count = torch.zeros((), dtype=torch.float64, device=device)
        self.total = torch.zeros(dim, dtype=torch.float64, device=device)
        self.outer = torch.zeros(dim, dim, dtype=torch.float64, device=device)

    def add(self, features: torch.Tensor) -> None:
        f = features.detach().double()
        self.count += len(f)
        self.total += f.sum(dim=0)
        self.outer += f.T @ f

    def flat(self) -> torch.Tensor:
        return torch.cat([self.count.reshape(1), self.total, self.outer.flatten()])

    @staticmethod
    def statistics(flat: torch.Tensor, dim: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        """(count, mean, unbiased covariance) from one or several processes' :meth:`flat`."""
        flat = flat.double().cpu().reshape(-1, 1 + dim + dim * dim).sum(dim=0)
        n = float(flat[0])
        total, outer = flat[1:1 + dim], flat[1 + dim:].reshape(dim, dim)
        mean = total / max(n, 1.0)
        cov = (outer - n * torch.outer(mean, mean)) / max(n - 1.0, 1.0)
        return int(n), mean, cov


def images_of(batch: Any) -> torch.Tensor:
    """The images of a batch: ``(images, labels)`` or a bare image tensor."""
    x = batch[0] if isinstance(batch, (tuple, list)) else batch
    if not isinstance(x, torch.Tensor) or x.ndim != 4:
        what = f"of shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise UserError(f"the gan task needs batches of images (N x C x H x W tensors, "
                        f"optionally with labels); this batch holds {what}")
    return x


class RealImages:
    """A seeded sample of the real training images and their labels, kept as stored
    (uint8 stays uint8) and finished per batch by the data's ``on_device`` step."""

    def __init__(self, data: Any) -> None:
        self.on_device = finish_of(data)
        tensors = columns_of(data)
        g = torch.Generator().manual_seed(FEATURE_SEED)
        if tensors is not None:
            count = len(tensors[0])
            pick = torch.randperm(count, generator=g)[:POOL].sort().values
            self.x = tensors[0][pick].cpu()
            self.y = tensors[-1][pick].cpu() if len(tensors) > 1 else None
        elif isinstance(data, MapData):
            pick = torch.randperm(len(data), generator=g)[:FILE_POOL].sort().values
            items = [data[int(i)] for i in pick]
            self.x = torch.stack([torch.as_tensor(images_of_item(item)) for item in items])
            labels = [item[-1] for item in items if isinstance(item, (tuple, list))]
            self.y = torch.as_tensor(labels) if len(labels) == len(items) else None
        else:  # a DataLoader or another iterable of batches
            xs: list[torch.Tensor] = []
            ys: list[torch.Tensor] = []
            for batch in data:
                xs.append(images_of(batch).cpu())
                if isinstance(batch, (tuple, list)) and len(batch) > 1:
                    ys.append(torch.as_tensor(batch[-1]).cpu())
                if sum(len(x) for x in xs) >= FILE_POOL:
                    break
            if not xs:
                raise UserError("train_data holds no images for the gan task")
            self.x = torch.cat(xs)
            self.y = torch.cat(ys) if len(ys) == len(xs) else None
        if self.x.ndim != 4 or self.x.shape[1] not in (1, 3):
            raise UserError(f"the gan task needs grey or RGB images (N x 1|3 x H x W); the "
                            f"training data holds {tuple(self.x.shape)}")
        if self.y is not None and (self.y.is_floating_point() or self.y.ndim != 1):
            self.y = None

    def __len__(self) -> int:
        return len(self.x)

    @property
    def classes(self) -> int:
        return int(self.y.max()) + 1 if self.y is not None and len(self.y.unique()) > 1 else 0

    def batch(self, index: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, Any]:
        """Images (float32, finished as training batches are, never augmented) and labels."""
        x = self.x[index].to(device)
        y = self.y[index].to(device) if self.y is not None else None
        if self.on_device is not None:
            x = self.on_device((x, y), training=False, key=(0,))[0]
        return x.float(), y

    def value_range(self) -> tuple[list[float], list[float]]:
        """Per-channel minimum and maximum of the finished images."""
        low = torch.full((self.x.shape[1],), float("inf"))
        high = torch.full((self.x.shape[1],), float("-inf"))
        for start in range(0, len(self.x), 1024):
            x, _ = self.batch(torch.arange(start, min(start + 1024, len(self.x))),
                              torch.device("cpu"))
            low = torch.minimum(low, x.amin(dim=(0, 2, 3)))
            high = torch.maximum(high, x.amax(dim=(0, 2, 3)))
        return low.tolist(), high.tolist()


def images_of_item(item: Any) -> Any:
    """The image of one dataset item (``(image, label)`` or a bare image)."""
    return item[0] if isinstance(item, (tuple, list)) else item


def train_feature_net(real: RealImages, device: torch.device
                      ) -> tuple[SmallCNN, bool]:
    """The feature network (eval mode, no gradients) and whether it was trained (False:
    fewer than two classes, the seeded initialisation is used)."""

    channels, height, width = real.x.shape[1:]
    classes = real.classes
    if classes:  # the work before the first val_fd; without a word it looks like a hang
        log.info("val_fd: first training its feature network (a small CNN, %d steps on %d "
                 "real training images; once per run)", FEATURE_STEPS, len(real))
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.enable_grad(), \
            torch.autocast(device.type, enabled=False):
        torch.manual_seed(FEATURE_SEED)
        net = SmallCNN(int(channels), max(classes, 2), FEATURE_WIDTH,
                       min(int(height), int(width))).to(device)
        if classes:
            g = torch.Generator().manual_seed(FEATURE_SEED + 1)
            optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
            net.train()
            for _ in range(FEATURE_STEPS):
                index = torch.randint(0, len(real), (min(FEATURE_BATCH, len(real)),), generator=g)
                x, y = real.batch(index, device)
                loss = F.cross_entropy(net(x), y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
    net.eval().requires_grad_(False)
    return net, bool(classes)


def features(net: SmallCNN, images: torch.Tensor) -> torch.Tensor:
    """The network's pooled features of ``images`` (fp32, autocast off)."""
    autocast = torch.autocast(images.device.type, enabled=False) \
        if images.device.type in ("cpu", "cuda") else contextlib.nullcontext()
    with torch.no_grad(), autocast:
        return net.features(images.float())


__all__ = ["FEATURE_SEED", "FEATURE_STEPS", "FeatureSums", "RealImages", "features",
           "frechet_distance", "images_of", "train_feature_net"]
