"""What the trainer callbacks share: amptrain's diagnosis inside someone else's loop.

A :class:`DiagnoseSession` is attached to the model a Hugging Face or Lightning trainer
trains; the adapters (:mod:`.hf`, :mod:`.lightning`) only translate their trainer's
events into its calls:

* **every step** -- one cheap device-side check: did the step's gradients hold inf/NaN
  (a non-finite loss makes them so)? With a GradScaler that is its skip (the scale went
  down, counted as a skipped step); without one, one fused norm over the gradients before
  the optimizer step. The flags are read every ``check_every`` steps (one host sync).
* **every ``every``-th step, and every step once a check has fired** -- a
  :class:`~amptrain.precision.nonfinite.NonFiniteWatch` (one device-side min/max per module
  output and output gradient) names the module that first produced inf/NaN: its output (forward)
  or the gradient arriving at it (backward). Overflow recurs (an fp16 activation overflows
  on every step, a gradient at every scale the scaler tries again), so the module is
  named at the first recurrence when the first occurrence fell on an unwatched step;
  ``watch_every_step=True`` names it at the very first, at a cost per step (measured in
  benchmarks/RESULTS.md).
* **every ``every``-th step** -- a :class:`~amptrain.diagnose.ranges.RangeRecorder` records
  per-module activation and gradient ranges in whatever precision the run computes in
  (gradients unscaled by the loss scale), so an fp32 or bf16 run already says which
  modules would overflow fp16. Its hooks do nothing on the other steps.
* **each log step** -- the loss scale and the skipped steps, for the trainer's logs.
* **at the end or on halt** -- ``diagnose.md`` / ``diagnose.json`` (amptrain's writer and
  recommender) with keep-in-fp32, initial-scale and bf16 recommendations.
"""
from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..version import __version__
from ..audit.findings import AuditReport
from ..audit.library import make_observer
from ..audit.observer import Observer
from ..diagnose.ranges import FORMATS, FP16, SAMPLE_LIMIT, fractions
from ..diagnose.recommend import (
    _bf16_verdict,
    _casts_inputs_to_half,
    _in_island,
    attention_overflow,
    beyond_fp16,
    bf16_trouble,
    computes_in_fp16,
    keep_fp32_candidates,
    module_risks,
    recommend_loss_scale,
)
from ..diagnose.writer import finding_lines, strict_json, write_reports
from ..common.errors import UserError
from ..precision.hardware.support import device_features, supported_precisions
from ..precision.nonfinite import NonFiniteEvent
from ..config.train import numerics_period
from ..numerics.session import NumericsSession
from .sampled_hooks import GRADIENTS, GatedWatch, SampledRecorder

#: GradScaler's default initial scale (recommend_loss_scale's fallback).
DEFAULT_INIT_SCALE = 65536.0


def check_version(package: str, version: str, minimum: tuple[int, ...], what: str) -> None:
    """One line (a UserError) when ``version`` of ``package`` is older than ``minimum``."""
    parts = tuple(int(p) for p in re.findall(r"\d+", version)[:len(minimum)])
    if parts < minimum:
        need = ".".join(map(str, minimum))
        raise UserError(f"{what} needs {package}>={need} (found {package} {version}): "
                        f"pip install -U '{package}>={need}'")


