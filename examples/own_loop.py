"""Your own training loop with amptrain's precision layer (the library API of docs/design.md).

    python examples/own_loop.py [PRECISION]        # default 16-mixed

Trains a small MLP on sklearn's bundled digits with 2-step gradient accumulation and
clipping, then prints the loss, the loss scale and how many steps were skipped. Swap in
your own model, data and loop: only the lines marked `prec.` are amptrain's.
"""
from __future__ import annotations

import sys

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from amptrain import Precision


def main(precision: str = "16-mixed") -> None:
    torch.manual_seed(0)
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16
    y = torch.tensor(digits.target)
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True, drop_last=True)

    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    criterion = nn.CrossEntropyLoss()
    accumulate = 2

    prec = Precision(precision, init_scale=2**10, growth_interval=50)
    model, optimizer = prec.setup(model, optimizer)  # casts / fp32 masters where the mode needs it
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=3 * len(loader) // 2)
    steps = skipped = 0
    for epoch in range(3):
        for i, (xb, yb) in enumerate(loader):
            with prec.autocast():
                loss = criterion(model(xb), yb)
            prec.backward(loss / accumulate)  # scaled for fp16
            if (i + 1) % accumulate == 0:
                prec.clip_grad_norm_(model.parameters(), 1.0)  # unscales first
                if prec.step(optimizer):  # False when the step was skipped (inf/NaN)
                    scheduler.step()  # never advance the LR on a skipped step
                    steps += 1
                else:
                    skipped += 1
                optimizer.zero_grad(set_to_none=True)
        print(f"epoch {epoch}: loss {loss.item():.4f}  loss scale {prec.loss_scale}  "
              f"steps {steps}  skipped {skipped}")
    print("scaler state for a checkpoint:", prec.state_dict())


if __name__ == "__main__":
    main(*sys.argv[1:2])
