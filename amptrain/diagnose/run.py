"""The diagnosis runs through the Trainer, and :func:`diagnose`, which builds the report.

Four short runs of the same steps from the same initial weights and data:

1. ``32-true`` with a :class:`~.ranges.RangeRecorder` on every module;
2. ``16-mixed`` as the user would train it: the first module whose output or output
   gradient held inf/NaN, and at which step;
3. ``16-mixed`` with the recommendations applied (``keep_fp32`` + initial loss scale):
   does it train without non-finite steps?
4. ``bf16-mixed``: does bf16 avoid the problem?
"""
from __future__ import annotations

import copy
import dataclasses
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..config import RunConfig, TrainConfig, replace_options
from ..data import DataBundle
from ..precision.hardware.devices import resolve_device
from ..common.errors import AmptrainWarning, UserError, flag, warn
from ..common.forward import LossFn
from ..precision import NonFiniteHalt, Precision
from ..precision.lowbit import ABLATED, RECIPES, format_recipe
from ..precision.lowbit_settings import settings_read, unread_of, warn_unread_settings
from ..precision.outcome import diagnosing
from ..precision.resolve import resolve_precision
from ..precision.hardware.advice import emulation_warning, range_safe_choice
from ..precision.hardware.support import device_features, supported_precisions
from ..precision.nonfinite import NonFiniteEvent, NonFiniteWatch
from ..workflows.runner import assemble
from ..tasks import Task
from ..trainer import Trainer
from ..trainer.inapplicable import for_mode
from .ranges import (FORMATS, FP16, FP16_MAX, SAMPLE_LIMIT, RangeRecorder, counted,
                     fractions)
from .recommend import (
    _bf16_verdict,
    _casts_inputs_to_half,
    _flags,
    _in_island,
    lowbit_advice,
    attention_overflow,
    keep_fp32_candidates,
    module_risks,
    recommend_loss_scale,
    run_scale_overflow,
)


@dataclass
class RunSummary:
    """One short training run: how many steps were skipped, where inf/NaN first appeared."""

    precision: str
    steps: int
    skipped_steps: int
    first_nonfinite: NonFiniteEvent | None
    halted: str | None
    keep_fp32: list[str]
    init_scale: float | None
    #: Optimizers stepped per training step (a GAN's 2): ``skipped_steps`` counts each
    #: part's skipped optimizer steps, out of ``steps * parts``.
    parts: int = 1

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["first_nonfinite"] = dataclasses.asdict(self.first_nonfinite) \
            if self.first_nonfinite else None
        return data


def run_steps(config: TrainConfig, data: DataBundle, model: nn.Module, steps: int,
              precision: str, attach: Callable[[Trainer], Any] | None = None,
              task: Task | None = None, loss_fn: LossFn | None = None,
              **overrides: Any) -> tuple[RunSummary, Any]:
    """Train ``model`` for ``steps`` steps with the Trainer; returns (summary, attached).

    ``task`` (default: the one the data says) owns the training step: a GAN's runs are its
    own D and G steps. ``attach(trainer)`` installs hooks on the prepared model and
    returns an object with ``remove()``. Nothing is written to disk; a run that halts on
    non-finite values is reported, not raised. The first non-finite event names its
    module, the part holding it and the ``loss_id`` of its loss.
    """
    # --max-steps alone sets the length (epochs as many as the steps need); the progress
    # shown is the config's (--no-progress: plain lines instead of bars).
    # Each run takes only the options its precision reads (--mx-scale, --init-scale...,
    # for_mode): the fixed runs do not warn that they do nothing there (diagnose warns
    # once, _warn_unread).
    spec = resolve_precision(precision, resolve_device(config.device)).spec
    options = dict(precision=precision, max_steps=steps, epochs=None, out=None,
                   log_every=steps, eval_every=None, save_every=None,
                   resume=None, compile=False, **overrides)
    trainer = Trainer(for_mode(replace_options(config, **options), spec))
    with warnings.catch_warnings():
        # diagnose runs 16-mixed and bf16-mixed on purpose, to study their numerics; the
        # report says once whether this device only emulates them (device_note, bf16 verdict)
        warnings.filterwarnings("ignore", r".* is emulated on this", AmptrainWarning)
        trainer.setup(model, data.train, task=task, loss_fn=loss_fn)
    assert trainer.model is not None  # set by setup()
    watch = NonFiniteWatch(trainer.model, lambda: trainer.step,
                           lambda: trainer.precision.loss_scale_tensor,
                           lambda: trainer.precision.backward_loss_id)
    attached = attach(trainer) if attach is not None else None
    halted = None
    try:
        with diagnosing():  # its halt must not send the user to run diagnose
            trainer.run()
    except NonFiniteHalt as exc:
        halted = str(exc)
    finally:
        watch.remove()
        if attached is not None:
            attached.remove()
    c = trainer.config
    summary = RunSummary(precision=trainer.precision.name, steps=trainer.step,
                         skipped_steps=trainer.precision.skipped_steps,
                         first_nonfinite=_with_part(watch.first(), trainer), halted=halted,
                         keep_fp32=list(c.precision.keep_fp32),
                         init_scale=(c.precision.init_scale
                                     if trainer.precision.spec.loss_scaling else None),
                         parts=len(trainer.parts))
    return summary, attached