@dataclasses.dataclass
class DiagnoseOptions:
    """How a callback samples and where it writes.

    Args:
        every: record module ranges on every N-th optimizer step (the first included).
        check_every: read the non-finite checks every N steps (one host sync each).
        stop_on_nonfinite: ask the trainer to stop once the module that produced the
            first non-finite value is named.
        watch_every_step: watch every module on every step (names the module at the very
            first inf/NaN; costs more per step).
        out_dir: where diagnose.md/.json go (default: the trainer's output directory),
            and numerics.jsonl, numerics.png and nonfinite.json.
        numerics: the per-layer telemetry (numerics.jsonl, numerics.png; docs/numerics.md):
            ``"auto"`` (at most 2 % of step time), ``"off"`` or every N steps.
        verbose: print the loss-scale line of each log step and the non-finite notice.
        audit: watch the loop for the traps of mixed precision (docs/audit.md) and report
            the findings when training ends (printed, and under "audit" in diagnose.json).
    """

    every: int = 50
    check_every: int = 16
    stop_on_nonfinite: bool = False
    watch_every_step: bool = False
    out_dir: str | None = None
    numerics: Any = "auto"
    verbose: bool = True
    audit: bool = True

    def __post_init__(self) -> None:
        try:
            numerics_period(self.numerics)
        except UserError:
            raise UserError(f"DiagnoseCallback(numerics=...) takes 'auto', 'off' or a number "
                            f"of steps (got {self.numerics!r})") from None
        for name in ("every", "check_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UserError(f"DiagnoseCallback({name}=...) must be an integer >= 1 "
                                f"(got {value!r})")


