"""pytorch/examples' MNIST recipe (its Net, Adadelta at lr 1.0, StepLR(step_size=1,
gamma=0.7) stepped once per epoch, batch 64) through amptrain's Trainer and its CLI.

    python examples/mnist_trainer.py [EPOCHS] [PRECISION]        # the Trainer (14, auto)

    # the same recipe through the command line, from this directory:
    cd examples && amptrain train --model module:mnist_trainer:Net \\
        --data module:mnist_trainer:digits28 --batch-size 64 --epochs 14 \\
        --optimizer Adadelta --scheduler StepLR \\
        --scheduler-args '{"step_size": 1, "gamma": 0.7}' --out runs/mnist

No download is possible here, so the data is sklearn's bundled 8x8 digits (1,797
images), upsampled to MNIST's 28x28 and normalised with MNIST's mean and std; 80 % train,
20 % validation. The net is pytorch/examples' architecture, written out below.

What changed against pytorch/examples' main.py (its train()/test() loops, the
DataLoaders and the device handling are the Trainer's now):

    -    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    -    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    -    for epoch in range(1, args.epochs + 1):
    -        train(args, model, device, train_loader, optimizer, epoch)
    -        test(model, device, test_loader)
    -        scheduler.step()
    +    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    +    scheduler = StepLR(optimizer, step_size=1, gamma=0.7)      # stepped once per epoch
    +    Trainer(precision=..., batch_size=64, epochs=14).fit(
    +        model, train, val, optimizer=optimizer, scheduler=scheduler)

The Net returns log-probabilities and the original trains with ``F.nll_loss``; the
Trainer's classification loss (cross-entropy) of log-probabilities is the same number,
since log_softmax of log-probabilities changes nothing.
"""
from __future__ import annotations

import sys
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import TensorDataset

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


class Net(nn.Module):
    """pytorch/examples' MNIST convnet: two 3x3 convolutions, max-pool, dropout, two
    fully connected layers, log-softmax. Its constructor takes no arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


def digits28(seed: int = 0, val_fraction: float = 0.2) -> tuple[TensorDataset, TensorDataset]:
    """sklearn's digits as 1x28x28 images normalised like MNIST: (train, val)."""
    from sklearn.datasets import load_digits

    raw = load_digits()
    x = torch.tensor(raw.images, dtype=torch.float32).unsqueeze(1) / 16.0
    x = F.interpolate(x, size=(28, 28), mode="bilinear", align_corners=False)
    x = (x - MNIST_MEAN) / MNIST_STD
    y = torch.tensor(raw.target)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n_val = int(len(y) * val_fraction)
    val, train = order[:n_val], order[n_val:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[val], y[val])


def main(epochs: int = 14, precision: str = "auto", **options: Any) -> float:
    """Train the recipe with the Trainer; returns the final validation accuracy."""
    from amptrain import Trainer

    torch.manual_seed(1)  # pytorch/examples' default seed
    train, val = digits28()
    model = Net()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = StepLR(optimizer, step_size=1, gamma=0.7)  # per epoch: the first line says so
    trainer = Trainer(precision=precision, batch_size=64, epochs=epochs, seed=1, **options)
    result = trainer.fit(model, train, val, optimizer=optimizer, scheduler=scheduler)
    accuracy = float(result.val_metrics["acc"])
    print(f"validation accuracy {accuracy:.4f} after {epochs} epochs")
    return accuracy


if __name__ == "__main__":
    main(*(int(a) if i == 0 else a for i, a in enumerate(sys.argv[1:3])))