def _warn_unread(config: TrainConfig, asked: str) -> None:
    """One warning per low-bit setting given that nothing in the diagnosis reads: the
    low-bit report reads ``--mx-scale`` and ``--nvfp4-without``; the run of
    ``--precision`` (where one is asked for) reads what its mode reads. A part of nvfp4's
    recipe left out that the report's counts cannot show (:func:`.ranges.counted`: ``sr``,
    ``rht``) is warned about too, naming that value."""
    # what the run of --precision reads, where it is not one of diagnose's own runs
    asked_read = settings_read(resolve_precision(asked, resolve_device(config.device)).spec) \
        if asked not in DIAGNOSED else frozenset()
    read = {"mx_scale", "nvfp4_without", *asked_read}
    runs = [*DIAGNOSED[1:], *([asked] if asked not in DIAGNOSED else [])]
    where = f"diagnose's runs ({', '.join(runs)}) and its low-bit report"
    warn_unread_settings(unread_of(config.precision, read), where)
    without = config.precision.nvfp4_without
    ablated = format_recipe(ABLATED, without=without)
    if without == "none" or counted(ablated) != counted(RECIPES[ABLATED]):
        return
    # the report counts it as the whole recipe; the asked run (nvfp4) may still train so
    asked_reads = "nvfp4_without" in asked_read
    why = (f"the report counts the forward GEMM's input and weight and the grad-input "
           f"GEMM's gradient, rounded to nearest, which {ablated.name} quantises as "
           f"{ABLATED} does")
    warn(f"{flag('nvfp4_without')} {without} changes the {asked} run only, not diagnose's "
         f"low-bit report: {why}" if asked_reads else
         f"{flag('nvfp4_without')} {without} does nothing in {where}: {why}")


def part_of(trainer: Trainer, label: str) -> str | None:
    """The part (its name in ``Task.models``) holding the module the watch labelled
    ``label`` (a qualified name in ``trainer.model``, or the root's class name)."""
    assert trainer.model is not None
    modules = dict(trainer.model.named_modules())
    module = modules.get(label, trainer.model if label == type(trainer.model).__name__
                         else None)
    if module is None:
        return None
    for name, part in trainer.parts.items():
        if any(m is module for m in part.module.modules()):
            return name
    return None  # the root of several parts (the whole model)


def _with_part(event: NonFiniteEvent | None, trainer: Trainer) -> NonFiniteEvent | None:
    return None if event is None else dataclasses.replace(event,
                                                          part=part_of(trainer, event.module))


def loss_name(task: Task | None, loss_id: int | None) -> str | None:
    """A loss's name by its ``loss_id``: the task's ``loss_names`` (a GAN's ``d_loss``,
    ``g_loss``), else ``loss`` for a one-loss task's ``loss_id`` 0."""
    if loss_id is None:
        return None
    names = (task or Task).diagnosis.loss_names
    return names.get(loss_id, f"loss {loss_id}")


#: The precisions every diagnosis runs (``auto``: none asked for); ``--precision`` naming
#: another (``plan:FILE``, ``fp8``, ``mxfp4``...) adds a run of it to the report.
DIAGNOSED = ("auto", "32-true", "16-mixed", "bf16-mixed")

#: The most steps per diagnosis run: overflow shows within tens of steps, and a mistyped
#: count would run silently until killed.
MAX_STEPS = 10_000


