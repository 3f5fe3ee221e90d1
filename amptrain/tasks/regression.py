"""Regression: float targets (one value or k values per sample), an MSE/L1/Huber loss on
standardised targets, and RMSE, MSE, MAE and R² reported in the data's own units.

The targets are standardised with the training split's mean and standard deviation
inside the task (learnt by :meth:`RegressionTask.learn_from`, kept in checkpoints), so the model
learns values of order one whatever the data's units -- which also keeps fp16 activations
and losses far from their range limits -- while every metric and prediction is converted
back to the data's units. compare judges RMSE by its relative change (``--tolerance-rel``).
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch.nn import functional as F

from ..common.choices import LOSSES
from ..common.errors import UserError, flag
from .base import (DataChecks, EvalResult, EvalSums, Metric, Metrics, Reports, Task, Verdict,
                   Wording, targets_of)


#: Below this validation R² a run's end says the model has not learnt (0 is the R² of
#: always predicting the mean).
R2_LEARNT = 0.05


class _Values(EvalSums):
    def __init__(self, task: RegressionTask, device: torch.device) -> None:
        self.task = task
        self.device = device
        self.predictions: list[torch.Tensor] = []
        self.targets: list[torch.Tensor] = []

    def update(self, outputs: torch.Tensor | None, targets: Any) -> None:
        if outputs is not None and isinstance(targets, torch.Tensor):
            target = targets.reshape(len(targets), -1).float()
            self.predictions.append(self.task.to_units(outputs).reshape(target.shape))
            self.targets.append(target)


class _FloatChecks(DataChecks):
    """Finite float targets, one output per target value."""

    def check_data(self, data: Any, keyword: str) -> None:
        targets = targets_of(data)
        if targets is None:
            return
        if not targets.is_floating_point():
            raise UserError(f"{keyword}: the targets are integer class labels "
                            f"({str(targets.dtype).replace('torch.', '')}); regression needs "
                            f"float values: use {flag('task')} classification, or give float "
                            f"targets")
        if targets.ndim > 2:
            raise UserError(f"{keyword}: regression targets must be one value or one row of "
                            f"values per sample (got shape {tuple(targets.shape)})")
        if targets.numel() and not bool(torch.isfinite(targets).all()):
            raise UserError(f"{keyword}: the regression targets contain NaN or infinite "
                            f"values; drop or fill those samples")

    def check_outputs(self, outputs: torch.Tensor | None, targets: Any, *,
                      model_name: str | None, all_targets: torch.Tensor | None) -> None:
        if outputs is None or not isinstance(targets, torch.Tensor) or not len(targets):
            return
        per_sample = targets[0].numel()
        width = outputs[0].numel() if outputs.ndim else 0
        if width != per_sample:
            which = f" ({flag('model')} {model_name})" if model_name else ""
            raise UserError(f"the model{which} returns {width} value(s) per sample, but the "
                            f"regression targets have {per_sample}: its last layer needs "
                            f"{per_sample} output(s) (float targets are trained as "
                            f"regression; class labels must be integers, or set "
                            f"{flag('task')} classification)")


class _R2Note(Wording):
    """Regression's words, and its note on a model no better than the targets' mean."""

    def learning_note(self, result: EvalResult) -> str | None:
        r2 = result.metrics.get("r2")
        if r2 is None or not math.isfinite(r2) or r2 >= R2_LEARNT:
            return None
        return (f"the model has not learnt: val R² {r2:.3f}, where predicting the targets' "
                f"mean scores 0; train longer ({flag('max_steps')} or {flag('epochs')}), "
                f"raise {flag('lr')}, or check that the inputs tell the targets")


class _RegressionReports(Reports):
    """The metrics in the data's units, the loss function and the target statistics."""

    def __init__(self, task: RegressionTask) -> None:
        self.task = task

    def report(self, result: EvalResult) -> dict[str, Any]:
        return {**result.metrics, "loss": result.loss, "loss_function": self.task.loss_name,
                "samples": result.samples, "targets_per_sample": len(self.task.target_mean or [0]),
                "target_mean": self.task.target_mean, "target_std": self.task.target_std}

    def report_text(self, result: EvalResult) -> tuple[str, str]:
        m = result.metrics
        lines = [f"regression report ({result.samples} samples, "
                 f"{len(self.task.target_mean or [0])} target(s) per sample; the data's units)", "",
                 f"  RMSE  {m['rmse']:.6g}", f"  MSE   {m['mse']:.6g}",
                 f"  MAE   {m['mae']:.6g}", f"  R2    {m['r2']:.6g}", "",
                 f"training loss: {self.task.loss_name} on standardised targets "
                 f"(validation loss {result.loss:.6g})", ""]
        return "regression_report.txt", "\n".join(lines)


