"""``amptrain.diagnose_model``: the diagnosis ``amptrain diagnose`` makes, for one's own
model and data in a Python session -- no ``module:`` factories to write first (issue 49:
an own loop's halt pointed at a command its user could not run on that model)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from ..common import outdir
from ..common.forward import LossFn
from ..config import TrainConfig
from ..tasks import Task
from .run import diagnose
from .writer import summary_lines, write_reports


@dataclass
class _OwnData:
    """The caller's training data where :func:`diagnose` reads a bundle's ``train``."""

    train: Any


def diagnose_model(model: nn.Module, train_data: Any, *, steps: int = 20,
                   loss_fn: LossFn | None = None, task: Task | None = None,
                   out: str | Path | None = None, quiet: bool = False,
                   **options: Any) -> dict[str, Any]:
    """Diagnose ``model`` on ``train_data``: which modules overflow or underflow in fp16,
    where inf/NaN first appears, and what to keep in fp32 -- the report (a JSON-ready
    dict) of ``amptrain diagnose``, whose fields docs/diagnose-env.md describes.

    ``train_data`` is what :meth:`amptrain.Trainer.fit` takes (a Dataset, a DataLoader,
    a list of ``(inputs, targets)`` batches); ``loss_fn(outputs, targets)`` and ``task``
    as there. ``options`` are the Trainer's options (``batch_size``, ``lr``,
    ``optimizer``, ``keep_fp32``, ``init_scale``, ``device``...): every one of the
    ``steps``-step runs (32-true with range statistics, 16-mixed as given, 16-mixed with
    the advice applied, bf16-mixed) trains with them from the same initial weights;
    ``model`` itself is not trained. With ``out`` the reports diagnose.json and
    diagnose.md are written there; unless ``quiet`` the summary is printed.
    """
    config = TrainConfig().with_given_options(**{"no_progress": True, **options})
    if out is not None:
        outdir.claim(str(out), outdir.DIAGNOSE_OUTPUTS)  # refused before the runs
    report = diagnose(config, steps, data=_OwnData(train_data),  # type: ignore[arg-type]
                      model=model, task=task, loss_fn=loss_fn)
    if not quiet:
        print("\n".join(summary_lines(report)))
    if out is not None:
        json_path, md_path = write_reports(report, str(out))
        if not quiet:
            print(f"reports: {json_path}, {md_path}")
    return report
