"""Scenarios that the tests in tests/distributed/ run under torchrun (2 CPU processes, gloo).

``python -m torch.distributed.run --nproc-per-node 2 tests/distributed/worker.py OUT [NAME...]``
runs every scenario (or the named ones) once and saves each rank's observations to
``OUT/<scenario>-rank<R>.pt``; the tests compare them with single-process runs. One
launch for all scenarios keeps the suite fast (process start-up dominates).
"""
from __future__ import annotations

import contextlib
import faulthandler
import io
import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from amptrain.distributed import DDPStrategy, FSDPStrategy, Strategy, build_strategy
from amptrain.trainer import Trainer
from tests.conftest import tiny_classification, tiny_mlp

SAMPLES = 200  # 6 global batches of 32 and a partial one of 8: the last window is uneven
COMMON = {"device": "cpu", "no_progress": True, "scheduler": "none", "epochs": 1,
          "log_every": 1, "batch_size": 32, "optimizer": "sgd", "lr": 0.1}

#: (precision, accumulate, optimizer) runs compared with one process (same global batch).
EQUAL_RUNS = [("32-true", 1, "sgd"), ("32-true", 2, "sgd"), ("bf16-mixed", 1, "sgd"),
              ("bf16-mixed", 2, "sgd"), ("32-true", 2, "adamw")]


def equal_name(precision: str, accumulate: int, optimizer: str) -> str:
    return f"equal-{precision}-acc{accumulate}-{optimizer}"


def fit(strategy: Strategy | None, data: Any = None, val: Any = None,
        **options: Any) -> Trainer:
    """Train tiny_mlp (seed 0) like every scenario and its single-process reference."""
    trainer = Trainer(strategy=strategy, **{**COMMON, **options})
    trainer.fit(tiny_mlp(), data if data is not None else tiny_classification(n=SAMPLES), val)
    return trainer


def params(trainer: Trainer) -> dict[str, torch.Tensor]:
    """Full fp32 parameters (gathered from shards under FSDP)."""
    return {k: v.clone() for k, v in
            trainer.strategy.model_state_dict(trainer.model, trainer.precision).items()}


class Recording:
    """Mixin for a strategy: snapshot gradients after every micro-batch's backward, and
    optionally poison one rank's gradients after the all-reduce (only agreement helps)."""

    trainer: Trainer | None = None
    snapshots: list[tuple[int, bool, list[torch.Tensor]]]
    inject: tuple[int, int] | None = None  # (rank, optimizer step index)
    always_sync = False

    def accumulation_context(self, model, boundary):
        @contextlib.contextmanager
        def recorded():
            with super(Recording, self).accumulation_context(model, boundary or self.always_sync):
                yield
            grads = [p.grad for p in self.trainer.model.parameters()]
            self.snapshots.append((self.trainer.step, boundary,
                                   [_local(g).clone() for g in grads]))
            if boundary and self.inject == (self.rank, self.trainer.step):
                with torch.no_grad():
                    _local(grads[0]).view(-1)[0] = float("inf")
        return recorded()


class RecordingDDP(Recording, DDPStrategy):
    pass


class RecordingFSDP(Recording, FSDPStrategy):
    pass


class DisagreeingDDP(RecordingDDP):
    """Control: DDP without found-inf agreement (what agreement protects against)."""

    def wrap_model(self, model, precision, optimizer=None):
        model = super().wrap_model(model, precision, optimizer)
        precision.set_found_inf_agreement(None)
        return model


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def recorded_fit(cls: type, inject: tuple[int, int] | None = None, always_sync: bool = False,
                 **options: Any) -> tuple[Trainer, Recording]:
    strategy = cls(torch.device("cpu"))
    strategy.snapshots, strategy.inject, strategy.always_sync = [], inject, always_sync
    trainer = Trainer(strategy=strategy, **{**COMMON, **options})
    strategy.trainer = trainer
    trainer.fit(tiny_mlp(), tiny_classification(n=SAMPLES))
    return trainer, strategy


def summary(trainer: Trainer) -> dict[str, Any]:
    return {"params": params(trainer), "skipped_steps": trainer.precision.skipped_steps,
            "loss_scale": trainer.precision.loss_scale, "steps": trainer.step,
            "scales": [r.get("loss_scale") for r in trainer.history if "loss" in r],
            "losses": [r["loss"] for r in trainer.history if "loss" in r]}


# ----------------------------------------------------------------- scenarios
def scenario_equal(out: Path) -> dict[str, Any]:
    results = {}
    for precision, accumulate, optimizer in EQUAL_RUNS:
        val = tiny_classification(n=61, seed=1) if precision == "32-true" and accumulate == 1 \
            else None
        trainer = fit(DDPStrategy(torch.device("cpu")), val=val, precision=precision,
                      accumulate=accumulate, optimizer=optimizer)
        result = {"params": params(trainer), "micro": trainer.micro_batch_size,
                  "accumulate": trainer.accumulate}
        if trainer.last_eval is not None:
            result.update(val_acc=trainer.last_eval.accuracy, val_loss=trainer.last_eval.loss,
                          val_samples=trainer.last_eval.samples)
        results[equal_name(precision, accumulate, optimizer)] = result
    return results