def diagnose(config: TrainConfig, steps: int = 20, *, data: DataBundle | None = None,
             model: nn.Module | None = None, task: Task | None = None,
             loss_fn: LossFn | None = None) -> dict[str, Any]:
    """Run the four diagnosis runs and build the report (a JSON-ready dict).

    ``config`` (a :class:`RunConfig`) names the model and data, built with
    :func:`~amptrain.workflows.runner.assemble` (with the task the model or data picks), unless
    ``data`` and ``model`` are given (then a plain :class:`TrainConfig` will do, and
    ``task`` picks the training step: default, the data's; ``loss_fn`` the loss, as in
    ``Trainer.fit``). Its training options (batch size, lr, seed, scaler settings,
    keep_fp32...) apply to every run. One's own model and data:
    :func:`amptrain.diagnose_model`.
    """
    if steps < 1:
        raise UserError(f"--steps must be an integer >= 1 (got {steps})")
    if steps > MAX_STEPS:  # four runs of it, with every module's ranges recorded
        raise UserError(f"--steps {steps} is over the limit of {MAX_STEPS} (a diagnosis "
                        f"needs tens of steps; it records every module's ranges)")
    if data is None or model is None:
        if not isinstance(config, RunConfig):
            raise UserError("diagnose needs a model and data, or a RunConfig naming them")
        run = assemble(config)
        # run.config: with what the task decides (PPO's minibatch from its rollout).
        config, data, model, task = run.config, run.data, run.model, run.task
    initial = copy.deepcopy(model)
    asked = config.precision.name
    if asked not in DIAGNOSED:   # a wrong plan file or format fails before the runs
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", AmptrainWarning)
            Precision(asked, device=resolve_device(config.device))
    _warn_unread(config, asked)

    def record_ranges(trainer: Trainer) -> RangeRecorder:
        assert trainer.model is not None  # attached after setup()
        # the low-bit report measures the MX formats with the scales --mx-scale chooses,
        # nvfp4 without the part --nvfp4-without leaves out
        return RangeRecorder(trainer.model, lowbit=True, mx_scale=config.precision.mx_scale,
                             without=config.precision.nvfp4_without)

    stats_run, recorder = run_steps(config, data, copy.deepcopy(initial), steps, "32-true",
                                    attach=record_ranges, task=task, loss_fn=loss_fn)
    stats = recorder.read()
    device = resolve_device(config.device)
    fp16_run, _ = run_steps(config, data, copy.deepcopy(initial), steps, "16-mixed",
                            task=task, loss_fn=loss_fn)
    first = fp16_run.first_nonfinite

    modules = {(n or type(m).__name__): m for n, m in initial.named_modules()}
    root = type(initial).__name__  # how the hooks label the model itself
    keep = keep_fp32_candidates(stats, modules, root, first, config.precision.keep_fp32)
    islands = list(dict.fromkeys(list(config.precision.keep_fp32)
                                 + [k["pattern"] for k in keep]))
    scale = recommend_loss_scale(stats, islands, config.precision.init_scale)
    # Steps the 16-mixed run skipped with no non-finite module output: the scaled backward
    # overflowed (a weight gradient's matmul); named at its modules and their loss.
    unexplained = first is None and fp16_run.skipped_steps > 0
    overflow = run_scale_overflow(stats, list(config.precision.keep_fp32),
                                  config.precision.init_scale,
                                  task.diagnosis.loss_paths() if task is not None else None
                                  ) if unexplained else []

    verify_options: dict[str, Any] = {"keep_fp32": islands, "init_scale": scale["init_scale"]}
    if scale["init_scale"] < config.precision.min_scale:
        verify_options["min_scale"] = scale["init_scale"]
    try:
        verified, _ = run_steps(config, data, copy.deepcopy(initial), steps, "16-mixed",
                                task=task, loss_fn=loss_fn, **verify_options)
    except UserError as exc:
        # The precision matches --keep-fp32 within each part of a several-part model (a
        # GAN's discriminator, generator): a whole-model name cannot be checked there.
        verified = RunSummary("16-mixed", 0, 0, None, f"could not be checked: {exc}",
                              list(islands), scale["init_scale"])
    # The loss paths the overflow lies on, kept in fp32 at the run's own scale: checked.
    paths = list(dict.fromkeys(o["path"] for o in overflow if o["path"]))
    path_check = None
    if paths:
        kept, _ = run_steps(config, data, copy.deepcopy(initial), steps, "16-mixed",
                            task=task, loss_fn=loss_fn,
                            keep_fp32=list(config.precision.keep_fp32) + paths)
        path_check = {"keep_fp32": paths, "skipped_steps": kept.skipped_steps,
                      "steps": kept.steps}
    bf16_run = None
    supported = _supported_here(device)
    if supported["bf16-mixed"] or device.type == "cpu":
        bf16_run, _ = run_steps(config, data, copy.deepcopy(initial), steps, "bf16-mixed",
                                task=task, loss_fn=loss_fn)

    # --precision (a plan, fp8, an MX format...): its own run next to the fixed ones.
    asked_run = None
    if asked not in DIAGNOSED:
        asked_run, _ = run_steps(config, data, copy.deepcopy(initial), steps, asked,
                                 task=task, loss_fn=loss_fn)

    for name, s in stats.items():
        island = _in_island(name, islands)
        casts = name in modules and _casts_inputs_to_half(modules[name])
        s["fp32_with_recommendations"] = island
        s["risk"], s["reasons"] = module_risks(name, s, first, scale["log2"], island, casts,
                                               _in_island(name, list(config.precision.keep_fp32)))
        over_here = [o for o in overflow if o["module"] == name]  # largest first
        s["risk"] += sum(30 + math.log2(o["scaled"] / FP16_MAX) for o in over_here)
        s["reasons"][:0] = [f"{o['kind']} x the loss scale {config.precision.init_scale:g} "
                            f"reach {o['scaled']:.3g} > fp16 max"
                            + (f" ({o['loss'].split(' (')[0]})" if o["loss"] else "")
                            for o in over_here]
        if s["gradient"] is not None and scale["log2"] is not None:
            s["gradient"]["fp16_at_recommended_scale"] = fractions(
                s["_hist"]["gradient"], FP16, scale["log2"])
        if s["param_gradient"] is not None and scale["log2"] is not None:
            s["param_gradient"]["fp16_at_recommended_scale"] = fractions(
                s["_hist"]["param_gradient"], FP16, scale["log2"])

    report: dict[str, Any] = {
        "model": getattr(config, "model", type(initial).__name__),
        "data": getattr(config, "data", None), "root": root, "steps": steps,
        "batch_size": config.batching.batch_size, "seed": config.seed, "device": str(device),
        "sample_limit": SAMPLE_LIMIT,
        "formats": {f.name: {"max": f.max, "min_normal": f.min_normal,
                             "flush_below": f.flush_below} for f in FORMATS},
        "first_nonfinite": ({**dataclasses.asdict(first),
                             "loss": loss_name(task, first.loss_id)} if first else None),
        "runs": {"32-true": stats_run.to_json(), "16-mixed": fp16_run.to_json(),
                 "16-mixed-recommended": verified.to_json(),
                 "bf16-mixed": bf16_run.to_json() if bf16_run else None,
                 **({asked: asked_run.to_json()} if asked_run else {})},
        "asked_precision": asked if asked_run else None,
        "recommendations": {
            "init_scale": scale["init_scale"],
            "min_scale": verify_options.get("min_scale"),
            "loss_scale": scale,
            "run_scale_overflow": {"init_scale": config.precision.init_scale,
                                   "modules": overflow, "keep_fp32_paths": path_check},
            "keep_fp32": keep,
            "bf16": _bf16_verdict(stats, first, scale, bf16_run, supported, device),
            "attention": attention_overflow(stats, first, range_safe_choice(device)),
            # the recommended flags train 16-mixed: say so where this device emulates it
            "device_note": emulation_warning("16-mixed", device),
            # how MX and nvfp4 were measured, and the names of the recipes measured
            "lowbit": {**lowbit_advice(recorder.lowbit.read() if recorder.lowbit else {},
                                       recorder.lowbit.labels if recorder.lowbit else {}),
                       "mx_scale": config.precision.mx_scale,
                       "nvfp4_without": config.precision.nvfp4_without},
        },
        "modules": {name: {k: v for k, v in s.items() if k != "_hist"}
                    for name, s in sorted(stats.items(), key=lambda kv: (
                        -kv[1]["risk"], not kv[1]["leaf"], _order(kv[1])))},
    }
    report["recommendations"]["flags"] = _flags(report["recommendations"], islands)
    report["recommendations"]["verified"] = {
        "skipped_steps": verified.skipped_steps, "steps": verified.steps,
        "parts": verified.parts, "not_checked": verified.halted if verified.steps == 0 else None,
        "first_nonfinite": report["runs"]["16-mixed-recommended"]["first_nonfinite"],
        "clean": verified.skipped_steps == 0 and verified.halted is None}
    return report


def _supported_here(device: torch.device) -> dict[str, bool]:
    return supported_precisions(device_features(device))


def _order(s: dict[str, Any]) -> int:
    return s["order"] if s["order"] is not None else 1 << 30
