"""The built-in ``gpt`` language model: bf16-mixed vs 32-true tokens/s through the Trainer,
and the Trainer vs a hand-written nanoGPT-style loop, per precision.

Data: the first ``--tokens`` bytes of the Python standard library's sources (every Python
install has them; sorted paths, so every run reads the same bytes), byte tokens
(vocabulary 256). The Trainer trains with ``task="lm"`` on the stream cut into
non-overlapping blocks of ``--seq-len`` (x) and the same blocks shifted by one token (y),
reshuffled every epoch; the hand-written loop is nanoGPT's ``train.py`` recipe: random
block offsets into the in-memory token tensor every step, autocast, fused AdamW with
weight decay on matrices only, the same cosine schedule, and the same reads every
``--log-every`` steps as the Trainer (mean loss, lr, gradient norm; see
:class:`benchlib.RawLoop`). Both see batch x seq_len tokens per step, so tokens/s is
batch x seq_len / step time.

Four loops run in one process -- Trainer and hand-written, each in 32-true and
bf16-mixed -- alternating after every step in a fresh random order each round
(:class:`benchlib.Relay`), so that every ratio compares steps that saw the same machine
load; a round is ``--log-every`` steps of each loop, warm-up rounds are excluded, the
ratios are medians over rounds, then over ``--repeats`` fresh repeats. Goals: bf16-mixed
/ 32-true tokens/s >= 1.6 (Trainer), Trainer / hand-written tokens/s >= 0.98.

    python benchmarks/gpt_speed.py [--model gpt] [--seq-len 128] [--batch-size 32] \
        [--rounds 10] [--repeats 3] [--threads 1] [--record]
"""
from __future__ import annotations

import argparse
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import benchlib as bl
import torch
from torch import nn
from torch.nn import functional as F

from amptrain.data import TensorData
from amptrain.models import ModelInputs, build_model
from amptrain.trainer import seed_everything

PRECISIONS = ("32-true", "bf16-mixed")


def stdlib_bytes(limit: int) -> torch.Tensor:
    """The first ``limit`` bytes of the standard library's .py files, as byte tokens."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, size = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        data = path.read_bytes()
        chunks.append(data)
        size += len(data)
        if size >= limit + 1:
            break
    return torch.frombuffer(bytearray(b"".join(chunks)[:limit + 1]), dtype=torch.uint8).long()


def blocks(tokens: torch.Tensor, seq_len: int) -> TensorData:
    """Non-overlapping blocks and their next-token targets (what ``text:`` data gives)."""
    n = (len(tokens) - 1) // seq_len
    x = tokens[:n * seq_len].view(n, seq_len)
    y = tokens[1:n * seq_len + 1].view(n, seq_len)
    return TensorData(x.clone(), y.clone())


class NanoGPTLoop(bl.RawLoop):
    """nanoGPT's loop: ``get_batch`` draws random offsets into the token stream."""

    def __init__(self, model: nn.Module, tokens: torch.Tensor, seq_len: int, **common: Any):
        super().__init__(model, blocks(tokens, seq_len), **common)
        self.tokens, self.seq_len = tokens.to(self.device), seq_len
        self.generator = torch.Generator().manual_seed(self.seed)

    def batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        t = self.seq_len
        while True:
            ix = torch.randint(len(self.tokens) - t, (self.batch_size,),
                               generator=self.generator)
            yield (torch.stack([self.tokens[i:i + t] for i in ix]),
                   torch.stack([self.tokens[i + 1:i + 1 + t] for i in ix]))

    def loss(self, outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs.flatten(0, -2), y.flatten())


