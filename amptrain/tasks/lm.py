"""Language modelling: next-token prediction on blocks of a token stream.

A batch is ``(x, y)``: token ids ``[B, T]`` and the same stream shifted by one token; the
model returns logits ``[B, T, vocab]``. The loss is the mean cross-entropy per token
(nats); the metrics are perplexity (``exp`` of it, the primary metric: lower is better)
and bits per byte (the loss in bits divided by the bytes a token stands for: 1 for the
built-in byte tokenizer), which compares models with different tokenizers. compare
judges perplexity by its relative change (``--tolerance-rel``).
"""
from __future__ import annotations

import math
from types import MappingProxyType
from typing import Any

import torch
from torch.nn import functional as F

from ..common.errors import UserError, flag
from .base import (DataChecks, EvalResult, EvalSums, LogKeys, Metric, Metrics, Offers, Reports,
                   Task, Verdict, Wording, targets_of)

#: Perplexity is exp(loss); beyond this loss it overflows a float and reads as inf.
_MAX_LOSS = 700.0


class _Nothing(EvalSums):
    """Perplexity needs only the mean loss, which evaluation sums already."""

    def update(self, outputs: torch.Tensor | None, targets: Any) -> None:
        return None


class _LmWording(Wording):
    """A language model's words; a resume mismatch names --seq-len or --tokenizer."""

    def resume_mismatch(self, key: str, now: Any, then: Any, *, config: dict[str, Any],
                        saved: dict[str, Any], path: str) -> str | None:
        if key == "input_shape":
            return (f"--seq-len {now[0]} differs from checkpoint {path}'s {then[0]}: its model "
                    f"reads blocks of {then[0]} tokens; resume with --seq-len {then[0]}")
        return (f"--tokenizer {config.get('tokenizer') or 'byte'} gives a vocabulary of {now} "
                f"tokens, but checkpoint {path} was trained with {then} (--tokenizer "
                f"{saved.get('tokenizer') or 'byte'}); resume with that tokenizer")


class _TokensLogged(LogKeys):
    """Training records carry ``tokens_per_s`` (samples x the blocks' tokens)."""

    speed_units = MappingProxyType({"tokens_per_s": "tokens/s"})

    def __init__(self, task: LanguageModelTask) -> None:
        self.task = task

    def throughput(self, samples_per_s: float | None) -> dict[str, float]:
        if samples_per_s is None or not self.task.seq_len:
            return {}
        return {"tokens_per_s": samples_per_s * self.task.seq_len}


class _TokenChecks(DataChecks):
    """Token blocks with next-token targets; logits per position over the vocabulary."""

    def check_data(self, data: Any, keyword: str) -> None:
        targets = targets_of(data)
        if targets is None:
            return
        inputs = data.tensors[0]
        if targets.ndim != 2 or targets.is_floating_point() or inputs.shape != targets.shape:
            what = ("float values" if targets.is_floating_point()
                    else f"targets of shape {tuple(targets.shape)}")
            raise UserError(f"{flag('task')} lm needs token sequences with next-token targets "
                            f"(text: data, or (x, y) id tensors of equal shape "
                            f"[samples, seq_len]); {keyword} has {what}")

    def check_outputs(self, outputs: torch.Tensor | None, targets: Any, *,
                      model_name: str | None, all_targets: torch.Tensor | None) -> None:
        if outputs is None or not isinstance(targets, torch.Tensor):
            return
        which = f" ({flag('model')} {model_name})" if model_name else ""
        if outputs.ndim != 3 or tuple(outputs.shape[:2]) != tuple(targets.shape):
            raise UserError(f"the model{which} returns shape {tuple(outputs.shape)} for token "
                            f"blocks of shape {tuple(targets.shape)}; a language model must "
                            f"return logits [batch, seq_len, vocab] (e.g. --model gpt)")
        bound = all_targets if all_targets is not None else targets
        if bound.numel() and int(bound.max()) >= outputs.shape[-1]:
            raise UserError(f"token id {int(bound.max())} is outside the model's "
                            f"{outputs.shape[-1]} vocabulary entries{which}")


class _LmReports(Reports):
    """The loss in nats per token, perplexity and bits per byte."""

    def __init__(self, task: LanguageModelTask) -> None:
        self.task = task

    def report(self, result: EvalResult) -> dict[str, Any]:
        tokens = result.samples * (self.task.seq_len or 0)
        return {"loss": result.loss, "loss_unit": "nats per token", **result.metrics,
                "samples": result.samples, "tokens": tokens, "seq_len": self.task.seq_len,
                "bytes_per_token": self.task.bytes_per_token}

    def report_text(self, result: EvalResult) -> tuple[str, str]:
        m = result.metrics
        seq_len = self.task.seq_len
        lines = [f"language-model report ({result.samples} blocks of {seq_len} tokens)", "",
                 f"  loss          {result.loss:.4f} nats/token",
                 f"  perplexity    {m['perplexity']:.4f}"]
        if "bits_per_byte" in m:
            lines.append(f"  bits per byte {m['bits_per_byte']:.4f}")
        return "lm_report.txt", "\n".join(lines + [""])


class LanguageModelTask(Task):
    """Next-token cross-entropy; perplexity is the primary metric."""

    name = "lm"
    metrics = Metrics(Metric("perplexity", "perplexity", higher_is_better=False),
                      Metric("bits_per_byte", "bits per byte", higher_is_better=False))
    verdict = Verdict(unit="rel")
    wording = _LmWording(data_holds="text for language modelling",
                         data_needs="language modelling needs --data text:PATH",
                         output_noun="vocabulary entries")
    checks = _TokenChecks()
    offers = Offers(generates="text")  # amptrain generate --prompt TEXT: a continuation

    def __init__(self, bytes_per_token: float | None = None, seq_len: int | None = None,
                 **_: Any) -> None:
        self.bytes_per_token = bytes_per_token
        self.seq_len = seq_len
        self.logs = _TokensLogged(self)
        self.reports = _LmReports(self)

    def learn_from(self, train_data: Any) -> None:
        targets = targets_of(train_data)
        if targets is not None and targets.ndim == 2:
            self.seq_len = int(targets.shape[1])
        elif getattr(train_data, "seq_len", None):  # blocks read from disk (tokens:, text:)
            self.seq_len = int(train_data.seq_len)
        # A fact of the text, not something learnt: evaluation on another corpus uses its own.
        self.bytes_per_token = getattr(train_data, "bytes_per_token", None) \
            or self.bytes_per_token

    def state(self) -> dict[str, Any]:
        return {"bytes_per_token": self.bytes_per_token, "seq_len": self.seq_len}

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs.flatten(0, -2), targets.flatten())

    # -------------------------------------------------------------- evaluation
    def start_eval(self, device: torch.device) -> EvalSums:
        return _Nothing()

    def finish_eval(self, sums: EvalSums, gather: Any, loss: float, samples: int) -> EvalResult:
        perplexity = math.exp(min(loss, _MAX_LOSS)) if math.isfinite(loss) else math.nan
        metrics = {"perplexity": perplexity}
        if self.bytes_per_token:
            metrics["bits_per_byte"] = loss / math.log(2) / self.bytes_per_token
        return EvalResult(loss=loss, samples=samples, metrics=metrics, task=self)


__all__ = ["LanguageModelTask"]
