"""amptrain's DiagnoseCallback in a Hugging Face Trainer and a Lightning Trainer, on the CPU.

    python examples/diagnose_callbacks.py hf DIR          # -> DIR/diagnose.md, .json
    python examples/diagnose_callbacks.py lightning DIR

The model is amptrain's ``demo-overflow`` (Linear -> Tanh -> x1e5 -> Linear head) on the
8x8 digits: its ``scale`` layer leaves fp16's range. The Hugging Face run trains in fp32
(a CPU has no fp16 GradScaler there) and says which module would overflow fp16; the
Lightning run trains in 16-mixed with a GradScaler and names the module at its first inf.
Needs ``pip install 'amptrain[hf,lightning]'``.
"""
from __future__ import annotations

import sys

import torch
from sklearn.datasets import load_digits
from torch import nn

from amptrain.models.range_demos import RangeDemo


def digits() -> torch.utils.data.TensorDataset:
    raw = load_digits()
    x = torch.tensor(raw.data, dtype=torch.float32) / 16.0
    return torch.utils.data.TensorDataset(x, torch.tensor(raw.target))


class Classifier(nn.Module):
    """RangeDemo returning a Hugging Face style {"loss", "logits"}."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = RangeDemo(64, 10, factor=1e5)

    def forward(self, x, labels=None):
        logits = self.net(x)
        return {"loss": nn.functional.cross_entropy(logits.float(), labels), "logits": logits}


def hf(out: str) -> None:
    from transformers import Trainer, TrainingArguments

    from amptrain.integrations.hf import DiagnoseCallback

    data = [{"x": x, "labels": y} for x, y in digits()]
    args = TrainingArguments(output_dir=out, max_steps=100, logging_steps=50, use_cpu=True,
                             report_to=[], save_strategy="no", disable_tqdm=True)
    trainer = Trainer(model=Classifier(), args=args, train_dataset=data,
                      callbacks=[DiagnoseCallback(every=20)])
    trainer.train()


def lightning(out: str) -> None:
    import lightning as L
    from lightning.pytorch.plugins import MixedPrecision

    from amptrain.integrations.lightning import DiagnoseCallback

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = Classifier()

        def training_step(self, batch, batch_idx):
            return self.model(*batch)["loss"]

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    scaler = torch.amp.GradScaler("cpu")  # Lightning makes one itself on a GPU
    trainer = L.Trainer(max_steps=100, accelerator="cpu", log_every_n_steps=50, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)],
                        callbacks=[DiagnoseCallback(every=20)], default_root_dir=out)
    trainer.fit(Module(), torch.utils.data.DataLoader(digits(), batch_size=32, shuffle=True))


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("hf", "lightning"):
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        raise SystemExit(2)
    {"hf": hf, "lightning": lightning}[sys.argv[1]](sys.argv[2])