class DiagnoseSession:
    """The trainer-independent part of a DiagnoseCallback (see the module docstring)."""

    def __init__(self, options: DiagnoseOptions) -> None:
        self.options = options
        self.model: nn.Module | None = None
        self.step = 0
        self.steps_run = 0
        self.sampled_steps = 0
        self.first: NonFiniteEvent | None = None
        self.history: list[dict[str, Any]] = []
        self.written: tuple[Path, Path] | None = None
        self._watch: GatedWatch | None = None
        self._flags: list[torch.Tensor] = []   # per-step "gradients non-finite", unread
        self._flag_steps: list[int] = []
        self._armed = False                    # a check fired: watch until a module is named
        self._flagged = False                  # this step's flag is queued
        self.first_bad_step: int | None = None
        self._recorder: SampledRecorder | None = None
        self._scaler: Any = None
        self._skipped: torch.Tensor | None = None
        self._last_scale: torch.Tensor | None = None
        self._context: dict[str, Any] = {}
        self.numerics: NumericsSession | None = None
        self._numerics_started = False
        self._rank = 0
        self._audit: Observer | None = None
        #: The audit's findings, once training has ended (``audit=True``).
        self.audit_report: AuditReport | None = None

    # ------------------------------------------------------------ lifecycle
    def attach(self, model: nn.Module, *, precision: str, trainer: str,
               out_dir: str | Path | None, is_main: bool = True) -> None:
        """Hook ``model`` (once; a second fit of the same callback re-attaches). Only the
        main process (``is_main``) prints and writes the report."""
        self.detach()
        self.model = model
        self.options = dataclasses.replace(self.options,
                                           verbose=self.options.verbose and is_main)
        self._context = {"precision": precision, "trainer": trainer,
                         "out_dir": (self.options.out_dir or out_dir) if is_main else None}
        self._watch = GatedWatch(model, lambda: self.step, self._scale_tensor)
        self._recorder = SampledRecorder(model)
        out = self._context["out_dir"]
        self._rank = torch.distributed.get_rank() if torch.distributed.is_available() \
            and torch.distributed.is_initialized() else 0
        self.numerics = NumericsSession(
            model, precision, every=self.options.numerics,
            out=Path(out) if out is not None else None, rank=self._rank,
            say=lambda line: print(line, file=sys.stderr, flush=True)
            if self.options.verbose else None)
        self._numerics_started = False
        if self.options.audit:
            self._audit = make_observer().install()

    def detach(self) -> None:
        for hooks in (self._watch, self._recorder):
            if hooks is not None:
                hooks.remove()
        if self.numerics is not None:
            self.numerics.recorder.detach()
        if self._audit is not None:
            self.audit_report, self._audit = self._audit.close(), None
            if self.options.verbose:
                print(f"amptrain audit: {self.audit_report.format()}", file=sys.stderr,
                      flush=True)

    def _scale_tensor(self) -> torch.Tensor | None:
        scale = getattr(self._scaler, "_scale", None)
        return scale if isinstance(scale, torch.Tensor) else None

    def _unscale(self) -> torch.Tensor | None:
        """1 / the loss scale of this step (a tensor), or None without loss scaling."""
        if self._scaler is None:
            return None
        scale = self._scale_tensor()
        if scale is None:  # made at the first backward, from the initial scale
            return torch.tensor(1.0 / float(getattr(self._scaler, "_init_scale", 1.0)))
        return scale.double().reciprocal().float()

    def step_begin(self, step: int, scaler: Any = None) -> None:
        """Optimizer step ``step`` (0-based) starts: sample its ranges or not."""
        self.step = step
        self._scaler = scaler if getattr(scaler, "is_enabled", lambda: False)() else None
        assert self._recorder is not None, "attach() first"
        stats = self._recorder.stats
        stats.active = step % self.options.every == 0
        if stats.active:
            stats.grad_factor = self._unscale()
        assert self._watch is not None  # made with the recorder
        self._watch.active = stats.active or self._armed or self.options.watch_every_step
        self._flagged = False
        if self.numerics is not None:  # the telemetry counts steps from 1
            if not self._numerics_started:
                self.numerics.start(step + 1)
                self._numerics_started = True
            else:
                self.numerics.before(step + 1)

    def before_optimizer_step(self, parameters: Any) -> None:
        """Gradients are complete: without a GradScaler, flag non-finite ones (on the
        device; a GradScaler's own check is read from its scale instead)."""
        if self._scaler is not None or self._flagged:
            return
        grads = [p.grad for p in parameters if p.grad is not None]
        if grads:
            norms = torch._foreach_norm(grads)
            self._flag(~torch.isfinite(torch.stack([n.float() for n in norms]).sum()))

    def _flag(self, bad: torch.Tensor) -> None:
        self._flags.append(bad.reshape(()))
        self._flag_steps.append(self.step)
        self._flagged = True

    def step_end(self) -> bool:
        """The optimizer step is done; True when the trainer should stop (the first
        non-finite value was found and ``stop_on_nonfinite``)."""
        assert self._recorder is not None, "attach() first"
        self.steps_run = max(self.steps_run, self.step + 1)
        stats = self._recorder.stats
        if stats.active:
            stats.flush()
            stats.active = False
            self.sampled_steps += 1
        scale = self._scale_tensor()
        if scale is not None:  # a skipped step backs the scale off: counted on the device
            last = self._last_scale
            if last is None:  # the scaler makes its scale tensor at the first backward
                last = torch.full_like(scale, float(getattr(self._scaler, "_init_scale", 0.0)))
            went_down = scale < last
            self._skipped = went_down.to(torch.int64) if self._skipped is None \
                else self._skipped + went_down
            self._last_scale = scale.detach().clone()
            if not self._flagged:
                self._flag(went_down)
        if self.numerics is not None:
            self.numerics.after(self.step + 1)
        if (self.step + 1) % self.options.check_every == 0:
            self.check()
        return self.first is not None and self.options.stop_on_nonfinite

    def check(self) -> NonFiniteEvent | None:
        """Read the queued non-finite checks (one sync), remember the first event, empty
        the queue."""
        if self._watch is None:
            return None
        if self._flags:
            bad = torch.stack([f.to(self._flags[0].device) for f in self._flags]).cpu()
            if self.first_bad_step is None and bool(bad.any()):
                self.first_bad_step = self._flag_steps[int(bad.to(torch.uint8).argmax())] + 1
                self._armed = self.first is None  # watch every module until one is named
                if self.options.verbose:
                    print(f"amptrain: non-finite gradients at step {self.first_bad_step}; "
                          f"watching every module to name the one that produces them",
                          file=sys.stderr, flush=True)
            self._flags.clear()
            self._flag_steps.clear()
        event = self._watch.first()
        self._watch.reset()
        if event is not None and self.first is None:
            self.first = event
            self._armed = False
            if self.options.verbose:
                print(f"amptrain: {self.describe(event)}", file=sys.stderr, flush=True)
            if self.numerics is not None:  # nonfinite.json
                self.numerics.seen(event.step, event.module, event.phase,
                                   "watched during training by DiagnoseCallback")
        return self.first

    @staticmethod
    def describe(event: NonFiniteEvent) -> str:
        where = "its output" if event.phase == "forward" else "the gradient of its output"
        scale = f", loss scale {event.loss_scale:g}" if event.loss_scale else ""
        return (f"first non-finite value at step {event.step}: module '{event.module}' "
                f"({event.phase}: {where} held inf/NaN{scale})")

    def log_values(self, step: int) -> dict[str, Any]:
        """The loss scale and skipped steps so far (read at a log step), also printed."""
        self.check()
        scale = self._scale_tensor()
        values: dict[str, Any] = {
            "amp_loss_scale": float(scale.item()) if scale is not None else None,
            "amp_skipped_steps": int(self._skipped.item()) if self._skipped is not None else 0}
        self.history.append({"step": step, **values})
        if self.options.verbose:
            shown = f"{values['amp_loss_scale']:g}" if scale is not None else "none"
            print(f"amptrain: step {step}  loss scale {shown}  skipped steps "
                  f"{values['amp_skipped_steps']}", file=sys.stderr, flush=True)
        return values

    def finish(self) -> tuple[Path, Path] | None:
        """Write diagnose.md/.json into the output directory (once) and unhook."""
        if self.model is None or self.written is not None:
            return self.written
        self.check()
        self.detach()
        if self.numerics is not None and self._rank == 0:
            try:
                self.numerics.finish()
            except Exception as exc:  # never the reason a user's finished training fails
                print(f"amptrain: numerics.png not drawn ({type(exc).__name__}: {exc})",
                      file=sys.stderr, flush=True)
        if self._recorder is not None:  # a step cut short by an exception records no more
            self._recorder.stats.active = False
        out = self._context.get("out_dir")
        if out is None:
            return None
        try:
            report = strict_json(self.report())
            self.written = write_reports(report, out, summary=summary_lines(report))
        except Exception as exc:  # never the reason a user's finished training fails
            print(f"amptrain: diagnose report not written ({type(exc).__name__}: {exc})",
                  file=sys.stderr, flush=True)
            return None
        if self.options.verbose:
            print(f"amptrain: wrote {self.written[1]} and {self.written[0].name}",
                  file=sys.stderr, flush=True)
        return self.written

    # --------------------------------------------------------------- report
    def report(self) -> dict[str, Any]:
        """The diagnosis as a JSON-ready dict (the layout of ``amptrain diagnose``'s)."""
        assert self.model is not None and self._recorder is not None, "attach() first"
        stats = self._recorder.read()
        model = self.model
        modules = {(n or type(m).__name__): m for n, m in model.named_modules()}
        root = type(model).__name__
        first = self.first
        keep = keep_fp32_candidates(stats, modules, root, first)
        islands = [k["pattern"] for k in keep]
        scale = recommend_loss_scale(stats, islands, DEFAULT_INIT_SCALE)
        precision = self._context["precision"]
        if scale["reason"].startswith("gradients are non-finite") and "32" not in precision:
            scale["reason"] = (f"some gradients recorded in this {precision} run were inf/NaN "
                               f"(overflow at the loss scale in use); keeping the default scale")
        # Values an fp16 run turned into inf say nothing about bf16's range: judged as
        # "beyond fp16", not as non-finite.
        judged = beyond_fp16(stats) if computes_in_fp16(precision) else stats
        for name, s in stats.items():
            island = _in_island(name, islands)
            casts = name in modules and _casts_inputs_to_half(modules[name])
            s["fp32_with_recommendations"] = island
            risk, judged_reasons = module_risks(name, judged[name], first, scale["log2"],
                                                island, casts)
            _, reasons = module_risks(name, s, first, scale["log2"], island, casts)
            if judged is not stats and not bf16_trouble(judged[name]):
                # The real numbers (fp16's inf), without the bf16 verdict they would imply.
                reasons = [r for r in reasons if "bf16's range" not in r] or judged_reasons
            s["reasons"] = reasons
            s["risk"] = min(risk, 1e6)  # an inf output scores inf: kept finite for JSON
            for kind in GRADIENTS:
                if s[kind] is not None and scale["log2"] is not None:
                    s[kind]["fp16_at_recommended_scale"] = fractions(
                        s["_hist"][kind], FP16, scale["log2"])
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        supported = supported_precisions(device_features(device))
        skipped = int(self._skipped.item()) if self._skipped is not None else 0
        return {
            "source": "callback", "trainer": self._context["trainer"],
            "amptrain_version": __version__, "model": type(model).__name__, "root": root,
            "precision": precision, "device": str(device), "steps": self.steps_run,
            "every": self.options.every, "sampled_steps": self.sampled_steps,
            "sample_limit": SAMPLE_LIMIT, "skipped_steps": skipped,
            "first_nonfinite_step": self.first_bad_step,
            "watch_every_step": self.options.watch_every_step,
            "loss_scale": self.history[-1]["amp_loss_scale"] if self.history else None,
            "log": self.history,
            "formats": {f.name: {"max": f.max, "min_normal": f.min_normal,
                                 "flush_below": f.flush_below} for f in FORMATS},
            "first_nonfinite": dataclasses.asdict(first) if first else None,
            "recommendations": {
                "init_scale": scale["init_scale"], "loss_scale": scale, "keep_fp32": keep,
                "bf16": _bf16_verdict(judged, first, scale, None, supported, device),
                "attention": attention_overflow(stats, first)},
            "audit": (self.audit_report.to_json()["findings"]
                      if self.audit_report is not None else None),
            "modules": {name: {k: v for k, v in s.items() if k != "_hist"}
                        for name, s in sorted(stats.items(), key=lambda kv: (
                            -kv[1]["risk"], not kv[1]["leaf"],
                            kv[1]["order"] if kv[1]["order"] is not None else 1 << 30))},
        }