class RegressionTask(Task):
    """Float targets, one output per target value; RMSE is the primary metric."""

    name = "regression"
    metrics = Metrics(Metric("rmse", "RMSE", higher_is_better=False),
                      Metric("mse", "MSE", higher_is_better=False),
                      Metric("mae", "MAE", higher_is_better=False),
                      Metric("r2", "R²", higher_is_better=True))
    verdict = Verdict(unit="rel")
    wording = _R2Note(data_holds="regression targets",
                      data_needs="regression needs float targets (npz with float y)",
                      output_noun="target values per sample")
    checks = _FloatChecks()

    def __init__(self, loss: str | None = None, target_mean: list[float] | None = None,
                 target_std: list[float] | None = None, **_: Any) -> None:
        loss = loss or "mse"
        if loss not in LOSSES:
            raise UserError(f"{flag('loss')} must be one of {', '.join(LOSSES)} (got {loss!r})")
        self.loss_name = loss
        self.target_mean = list(target_mean) if target_mean is not None else None
        self.target_std = list(target_std) if target_std is not None else None
        self.reports = _RegressionReports(self)
        self._stats: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    # ------------------------------------------------------------ standardising
    def learn_from(self, train_data: Any) -> None:
        targets = targets_of(train_data)
        if targets is None or self.target_mean is not None:
            return  # a loader's targets are unknown up front: they are taken as given
        values = targets.reshape(len(targets), -1).double()
        std = values.std(dim=0, unbiased=False) if len(values) > 1 else torch.ones(1)
        # A constant target keeps unit scale: dividing by ~0 would blow the loss up.
        std = torch.where(std > 1e-12, std, torch.ones_like(std))
        self.target_mean = values.mean(dim=0).tolist()
        self.target_std = std.expand(values.shape[1]).tolist()

    def state(self) -> dict[str, Any]:
        return {"loss": self.loss_name, "target_mean": self.target_mean,
                "target_std": self.target_std}

    def _mean_std(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        stats = self._stats.get(device)
        if stats is None:
            mean = torch.tensor(self.target_mean or [0.0], dtype=torch.float32, device=device)
            std = torch.tensor(self.target_std or [1.0], dtype=torch.float32, device=device)
            stats = self._stats[device] = (mean, std)
        return stats

    def to_units(self, outputs: torch.Tensor) -> torch.Tensor:
        """Model outputs (standardised) in the data's units, float32, one row per sample."""
        mean, std = self._mean_std(outputs.device)
        return outputs.float().reshape(len(outputs), -1) * std + mean

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        mean, std = self._mean_std(targets.device)
        target = (targets.reshape(len(targets), -1).float() - mean) / std
        prediction = outputs.float().reshape(target.shape)
        if self.loss_name == "l1":
            return F.l1_loss(prediction, target)
        if self.loss_name == "huber":
            return F.huber_loss(prediction, target)
        return F.mse_loss(prediction, target)

    # -------------------------------------------------------------- evaluation
    def start_eval(self, device: torch.device) -> EvalSums:
        return _Values(self, device)

    def finish_eval(self, sums: EvalSums, gather: Any, loss: float, samples: int) -> EvalResult:
        assert isinstance(sums, _Values)
        width = len(self.target_mean or [0.0])
        nothing = torch.empty(0, width, device=sums.device)
        pred = gather(torch.cat(sums.predictions) if sums.predictions else nothing)
        true = gather(torch.cat(sums.targets) if sums.targets else nothing)
        y_pred, y_true = pred.cpu().double().numpy(), true.cpu().double().numpy()
        metrics = regression_metrics(y_true, y_pred)
        return EvalResult(loss=loss, samples=len(y_true), metrics=metrics,
                          details={"predictions": y_pred, "targets": y_true}, task=self)


def regression_metrics(y_true: Any, y_pred: Any) -> dict[str, float]:
    """RMSE, MSE, MAE and R² (sklearn.metrics; outputs averaged uniformly)."""
    from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score

    import numpy as np

    if not len(y_true) or not np.isfinite(y_pred).all():  # sklearn refuses NaN (diverged)
        return {"rmse": math.nan, "mse": math.nan, "mae": math.nan, "r2": math.nan}
    mse = float(mean_squared_error(y_true, y_pred))
    r2 = float(r2_score(y_true, y_pred)) if len(y_true) > 1 else math.nan
    return {"rmse": math.sqrt(mse), "mse": mse, "mae": float(mean_absolute_error(y_true, y_pred)),
            "r2": r2}


__all__ = ["LOSSES", "RegressionTask", "regression_metrics"]