def scenario_loader(out: Path) -> dict[str, Any]:
    """A user DataLoader (16 per rank, shuffled): amptrain adds a DistributedSampler.

    Validation loaders of 61 samples (odd: a padding sampler would repeat one) and of one
    sample (rank 1 gets none and must still join the gathers)."""
    loader = DataLoader(tiny_classification(n=SAMPLES), batch_size=16, shuffle=True)
    val = DataLoader(tiny_classification(n=61, seed=1), batch_size=16)
    trainer = fit(DDPStrategy(torch.device("cpu")), data=loader, val=val, precision="32-true")
    sampler = trainer.train_windows.reader.source.sampler
    single = trainer.evaluate(data=DataLoader(tiny_classification(n=1, seed=2), batch_size=16))
    return {"params": params(trainer), "sampler": type(sampler).__name__,
            "val": {"samples": trainer.last_eval.samples, "acc": trainer.last_eval.accuracy,
                    "loss": trainer.last_eval.loss},
            "single": {"samples": single.samples, "loss": single.loss}}


def scenario_no_sync(out: Path) -> dict[str, Any]:
    result = {}
    for name, always_sync in (("no_sync", False), ("always_sync", True)):
        _, strategy = recorded_fit(RecordingDDP, always_sync=always_sync, precision="32-true",
                                   accumulate=2, max_steps=2)
        result[name] = strategy.snapshots
    return result


def scenario_found_inf(out: Path) -> dict[str, Any]:
    result = {}
    for name, cls, precision in (("agree-16-mixed", RecordingDDP, "16-mixed"),
                                 ("agree-bf16-mixed", RecordingDDP, "bf16-mixed"),
                                 ("disagree-16-mixed", DisagreeingDDP, "16-mixed"),
                                 ("fsdp-16-mixed", RecordingFSDP, "16-mixed")):
        trainer, _ = recorded_fit(cls, inject=(1, 1), precision=precision, optimizer="adamw",
                                  lr=0.01, init_scale=1024.0, max_steps=4)
        result[name] = summary(trainer)
    return result


def scenario_fsdp(out: Path) -> dict[str, Any]:
    result = {}
    for precision, keep in (("32-true", []), ("bf16-mixed", ["head"])):
        run = out / f"fsdp-{precision}"
        trainer = fit(FSDPStrategy(torch.device("cpu")), precision=precision, optimizer="adamw",
                      lr=0.01, keep_fp32=keep, out=str(run))
        result[precision] = {**summary(trainer), "checkpoint": str(run / "checkpoints" / "last.pt")}
    # Resume: 3 steps, then continue to 6 from the checkpoint == 6 steps in one go. The
    # first part also saves at its last step via --save-every (every rank must agree that
    # the final save is then done: the FSDP state is gathered collectively).
    split, whole = out / "fsdp-resume", out / "fsdp-whole"
    fit(FSDPStrategy(torch.device("cpu")), precision="32-true", optimizer="adamw", lr=0.01,
        max_steps=3, save_every=3, out=str(split))
    resumed = fit(FSDPStrategy(torch.device("cpu")), precision="32-true", optimizer="adamw",
                  lr=0.01, max_steps=6, out=str(split), resume="auto")
    straight = fit(FSDPStrategy(torch.device("cpu")), precision="32-true", optimizer="adamw",
                   lr=0.01, max_steps=6, out=str(whole))
    result["resume"] = {"resumed": params(resumed), "straight": params(straight)}
    return result


class PoisonOnRank1(torch.nn.Module):
    """The identity, except on rank 1 in its 3rd and 4th calls: step 3's forward, and the
    trace's replay of that step right after it (``log_every=1`` settles the skip at once)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        poisoned = torch.distributed.get_rank() == 1 and self.calls in (3, 4)
        return x * float("inf") if poisoned else x


def scenario_nonfinite(out: Path) -> dict[str, Any]:
    """16-mixed; rank 1's forward turns inf at step 3: every rank skips it, and the line
    names rank 1's module."""
    run = out / "nonfinite"
    said = io.StringIO()
    with contextlib.redirect_stderr(said):
        trainer = Trainer(strategy=DDPStrategy(torch.device("cpu")),
                          **{**COMMON, "precision": "16-mixed", "max_steps": 4, "out": str(run)})
        trainer.fit(torch.nn.Sequential(PoisonOnRank1(), tiny_mlp()),
                    tiny_classification(n=SAMPLES))
    files = {p.name: json.loads(p.read_text()) for p in sorted(run.glob("nonfinite*.json"))}
    return {"said": said.getvalue(), "files": files,
            "skipped_steps": trainer.precision.skipped_steps}


SCENARIOS: dict[str, Callable[[Path], dict[str, Any]]] = {
    "equal": scenario_equal, "loader": scenario_loader, "no_sync": scenario_no_sync,
    "found_inf": scenario_found_inf, "fsdp": scenario_fsdp, "nonfinite": scenario_nonfinite,
}


def main(argv: list[str]) -> None:
    faulthandler.register(signal.SIGUSR1)  # the test dumps our stacks if we hang
    out = Path(argv[0])
    names = argv[1:] or list(SCENARIOS)
    torch.set_num_threads(1)
    group = build_strategy("ddp", "cpu")  # joins torchrun's process group (gloo)
    try:
        for name in names:
            torch.save(SCENARIOS[name](out), out / f"{name}-rank{group.rank}.pt")
            group.barrier()
    finally:
        group.teardown()


if __name__ == "__main__":
    main(sys.argv[1:])