def measure(spec: str, tokens: torch.Tensor, seq_len: int, batch_size: int, rounds: int,
            warmup: int, log_every: int, device: torch.device) -> dict[str, Any]:
    seed_everything(0)
    model = build_model(spec, ModelInputs(256, (seq_len,), "lm", vocab_size=256))
    data = blocks(tokens, seq_len)
    block, group = bl.turn_plan(device, log_every)
    total = (warmup + rounds) * log_every + 1
    loops: dict[str, Any] = {}
    for precision in PRECISIONS:
        common = dict(precision=precision, batch_size=batch_size, total_steps=total,
                      device=device, log_every=log_every)
        loops[f"trainer {precision}"] = bl.TrainerLoop(bl.fresh_copy(model), data, task="lm",
                                                       **common)
        loops[f"raw {precision}"] = NanoGPTLoop(bl.fresh_copy(model), tokens, seq_len,
                                                **common)
    times = {k: v[warmup:] for k, v in bl.relay(loops, block, device, group).items()}
    per_round = batch_size * seq_len * log_every
    out: dict[str, Any] = {
        "tokens_per_s": {k: per_round / bl.median(v) for k, v in times.items()},
        "bf16_speedup": bl.median(bl.pair_ratios(times["trainer 32-true"],
                                                 times["trainer bf16-mixed"])),
        "raw_bf16_speedup": bl.median(bl.pair_ratios(times["raw 32-true"],
                                                     times["raw bf16-mixed"]))}
    for precision in PRECISIONS:
        # tokens/s of the Trainer over the hand-written loop's: time raw / time Trainer.
        ratios = bl.pair_ratios(times[f"raw {precision}"], times[f"trainer {precision}"])
        out[f"vs_raw {precision}"] = bl.median(ratios)
        out[f"spread {precision}"] = bl.spread(ratios)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt", help="a gpt spec, e.g. gpt:width=256")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=1 << 20,
                        help="bytes of standard-library source to train on")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--log-every", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    bl.add_common_args(parser)
    args = parser.parse_args()
    bl.apply_threads(args.threads)
    device = torch.device(args.device)
    machine = bl.machine()
    tokens = stdlib_bytes(args.tokens)
    runs = []
    for _ in range(args.repeats):
        runs.append(measure(args.model, tokens, args.seq_len, args.batch_size, args.rounds,
                            args.warmup, args.log_every, device))
        print(_short(runs[-1]), flush=True)

    def med(key: Callable[[dict[str, Any]], float]) -> float:
        return bl.median([key(r) for r in runs])

    speedup = med(lambda r: r["bf16_speedup"])
    rows = [[p, f"{med(lambda r, p=p: r['tokens_per_s'][f'raw {p}']):,.0f}",
             f"{med(lambda r, p=p: r['tokens_per_s'][f'trainer {p}']):,.0f}",
             f"**{med(lambda r, p=p: r[f'vs_raw {p}']):.3f}**",
             bl.span([r[f"vs_raw {p}"] for r in runs]),
             "ok" if med(lambda r, p=p: r[f"vs_raw {p}"]) >= 0.98 else "MISS"]
            for p in PRECISIONS]
    table = bl.markdown_table(["precision", "hand-written tokens/s", "Trainer tokens/s",
                               "Trainer / hand-written", "repeats", ">= 0.98"], rows)
    notes = [f"bf16-mixed / 32-true tokens/s through the Trainer: **{speedup:.2f}x** "
             f"(repeats {bl.span([r['bf16_speedup'] for r in runs])}; goal >= 1.6: "
             f"{'ok' if speedup >= 1.6 else 'MISS'}); the hand-written loop's: "
             f"{med(lambda r: r['raw_bf16_speedup']):.2f}x.",
             f"Model `{args.model}` (seq_len {args.seq_len}), batch {args.batch_size}, "
             f"{len(tokens) - 1:,} bytes of the standard library's sources. The four loops "
             f"alternate after every step in a random order each round, timed by "
             f"{bl.clock_name(device)}; a round is {args.log_every} steps of each; "
             f"{args.rounds} measured rounds after {args.warmup} warm-up; {args.repeats} "
             f"repeats with fresh models. Ratios: median over repeats of the median over "
             f"rounds."]
    bl.report(f"gpt tokens/s: bf16-mixed vs 32-true, Trainer vs nanoGPT loop "
              f"({args.model})", machine, table, notes, record=args.record)


def _short(run: dict[str, Any]) -> str:
    tps = ", ".join(f"{k} {v:,.0f}" for k, v in run["tokens_per_s"].items())
    return (f"tokens/s: {tps}; bf16 speedup {run['bf16_speedup']:.2f}x; Trainer/raw "
            + ", ".join(f"{p} {run[f'vs_raw {p}']:.3f}" for p in PRECISIONS))


if __name__ == "__main__":
    main()
