"""What amptrain's DiagnoseCallback costs per step inside a real Hugging Face Trainer and a
real Lightning Trainer.

The same small BERT classifier (``--hidden``, 2 layers: ~60 modules) trains for ``--steps``
steps in each trainer: without the callback; with it at its defaults (a gradient check
every step, every module watched and ranges recorded on every 50th step); with
``watch_every_step=True`` (every module watched on every step); and with ``every=1`` too
(ranges recorded on every step: the worst case). Variants run in turns (A, B, C, A,
B, C, ... for ``--rounds`` rounds), so each sees the same machine load; within a run the
first ``--warmup`` steps are excluded. Step times are taken between consecutive step
starts by a timing callback placed before amptrain's, so they include everything the
trainer does per step. Reported: median step time over all rounds, its spread (half the
interquartile range), and the median of the per-round ratios to the plain run.

    python benchmarks/callback_overhead.py [--steps 60] [--rounds 5] [--threads 1] [--record]
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

import benchlib as bl
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

VARIANTS: dict[str, dict[str, Any] | None] = {
    "plain": None, "default (every=50)": {"every": 50},
    "watch_every_step=True": {"every": 50, "watch_every_step": True},
    "every=1, watch_every_step=True": {"every": 1, "watch_every_step": True}}


def _bert(hidden: int, seed: int = 0) -> Any:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=1000, hidden_size=hidden, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=4 * hidden,
                        max_position_embeddings=64, num_labels=2)
    return BertForSequenceClassification(config)


def _data(n: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randint(1, 1000, (n, length), generator=g), torch.randint(0, 2, (n,),
                                                                         generator=g)


def run_hf(options: dict[str, Any] | None, args: argparse.Namespace, out: str) -> list[float]:
    import transformers

    from amptrain.integrations.hf import DiagnoseCallback

    starts: list[float] = []

    class Clock(transformers.TrainerCallback):
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            starts.append(time.perf_counter())

        def on_train_end(self, *a: Any, **k: Any) -> None:
            starts.append(time.perf_counter())

    ids, labels = _data(args.batch_size * args.steps, args.length)

    class Rows(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(ids)

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"input_ids": ids[i], "labels": labels[i]}

    callbacks: list[Any] = [Clock()]
    if options is not None:
        callbacks.append(DiagnoseCallback(verbose=False, **options))
    targs = transformers.TrainingArguments(
        output_dir=out, max_steps=args.steps, per_device_train_batch_size=args.batch_size,
        use_cpu=True, report_to=[], logging_steps=10, save_strategy="no", disable_tqdm=True,
        dataloader_num_workers=0, seed=0)
    trainer = transformers.Trainer(model=_bert(args.hidden), args=targs, train_dataset=Rows(),
                                   callbacks=callbacks)
    transformers.utils.logging.set_verbosity_error()
    trainer.train()
    return [b - a for a, b in zip(starts, starts[1:])][args.warmup:]


def run_lightning(options: dict[str, Any] | None, args: argparse.Namespace,
                  out: str) -> list[float]:
    import lightning as L

    from amptrain.integrations.lightning import DiagnoseCallback

    starts: list[float] = []

    class Clock(L.Callback):
        def on_train_batch_start(self, *a: Any) -> None:
            starts.append(time.perf_counter())

        def on_train_end(self, *a: Any) -> None:
            starts.append(time.perf_counter())

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _bert(args.hidden)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return self.net(input_ids=x, labels=y).loss

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=5e-5)

    ids, labels = _data(args.batch_size * args.steps, args.length)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids, labels),
                                         batch_size=args.batch_size)
    callbacks: list[Any] = [Clock()]
    if options is not None:
        callbacks.append(DiagnoseCallback(verbose=False, **options))
    trainer = L.Trainer(max_steps=args.steps, accelerator="cpu", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, log_every_n_steps=10,
                        callbacks=callbacks, default_root_dir=out)
    trainer.fit(Module(), loader)
    return [b - a for a, b in zip(starts, starts[1:])][args.warmup:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--trainers", default="hf,lightning")
    bl.add_common_args(parser)
    args = parser.parse_args()
    bl.apply_threads(args.threads)
    import logging

    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    m = bl.machine()
    runners = {"hf": run_hf, "lightning": run_lightning}
    rows = []
    versions = {}
    for name in args.trainers.split(","):
        mod = __import__("transformers" if name == "hf" else "lightning")
        versions[name] = f"{mod.__name__} {mod.__version__}"
        times: dict[str, list[float]] = {v: [] for v in VARIANTS}
        medians: dict[str, list[float]] = {v: [] for v in VARIANTS}
        with tempfile.TemporaryDirectory() as out:
            for _ in range(args.rounds):
                for variant, options in VARIANTS.items():
                    steps = runners[name](options, args, out)
                    times[variant] += steps
                    medians[variant].append(statistics.median(steps))
        base = statistics.median(times["plain"])
        for variant in VARIANTS:
            ratios = bl.pair_ratios(medians[variant], medians["plain"])
            median = statistics.median(times[variant])
            rows.append([versions[name], variant, f"{median * 1e3:.2f} ms",
                         bl.spread(times[variant]),
                         f"{(median - base) * 1e3:+.2f} ms",
                         f"{statistics.median(ratios):.3f}x ({bl.span(ratios)})"])
    table = bl.markdown_table(["trainer", "callback", "step (median)", "spread",
                               "cost per step", "ratio to plain, per round"], rows)
    bl.report("Cost of DiagnoseCallback per step (issue 27)", m, table, notes=[
        f"BERT classifier, hidden {args.hidden}, 2 layers, batch {args.batch_size} x "
        f"{args.length} tokens, fp32 on the CPU; {args.steps} steps per run, "
        f"{args.warmup} warm-up steps excluded, {args.rounds} interleaved rounds."],
        record=args.record)


if __name__ == "__main__":
    main()
