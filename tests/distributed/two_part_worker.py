"""A two-part task (a toy GAN: two models, two optimizers, two losses) trained under
torchrun (2 CPU processes, gloo) by tests/distributed/test_ddp.py, and in one process as
its reference.

``python -m torch.distributed.run --nproc-per-node 2 tests/distributed/two_part_worker.py OUT``
saves each rank's parameters, optimizer states and records to ``OUT/two_part-rank<R>.pt``.

The latents come with the data (a third tensor of each sample), not from the RNG, and the
parts have no BatchNorm: one process and two then compute the same mathematics (per-rank
random latents or per-rank batch statistics would be a different training, not a
rounding difference).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from amptrain.data import TensorData
from amptrain.distributed import DDPStrategy, Strategy, build_strategy
from amptrain.tasks import ClassificationTask
from amptrain.trainer import Trainer

SAMPLES = 384
COMMON = {"device": "cpu", "no_progress": True, "scheduler": "none", "epochs": 1,
          "log_every": 1, "batch_size": 32, "optimizer": "adamw", "lr": 0.01}
#: (precision, accumulate, extra options): 16-mixed starts at a scale that overflows, so
#: the first steps are skipped and the ranks must agree on it.
RUNS = [("32-true", 1, {}), ("32-true", 2, {}), ("16-mixed", 2, {"init_scale": 2.0 ** 18})]


def run_name(precision: str, accumulate: int) -> str:
    return f"{precision}-acc{accumulate}"


class ToyGan(nn.Module):
    """A generator (latent 2 -> 4 features) and a discriminator (4 -> one logit)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.generator = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 4))
        self.discriminator = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.discriminator(x).squeeze(-1)


class TwoPartTask(ClassificationTask):
    """D then G, each with its own loss (loss ids 0 and 1), the GanTask's shape."""

    def models(self, model: nn.Module) -> dict[str, nn.Module]:
        return {"discriminator": model.discriminator, "generator": model.generator}

    def training_step(self, ctx: Any) -> None:
        generator, discriminator = ctx.model("generator"), ctx.model("discriminator")
        for (real, z, _), n, share in ctx.micro("discriminator"):
            with ctx.autocast():
                with torch.no_grad():
                    fake = generator(z)
                d_loss = F.softplus(-discriminator(real)).mean() \
                    + F.softplus(discriminator(fake)).mean()
            ctx.backward(d_loss * share, loss_id=0)
            ctx.log("d_loss", d_loss.detach().float(), n)
        ctx.step("discriminator")
        for (_, z, _), n, share in ctx.micro("generator"):
            with ctx.autocast():
                g_loss = F.softplus(-discriminator(generator(z))).mean()
            ctx.backward(g_loss * share, loss_id=1)
            ctx.log("g_loss", g_loss.detach().float(), n)
        ctx.step("generator")


def data() -> TensorData:
    g = torch.Generator().manual_seed(0)
    real = torch.randn(SAMPLES, 4, generator=g) * 0.5 + 1.0
    z = torch.randn(SAMPLES, 2, generator=g)
    return TensorData(real, z, torch.zeros(SAMPLES, dtype=torch.long))


def fit(strategy: Strategy | None, precision: str, accumulate: int,
        **options: Any) -> Trainer:
    trainer = Trainer(strategy=strategy, precision=precision, accumulate=accumulate,
                      **{**COMMON, **options})
    trainer.fit(ToyGan(), data(), task=TwoPartTask(class_names=["real"]))
    return trainer


def observe(trainer: Trainer) -> dict[str, Any]:
    assert trainer.model is not None
    return {"params": {k: v.detach().clone() for k, v in trainer.model.state_dict().items()},
            "optimizers": {name: opt.state_dict() for name, opt in trainer.optimizers.items()},
            "records": [{k: v for k, v in r.items()
                         if k not in ("samples_per_s", "data_wait_frac", "peak_mem_bytes")}
                        for r in trainer.history],
            "skipped": {name: trainer.precision.skipped_steps_of(opt)
                        for name, opt in trainer.optimizers.items()},
            "loss_scale": trainer.precision.loss_scale, "steps": trainer.step}


def main(argv: list[str]) -> None:
    out = Path(argv[0])
    torch.set_num_threads(1)
    group = build_strategy("ddp", "cpu")  # joins torchrun's process group (gloo)
    try:
        results = {run_name(p, a): observe(fit(DDPStrategy(torch.device("cpu")), p, a, **o))
                   for p, a, o in RUNS}
        torch.save(results, out / f"two_part-rank{group.rank}.pt")
        group.barrier()
    finally:
        group.teardown()


if __name__ == "__main__":
    main(sys.argv[1:])
