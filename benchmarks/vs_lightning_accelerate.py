"""amptrain's Trainer vs PyTorch Lightning and Hugging Face Accelerate on the same work.

Runs in its own virtual environment, with Lightning and Accelerate from the package
registry and torch pinned (``bash benchmarks/setup_compare_env.sh`` makes it)::

    benchmarks/.venv-compare/bin/python benchmarks/vs_lightning_accelerate.py \
        [--models mlp,cnn,transformer] [--precisions 32-true,bf16-mixed,16-mixed] \
        [--rounds 10] [--threads 1] [--record]

The same model (a copy each), the same data kept on the device and reshuffled every
epoch, fused AdamW with the same parameter groups and a per-step cosine schedule:

* amptrain: ``Trainer(precision=P)``, run through its real loop, no output directory (no
  checkpoints), progress bars off, metrics read only at the end (``--log-every`` larger
  than the run);
* Lightning: ``lightning.Trainer(precision=P)`` with ``logger=False``,
  ``enable_checkpointing=False``, ``enable_progress_bar=False``,
  ``enable_model_summary=False``, the scheduler stepped every step;
* Accelerate: ``Accelerator(mixed_precision="no"/"bf16"/"fp16")`` and the loop from its
  documentation (``accelerator.backward``, ``optimizer.step``, ``scheduler.step``);
* the hand-written :class:`benchlib.RawLoop` as the reference (logging every 10 steps).

All run in one process and alternate after every step (see :class:`benchlib.Relay`); a
round is ``--block`` steps of each. Ratios are medians over rounds of (other / amptrain): above 1
means amptrain is faster. 16-mixed CNN on a CPU without AMX-FP16: Lightning and
Accelerate would run PyTorch's fp16 convolution backward, ~100x slower than fp32; to
compare the loops rather than that kernel, their models get amptrain's CPU fp16
convolution too (as the hand-written loop does).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import logging
import sys
import warnings
from typing import Any, Callable, Iterable

import benchlib as bl
import torch
from torch import nn
from torch.nn import functional as F

LIGHTNING_PRECISION = {"32-true": "32-true", "bf16-mixed": "bf16-mixed", "16-mixed": "16-mixed"}
ACCELERATE_PRECISION = {"32-true": "no", "bf16-mixed": "bf16", "16-mixed": "fp16"}


def _param_groups(model: nn.Module) -> list[dict]:
    decay = [p for p in model.parameters() if p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.ndim <= 1]
    return [{"params": decay, "weight_decay": bl.WEIGHT_DECAY},
            {"params": no_decay, "weight_decay": 0.0}]


def _fp16_conv_fix(model: nn.Module, precision: str, device: torch.device) -> None:
    if precision == "16-mixed" and device.type == "cpu":
        from amptrain.precision.islands import ForwardPatches, install_cpu_fp16_conv
        install_cpu_fp16_conv(ForwardPatches(), model, skip=set())


class _Batches:
    """Device batches for ``total`` steps, as a re-iterable loader (Lightning asks for
    ``iter()``), passed through the relay's feed."""

    def __init__(self, raw: bl.RawLoop, total: int,
                 feed: Callable[[Iterable[Any]], Iterable[Any]]) -> None:
        self.raw, self.total, self.feed = raw, total, feed

    def __iter__(self):
        import itertools
        return iter(self.feed(itertools.islice(self.raw.batches(), self.total)))


class LightningLoop:
    def __init__(self, model: nn.Module, data: Any, *, precision: str, batch_size: int,
                 total_steps: int, device: torch.device) -> None:
        import lightning as L

        _fp16_conv_fix(model, precision, device)
        total = total_steps

        class Module(L.LightningModule):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def training_step(self, batch, batch_idx):
                x, y = batch
                return F.cross_entropy(self.model(x), y)

            def configure_optimizers(self):
                optimizer = torch.optim.AdamW(_param_groups(self.model), lr=bl.LR, fused=True)
                scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, bl.cosine_factor(total))
                return {"optimizer": optimizer,
                        "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

        self.module = Module()
        self.source = bl.RawLoop(nn.Identity(), data, precision="32-true", batch_size=batch_size,
                                 total_steps=total, device=device)
        self.trainer = L.Trainer(
            accelerator="gpu" if device.type == "cuda" else "cpu", devices=1,
            precision=LIGHTNING_PRECISION[precision], max_steps=total, max_epochs=-1,
            logger=False, enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0)
        self.total = total
        # Lightning turns 16-mixed on a CPU into bf16-mixed (with a warning).
        self.effective = str(self.trainer.precision)

    def run(self, feed: Callable[[Iterable[Any]], Iterable[Any]] = iter) -> None:
        self.trainer.fit(self.module, train_dataloaders=_Batches(self.source, self.total, feed))


class AccelerateLoop:
    def __init__(self, model: nn.Module, data: Any, *, precision: str, batch_size: int,
                 total_steps: int, device: torch.device) -> None:
        from accelerate import Accelerator
        from accelerate.state import AcceleratorState

        _fp16_conv_fix(model, precision, device)
        # The state is a process-wide singleton; each measurement sets its own precision.
        AcceleratorState._reset_state(reset_partial_state=True)
        self.accelerator = Accelerator(mixed_precision=ACCELERATE_PRECISION[precision],
                                       cpu=device.type == "cpu")
        optimizer = torch.optim.AdamW(_param_groups(model), lr=bl.LR, fused=True)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, bl.cosine_factor(total_steps))
        self.model, self.optimizer, self.scheduler = self.accelerator.prepare(
            model, optimizer, scheduler)
        self.model.train()
        # Accelerate has no fp16 autocast on a CPU: mixed_precision="fp16" trains in fp32.
        amp = self.accelerator.native_amp or precision == "32-true"
        self.effective = precision if amp else "32-true"
        self.source = bl.RawLoop(nn.Identity(), data, precision="32-true", batch_size=batch_size,
                                 total_steps=total_steps, device=device)
        self.total = total_steps

    def run(self, feed: Callable[[Iterable[Any]], Iterable[Any]] = iter) -> None:
        for x, y in _Batches(self.source, self.total, feed):
            loss = F.cross_entropy(self.model(x), y)
            self.accelerator.backward(loss)
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)