def summary_lines(report: dict[str, Any]) -> list[str]:
    """The top of a callback's diagnose.md."""
    recs = report["recommendations"]
    scale = report["loss_scale"]
    lines = [f"DiagnoseCallback in {report['trainer']}: {report['model']} in "
             f"{report['precision']} on {report['device']}, {report['steps']} steps; module "
             f"ranges sampled on {report['sampled_steps']} of them (every {report['every']})",
             f"loss scale at the last log step: {'none' if scale is None else f'{scale:g}'}; "
             f"skipped steps: {report['skipped_steps']}"]
    first, bad_step = report["first_nonfinite"], report.get("first_nonfinite_step")
    if first:
        lines.append(DiagnoseSession.describe(NonFiniteEvent(**first)))
        if bad_step is not None and bad_step < first["step"]:
            lines.append(f"(gradients were first non-finite at step {bad_step}, an unwatched "
                         f"step; the module was named when it recurred)")
    elif bad_step is not None:
        lines.append(f"non-finite gradients from step {bad_step}; no watched step showed "
                     f"which module produces them")
    else:
        lines.append("no non-finite values in module outputs or gradients")
    lines += finding_lines(report, keep_hint=" (run it under torch.autocast(..., "
                                             "enabled=False) with fp32 inputs)")
    ls = recs["loss_scale"]
    lines.append(f"initial loss scale: {recs['init_scale']:g} (GradScaler(init_scale=...)) "
                 f"-- {ls['reason']}")
    b = recs["bf16"]
    verdict = ("avoids the problem" if b["avoids_problem"]
               else "does not avoid it" if b["fp16_problem"] else "is also fine")
    lines.append(f"bf16-mixed {verdict}: {b['reason']}")
    return lines
