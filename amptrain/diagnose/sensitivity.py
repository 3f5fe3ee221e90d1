"""How sensitive each Linear layer is to one low-bit format: the ranking ``amptrain plan``
searches along.

One short 32-true run (``steps`` steps, diagnose's :func:`~.run.run_steps`) records, per
eligible layer (a plain ``nn.Linear`` whose dimensions fit the format, the first and last
included), what the format would lose:

* **flush and saturation** of its input, weight and output gradient under the format's own
  scaling, an MX format's block scales chosen by ``--mx-scale`` as the candidates' are
  (diagnose's :class:`~.ranges.LowBitRecorder`);
* **SNR** of its forward operands: ``10 log10(|x|^2 / |x - q(x)|^2)`` of the input and
  the weight quantised as the format does, the worse of the two;
* **loss sensitivity** (after the run): the relative change of the loss of the first
  training batch when only this layer's forward is quantised (fp32 otherwise, no
  gradient): a cheap probe of how much the model's output depends on that layer's
  precision.

:attr:`LayerSensitivity.score` adds the three dimensionless numbers (loss change, lost
share, noise power); the ranking puts the layer with the least score per matmul FLOP
first (big, insensitive layers first: they buy the most FLOPs for the least risk).

The loss probe outranks the score where it stands out: a layer whose loss change exceeds
:data:`LOSS_OUTLIER` times the layers' median ``|loss change|`` (one batch's probe: most
layers' changes are its noise) goes after every other layer, whatever its score. Its flush
and noise terms, alike for every layer under one format, would otherwise hide it (the
README's gpt: the head's probe 50x the median, ranked seventh by score).
"""
from __future__ import annotations

import copy
import math
import statistics
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable

import torch
from torch import nn

from ..common.forward import LossFn, fp32_window_loss
from ..config import TrainConfig
from ..data import DataBundle
from ..precision.fp8 import plan_float8
from ..precision.islands import ForwardPatches
from ..precision.lowbit import RECIPES, Recipe, format_recipe, lowbit_linear
from ..tasks import Task
from ..trainer import Trainer
from .ranges import LowBitRecorder
from .run import run_steps


@dataclass
class LayerSensitivity:
    """What one layer loses in the format, and its weight in the model's matmul FLOPs."""

    name: str
    #: Multiply-adds per token (``in x out``).
    flops: int
    #: The largest share of an operand's values flushed to zero / saturated.
    flushed: float
    saturated: float
    #: The worse forward operand's signal-to-noise ratio in dB (inf: exact).
    snr_db: float
    #: Relative change of the first batch's loss with only this layer quantised
    #: (None where the task has no batches of samples: ppo).
    loss_delta: float | None
    #: Whether the loss probe stands out above the other layers' (set by :func:`by_cost`):
    #: the layer is ranked after every layer whose probe does not.
    loss_outlier: bool = False

    @property
    def score(self) -> float:
        """Loss change + lost share + relative noise power: higher is more sensitive."""
        noise = 0.0 if math.isinf(self.snr_db) else 10 ** (-self.snr_db / 10)
        return max(self.loss_delta or 0.0, 0.0) + self.flushed + self.saturated + noise

    @property
    def score_per_flop(self) -> float:
        """:attr:`score` per matmul FLOP: the ranking's key. The plan maximises the FLOPs in
        the format for a bounded loss of accuracy, a knapsack whose greedy order is cost
        per gain: a big, insensitive layer comes before a small one equally sensitive."""
        return self.score / self.flops if self.flops else math.inf

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the score included; an infinite SNR as null)."""
        data = asdict(self)
        data["snr_db"] = None if math.isinf(self.snr_db) else round(self.snr_db, 2)
        data["score"] = self.score
        return data


def eligible_layers(model: nn.Module, fmt: str) -> list[str]:
    """The Linear layers that can run in ``fmt``: plain ``nn.Linear`` with both dimensions
    multiples of the format's block, the first and the last included."""
    return plan_float8(model, skip_first_last=False,
                       dim_multiple=RECIPES[fmt].dim_multiple).convert


class _Probe:
    """Hooks of the ranking run: diagnose's low-bit counts, the forward operands' SNR, and
    (at :meth:`remove`, after the run) the loss probe."""

    def __init__(self, trainer: Trainer, layers: list[str], fmt: str,
                 mx_scale: str = "floor") -> None:
        assert trainer.model is not None  # attached after setup()
        self.trainer, self.layers = trainer, layers
        # the candidates' numerics: a plan's layer in fmt, its MX scales by --mx-scale
        self.recipe = format_recipe(fmt, mx_scale)
        self.counts = LowBitRecorder(trainer.model, formats=(fmt,), layers=layers,
                                     mx_scale=mx_scale)
        modules = dict(trainer.model.named_modules())
        # per layer: [signal, noise] of the input and of the weight, summed on the device
        self.power: dict[str, torch.Tensor] = {}
        self._handles = [modules[n].register_forward_hook(self._hook(n)) for n in layers]
        self.loss_delta: dict[str, float | None] = {}

    def _hook(self, name: str) -> Callable:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            with torch.no_grad():
                x = args[0].detach().float().reshape(-1, args[0].shape[-1])
                w = module.get_parameter("weight").detach().float()
                qx, qw = self.recipe.input(x, -1), self.recipe.weight(w, -1)
                power = torch.stack([x.square().sum(), (x - qx).square().sum(),
                                     w.square().sum(), (w - qw).square().sum()])
                self.power[name] = self.power[name] + power if name in self.power else power
        return hook

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.counts.remove()
        self.loss_delta = loss_probe(self.trainer, self.layers, self.recipe)

    def read(self, flops: dict[str, int]) -> list[LayerSensitivity]:
        shares = self.counts.read()
        fmt = self.recipe.name
        powers = {n: p.tolist() for n, p in self.power.items()}
        out = []
        for name in self.layers:
            operands = shares.get(name, {}).get(fmt, {})
            sx, nx, sw, nw = powers.get(name, [0.0, 0.0, 0.0, 0.0])
            out.append(LayerSensitivity(
                name=name, flops=flops[name],
                flushed=max((s["flushed"] for s in operands.values()), default=0.0),
                saturated=max((s["saturated"] for s in operands.values()), default=0.0),
                snr_db=min(_snr(sx, nx), _snr(sw, nw)), loss_delta=self.loss_delta.get(name)))
        return out