def measure(workload: bl.Workload, precision: str, rounds: int, warmup: int, block: int,
            device: torch.device) -> dict:
    model, data = workload.build()
    total = (warmup + rounds) * block + 1
    common = dict(precision=precision, batch_size=workload.batch_size, total_steps=total,
                  device=device)
    loops = {
        # Logging off: nothing is read before the end of the run.
        "amptrain": bl.TrainerLoop(bl.fresh_copy(model), data, log_every=10 ** 9, **common),
        "lightning": LightningLoop(bl.fresh_copy(model), data, **common),
        "accelerate": AccelerateLoop(bl.fresh_copy(model), data, **common),
        "hand-written": bl.RawLoop(bl.fresh_copy(model), data, **common),
    }
    turn, group = bl.turn_plan(device, block)
    times = {k: v[warmup:] for k, v in bl.relay(loops, turn, device, group).items()}
    base = times["amptrain"]
    out = {"model": workload.name, "precision": precision,
           "amptrain_ms": bl.median(base) / block * 1e3}
    for name in ("lightning", "accelerate", "hand-written"):
        out[f"{name}_ms"] = bl.median(times[name]) / block * 1e3
        out[name] = bl.median(bl.pair_ratios(times[name], base))
        out[f"{name}_ran"] = getattr(loops[name], "effective", precision)
    return out


def _cell(r: dict, name: str) -> str:
    ran = r[f"{name}_ran"]
    note = "" if ran == r["precision"] else f" (ran {ran}: not the same work)"
    return f"**{r[name]:.3f}**{note}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,cnn,transformer",
                        help=f"comma-separated, from {', '.join(bl.CPU_WORKLOADS)}")
    parser.add_argument("--precisions", default="32-true,bf16-mixed,16-mixed")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--block", type=int, default=10,
                        help="steps of each loop per round (on a CPU the loops alternate "
                             "after every step; on a GPU a turn is a whole round)")
    parser.add_argument("--device", default="cpu")
    bl.add_common_args(parser)
    args = parser.parse_args()
    try:
        import accelerate
        import lightning
    except ImportError:
        sys.exit("this benchmark needs lightning and accelerate: run "
                 "`bash benchmarks/setup_compare_env.sh` and use "
                 "benchmarks/.venv-compare/bin/python")
    bl.apply_threads(args.threads)
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="lightning")
    warnings.filterwarnings("ignore", module="accelerate")
    device = torch.device(args.device)
    machine = bl.machine()
    rows = []
    for name in args.models.split(","):
        workload = bl.CPU_WORKLOADS[name]
        for precision in args.precisions.split(","):
            with contextlib.redirect_stdout(io.StringIO()):
                r = measure(workload, precision, args.rounds, args.warmup, args.block, device)
            same = [r[n] for n in ("lightning", "accelerate") if r[f"{n}_ran"] == precision]
            verdict = "n/a" if not same else "ok" if min(same) >= 0.98 else "MISS"
            rows.append([r["model"], precision, f"{r['amptrain_ms']:.2f}",
                         f"{r['lightning_ms']:.2f}", _cell(r, "lightning"),
                         f"{r['accelerate_ms']:.2f}", _cell(r, "accelerate"),
                         f"{r['hand-written']:.3f}", verdict])
            print(" | ".join(rows[-1]), flush=True)
    table = bl.markdown_table(["model", "precision", "amptrain ms/step", "Lightning ms/step",
                               "Lightning / amptrain", "Accelerate ms/step",
                               "Accelerate / amptrain", "hand-written / amptrain",
                               "amptrain not slower"], rows)
    turns = "after every step" if device.type == "cpu" else f"in turns of {args.block} steps"
    notes = [f"lightning {lightning.__version__}, accelerate {accelerate.__version__}. "
             "Workloads: " + "; ".join(f"{bl.CPU_WORKLOADS[n].name} = {bl.CPU_WORKLOADS[n].note},"
                                       f" batch {bl.CPU_WORKLOADS[n].batch_size}"
                                       for n in args.models.split(",")) + ".",
             f"The loops alternate ({turns}, "
             f"random order), rounds of {args.block} steps of each, {args.rounds} measured "
             f"rounds after {args.warmup} warm-up, timed by {bl.clock_name(device)}; "
             "ratio = median over rounds of other / amptrain (> 1: amptrain faster). "
             "'not slower' allows the 2% resolution of the measurement (ratio >= 0.98)."]
    bl.report("amptrain vs Lightning and Accelerate", machine, table, notes, record=args.record)


if __name__ == "__main__":
    main()
