"""nanoGPT-style training in its own loop, mixed precision by amptrain's ``Precision``.

    python examples/nanogpt/train.py [PRECISION] [ITERS]     # default bf16-mixed, 200

A character-level GPT (examples/nanogpt/model.py) on the source text of Python's own
``json`` package (bundled with Python: nothing is downloaded). ``PRECISION none`` runs
nanoGPT's original lines instead (torch.autocast and a GradScaler), for comparison: in
32-true the two give the same losses bit for bit.

The lines that change against nanoGPT's train.py (marked ``# amptrain`` below):

    -ctx = nullcontext() if device_type == 'cpu' else torch.amp.autocast(device_type, dtype=ptdtype)
    -scaler = torch.cuda.amp.GradScaler(enabled=(dtype == 'float16'))
    +prec = Precision(precision)                         # 16-mixed, bf16-mixed, 32-true...
    +model, optimizer = prec.setup(model, optimizer)
    -    with ctx:
    +    with prec.autocast():
             logits, loss = model(X, Y)
    -    scaler.scale(loss).backward()
    -    scaler.unscale_(optimizer)
    -    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    -    scaler.step(optimizer)
    -    scaler.update()
    +    prec.backward(loss)
    +    prec.clip_grad_norm_(model.parameters(), grad_clip)
    +    prec.step(optimizer)                             # skips (and says so) on inf/NaN

If training stops on non-finite steps, the error names the first module that overflowed
on the last batch; ``amptrain.diagnose_model(model, batches, loss_fn=...)`` gives the
whole report (what to keep in fp32, which loss scale).
"""
from __future__ import annotations

import contextlib
import inspect
import json
import math
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from model import GPT, GPTConfig  # noqa: E402


def corpus() -> tuple[torch.Tensor, int]:
    """Byte-level ids of the json package's source (ASCII), and the vocabulary size."""
    import json.decoder
    import json.encoder

    text = "".join(inspect.getsource(m) for m in (json, json.decoder, json.encoder))
    ids = torch.tensor([min(ord(c), 127) for c in text], dtype=torch.long)
    return ids, 128


def main(precision: str = "bf16-mixed", max_iters: int = 200, *, batch_size: int = 8,
         block_size: int = 64, eval_interval: int = 50, eval_iters: int = 5,
         learning_rate: float = 3e-3, grad_clip: float = 1.0, seed: int = 1337,
         config: GPTConfig | None = None) -> dict[str, Any]:
    torch.manual_seed(seed)
    data, vocab = corpus()
    n = int(0.9 * len(data))
    splits = {"train": data[:n], "val": data[n:]}

    def get_batch(split: str) -> tuple[torch.Tensor, torch.Tensor]:
        d = splits[split]
        ix = torch.randint(len(d) - block_size, (batch_size,))
        x = torch.stack([d[i:i + block_size] for i in ix])
        y = torch.stack([d[i + 1:i + 1 + block_size] for i in ix])
        return x, y

    model = GPT(config or GPTConfig(block_size=block_size, vocab_size=vocab))
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, betas=(0.9, 0.95),
                                  weight_decay=0.1)
    if precision == "none":  # nanoGPT's own lines
        ctx: Any = contextlib.nullcontext
        scaler = torch.amp.GradScaler("cpu", enabled=False)
    else:
        from amptrain import Precision
        prec = Precision(precision)                       # amptrain
        model, optimizer = prec.setup(model, optimizer)   # amptrain
        ctx = prec.autocast                               # amptrain

    @torch.no_grad()
    def estimate_loss() -> dict[str, float]:
        out = {}
        model.eval()
        for split in ("train", "val"):
            losses = torch.zeros(eval_iters)
            for k in range(eval_iters):
                x, y = get_batch(split)
                with ctx():
                    _, loss = model(x, y)
                losses[k] = loss.item()
            out[split] = losses.mean().item()
        model.train()
        return out

    def get_lr(it: int) -> float:  # cosine decay after a short warm-up, as nanoGPT's
        warmup = max(1, max_iters // 10)
        if it < warmup:
            return learning_rate * (it + 1) / warmup
        return learning_rate * 0.5 * (1 + math.cos(math.pi * (it - warmup) / max(1, max_iters - warmup)))

    history: dict[str, Any] = {"val": [], "train_loss": [], "skipped": 0}
    x, y = get_batch("train")
    for it in range(max_iters):
        for group in optimizer.param_groups:
            group["lr"] = get_lr(it)
        if it % eval_interval == 0 or it == max_iters - 1:
            losses = estimate_loss()
            history["val"].append(losses["val"])
            print(f"step {it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        with ctx():
            _, loss = model(x, y)
        x, y = get_batch("train")  # the next batch, while this step runs (nanoGPT's order)
        if precision == "none":
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            scaler.step(optimizer)
            scaler.update()
        else:
            prec.backward(loss)                                    # amptrain
            prec.clip_grad_norm_(model.parameters(), grad_clip)    # amptrain
            history["skipped"] += not prec.step(optimizer)         # amptrain
        optimizer.zero_grad(set_to_none=True)
        history["train_loss"].append(loss.item())
    return history


if __name__ == "__main__":
    args = sys.argv[1:]
    print(json.dumps(main(args[0] if args else "bf16-mixed",
                          int(args[1]) if len(args) > 1 else 200)["val"]))