def _snr(signal: float, noise: float) -> float:
    if noise <= 0:
        return math.inf
    return 10 * math.log10(signal / noise) if signal > 0 else -math.inf


def loss_probe(trainer: Trainer, layers: list[str], recipe: Recipe) -> dict[str, float | None]:
    """Each layer's relative change of the first training batch's loss when only its
    forward runs in ``recipe`` (fp32 otherwise, autocast off, no gradient); None for
    every layer where the task trains on no batches of samples."""
    model, windows, loss_fn = trainer.model, trainer.train_windows, trainer.loss_fn
    if model is None or windows is None or loss_fn is None or (
            trainer.task is not None and not trainer.task.iteration.batches_are_samples):
        return {name: None for name in layers}
    window = next(iter(windows.epoch(0, 0)), None)
    if window is None:
        return {name: None for name in layers}
    modules = dict(model.named_modules())

    def loss() -> float:
        return fp32_window_loss(model, window, loss_fn, trainer.device)

    was_training = model.training
    model.eval()   # dropout off: the change is the format's, not a new dropout draw
    try:
        reference = loss()
        deltas: dict[str, float | None] = {}
        for name in layers:
            patches = ForwardPatches()
            module = modules[name]

            def make_forward(original: Callable, module: nn.Module = module,
                             name: str = name) -> Callable:
                def forward(x: torch.Tensor) -> torch.Tensor:
                    return lowbit_linear(x, module.get_parameter("weight"),
                                         getattr(module, "bias", None), recipe, name=name)
                return forward
            patches.wrap(module, make_forward)
            try:
                changed = loss()
            finally:
                patches.remove()
            deltas[name] = (changed - reference) / abs(reference) if reference \
                and math.isfinite(changed) else (math.inf if not math.isfinite(changed)
                                                  else None)
    finally:
        model.train(was_training)
    return deltas


def rank_layers(config: TrainConfig, data: DataBundle, model: nn.Module, fmt: str,
                steps: int, *, task: Task | None = None,
                loss_fn: LossFn | None = None) -> list[LayerSensitivity]:
    """The eligible layers of ``model`` in ``fmt``, least sensitive first (``model`` is
    not trained: the run trains a copy). Measured as the candidates will train:
    ``config``'s ``--mx-scale`` chooses an MX format's block scales."""
    layers = eligible_layers(model, fmt)
    flops = {n: m.in_features * m.out_features for n, m in model.named_modules()
             if n in layers and isinstance(m, nn.Linear)}
    if not layers:
        return []
    mx_scale = config.precision.mx_scale
    # a 32-true run (run_steps runs it at the low-bit defaults: it reads none of them);
    # the probe measures the format with the candidates' --mx-scale
    _, probe = run_steps(config, data, copy.deepcopy(model), steps, "32-true",
                         attach=lambda trainer: _Probe(trainer, layers, fmt, mx_scale),
                         task=task, loss_fn=loss_fn)
    return by_cost(probe.read(flops))


#: A loss probe this many times the layers' median ``|loss change|`` stands out of their
#: noise (the gpt's body layers: 0.8e-4 to 3e-4, its head 5.8e-3).
LOSS_OUTLIER = 10.0


def loss_noise(layers: list[LayerSensitivity]) -> float | None:
    """The layers' median ``|loss_delta|`` (finite probes only; None without any): the
    level a single batch's probe reaches for a layer the format barely touches."""
    deltas = [abs(s.loss_delta) for s in layers
              if s.loss_delta is not None and math.isfinite(s.loss_delta)]
    return statistics.median(deltas) if deltas else None


def by_cost(ranked: list[LayerSensitivity]) -> list[LayerSensitivity]:
    """``ranked`` by :attr:`~LayerSensitivity.score_per_flop`, least first (ties: the
    model's order), the layers whose loss probe exceeds :data:`LOSS_OUTLIER` times
    :func:`loss_noise` last (marked :attr:`~LayerSensitivity.loss_outlier`; among
    themselves by score per FLOP too)."""
    noise = loss_noise(ranked)
    marked = [replace(s, loss_outlier=noise is not None and s.loss_delta is not None
                      and s.loss_delta > LOSS_OUTLIER * noise) for s in ranked]
    return [s for _, s in sorted(enumerate(marked), key=lambda item: (
        item[1].loss_outlier, item[1].score_per_flop, item[0]))]
