"""``amptrain plan``: the largest set of Linear layers (by matmul FLOPs) that can train in a
low-bit format while compare's verdict against the baseline stays ``ok``.

1. **Rank** the eligible layers, least sensitive first
   (:func:`amptrain.diagnose.sensitivity.rank_layers`: flush, saturation and SNR under
   the format from a short 32-true run, and a per-layer loss probe).
2. **Search** along the ranking: every candidate is a precision plan (``plan:FILE``,
   :mod:`amptrain.precision.precision_plan`) trained as compare trains a row
   (:func:`~.runs.train_runs`: the seed's initial weights and data order, checked) and
   judged as compare judges it (:func:`~.summary.summarise`, the task's tolerance). First
   all the layers; where that is not ok, the plan grows greedily along the ranking: each
   layer in turn is tried on top of the ones accepted so far and kept where the verdict
   stays ok (a refused layer does not end the search).
3. **Budget**: ``--budget-steps`` (training steps over all the search's runs),
   ``--budget-time`` (seconds, read from an injectable clock) and ``--seeds`` per run. A
   run the budget cannot afford is not started: the plan is the best found so far, and the
   reports say the search was cut short.

The outputs (DIR/precision-plan.yaml, plan.md, plan.json, search/) are written by
:mod:`.precision_plan_report`.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable

from ..common import outdir
from ..common.errors import UserError, flag
from ..common.tolerance import Tolerance, tolerance_for
from ..config import RunConfig
from .options import PlanOptions
from .rows import warn_unread_scaler
from ..diagnose.sensitivity import LayerSensitivity, rank_layers
from ..precision.hardware.devices import resolve_device
from ..precision.lowbit import RECIPES
from ..precision.lowbit_settings import plan_settings_read, unread_of, warn_unread_settings
from ..precision.precision_plan import KEPT, linear_flops, plan_format
from ..precision.resolve import resolve_precision
from ..tasks import Task, delta_field
from ..workflows.runner import assemble
from .precision_plan_report import plan_yaml, write_outputs
from .runs import train_runs
from .summary import summarise

log = logging.getLogger("amptrain")

#: Verdicts that keep a candidate (a format that trains better than the baseline is fine).
ACCEPTED = ("ok", "better")


def target_format(name: str) -> str:
    """``--precision``'s low-bit format for the plan (refused: anything else)."""
    fmt = plan_format(name)
    if fmt is None or fmt == KEPT:
        raise UserError(f"{flag('precision')} {name!r}: plan searches for a low-bit format, "
                        f"one of {', '.join(RECIPES)}")
    return fmt


class Budget:
    """What the search may still spend: training steps and seconds (``clock``: seconds,
    monotonic; tests inject their own)."""

    def __init__(self, steps: int | None, seconds: float | None,
                 clock: Callable[[], float]) -> None:
        self.steps, self.seconds, self.clock = steps, seconds, clock
        self.started = clock()
        self.spent_steps = 0
        self.cut_short: str | None = None

    def elapsed(self) -> float:
        return self.clock() - self.started

    def allows(self, steps: int) -> bool:
        """Whether a run of ``steps`` more steps may start (else: why, in :attr:`cut_short`)."""
        if self.cut_short is not None:
            return False
        elapsed = self.elapsed()
        if self.seconds is not None and elapsed >= self.seconds:
            self.cut_short = f"{flag('budget_time')} {self.seconds:g} s spent ({elapsed:.1f} s)"
        elif self.steps is not None and self.spent_steps + steps > self.steps:
            self.cut_short = (f"{flag('budget_steps')} {self.steps}: {self.spent_steps} spent, "
                              f"the next run needs {steps}")
        return self.cut_short is None


class Search:
    """The candidates' runs and verdicts (the evidence the plan is written with)."""

    def __init__(self, config: RunConfig, out: Path, fmt: str, baseline: str,
                 seeds: list[int], task: Task, tolerance: Tolerance, budget: Budget,
                 flops: dict[str, int]) -> None:
        self.config, self.out, self.fmt, self.baseline = config, out, fmt, baseline
        self.seeds, self.task, self.tolerance, self.budget = seeds, task, tolerance, budget
        self.flops = flops
        self.base_runs: list[dict[str, Any]] = []
        self.evidence: list[dict[str, Any]] = []
        self.verdicts: dict[frozenset[str], bool] = {}
        self.steps_per_run = 0

    def run_baseline(self) -> None:
        if not self.budget.allows(0):
            raise UserError(f"the search's budget is spent before its first run "
                            f"({self.budget.cut_short})")
        # the low-bit options are the candidates' format's: train_runs gives each run only
        # those its precision reads (the baseline none)
        self.base_runs = train_runs(self.config, [self.baseline], self.seeds,
                                    self.out / "search")
        steps = sum(r.get("steps") or 0 for r in self.base_runs)
        self.budget.spent_steps += steps
        self.steps_per_run = steps
        if any(r.get("halted") for r in self.base_runs):
            raise UserError(f"the baseline {self.baseline} stopped: "
                            f"{self.base_runs[0].get('halted')}; choose another "
                            f"{flag('baseline')}")

    def share(self, layers: list[str]) -> float:
        total = sum(self.flops.values())
        return sum(self.flops[n] for n in layers) / total if total else 0.0

    def attempt(self, layers: list[str]) -> bool | None:
        """Train and judge the plan putting ``layers`` in the format: True when its verdict
        is accepted, None when the budget stops the search first."""
        key = frozenset(layers)
        if key in self.verdicts:
            return self.verdicts[key]
        if not layers:
            return True   # nothing in the format: the baseline's numerics elsewhere
        if not self.budget.allows(self.steps_per_run):
            return None
        index = len(self.evidence) + 1
        path = self.out / "search" / f"candidate-{index}.yaml"
        outdir.write_text(path, plan_yaml(self.fmt, self.baseline, self.all_layers(layers),
                                          self.share(layers)), replace=False)
        label = f"plan:{path}"
        log.info("plan: candidate %d: %d layer(s) in %s, %.0f %% of the Linear FLOPs", index,
                 len(layers), self.fmt, 100 * self.share(layers))
        runs = train_runs(self.config, [label], self.seeds, self.out / "search")
        self.budget.spent_steps += sum(r.get("steps") or 0 for r in runs)
        row = summarise(self.baseline, [self.baseline, label], self.base_runs + runs, {},
                        self.tolerance.value, self.task)[1]
        mean_field = f"val_{self.task.metrics.primary.key}_mean"
        accepted = row["verdict"] in ACCEPTED
        self.evidence.append({
            "candidate": index, "plan": str(path), "layers": list(layers),
            "lowbit_flops_share": round(self.share(layers), 4),
            "metric": self.task.metrics.primary.key, "value": row[mean_field],
            "baseline_value": self.baseline_value(mean_field),
            delta_field(self.task): row[delta_field(self.task)], "verdict": row["verdict"],
            "same_start": _same_start(self.base_runs, runs)})
        self.verdicts[key] = accepted
        return accepted

    def baseline_value(self, mean_field: str) -> float | None:
        """The baseline's mean of ``mean_field`` over the seeds."""
        rows = summarise(self.baseline, [self.baseline], self.base_runs, {},
                         self.tolerance.value, self.task)
        return rows[0][mean_field]

    def all_layers(self, lowbit: list[str]) -> dict[str, str]:
        """Every eligible layer: in the format or kept in bf16."""
        chosen = set(lowbit)
        return {name: self.fmt if name in chosen else KEPT for name in self.flops}


def _same_start(base: list[dict[str, Any]], runs: list[dict[str, Any]]) -> bool:
    """Whether each seed's candidate run started from the baseline's weights and data."""
    keys = ("initial_weights_sha256", "data_order_sha256")
    by_seed = {r["seed"]: r for r in base}
    return all(all(r.get(k) == by_seed.get(r["seed"], {}).get(k) for k in keys) for r in runs)


def search_along(ranking: list[LayerSensitivity], search: Search) -> list[str]:
    """The largest accepted set found: all the layers; else grown greedily along the
    ranking, each layer tried on top of those accepted so far and kept where the verdict
    stays accepted (a layer refused does not stop the search: every later one is tried)."""
    names = [s.name for s in ranking]
    verdict = search.attempt(names)
    if verdict is None:
        return []
    if verdict:
        return names
    chosen: list[str] = []
    for name in names:   # all of them on top is cached as refused: not trained twice
        verdict = search.attempt(chosen + [name])
        if verdict is None:
            break
        if verdict:
            chosen = chosen + [name]
    return chosen


def warn_unread_lowbit(config: RunConfig, fmt: str) -> None:
    """One warning per low-bit setting given that the candidates (precision plans with
    layers in ``fmt``) do not read; the runs take only what they read (:func:`train_runs`),
    so none of them warns itself."""
    warn_unread_settings(unread_of(config.precision, plan_settings_read([fmt])),
                         f"plan's candidates (precision plans of {fmt} layers)")


def run_plan(config: RunConfig, options: PlanOptions, *,
             clock: Callable[[], float] = time.monotonic,
             command: str | None = None) -> dict[str, Any]:
    """The whole search into ``config.out``; returns plan.json's content."""
    if config.checkpointing.resume:
        raise UserError("plan starts every run fresh: drop --resume")
    if not config.out:
        raise UserError("plan needs --out DIR")
    fmt = target_format(config.precision.name)
    warn_unread_lowbit(config, fmt)
    device = resolve_device(config.device)
    out = Path(config.out)
    outdir.claim_locked(out, outdir.PLAN_OUTPUTS)
    if (out / "search").exists():
        raise UserError(f"{flag('out')} {out} already holds a plan search; choose another "
                        f"{flag('out')}")
    try:
        baseline = resolve_precision(options.baseline, device).name
    except UserError as exc:
        raise UserError(f"{flag('baseline')}: {exc}") from None
    warn_unread_scaler(config, [resolve_precision(name, device).spec
                                for name in (baseline, fmt)],
                       f"plan's runs (the {baseline} baseline, the {fmt} candidates)")
    budget = Budget(options.budget_steps, options.budget_time, clock)
    run = assemble(config)
    ranking = rank_layers(run.config, run.data, run.model, fmt, options.probe_steps,
                          task=run.task)
    if not ranking:
        raise UserError(f"{flag('precision')} {fmt}: the model has no Linear layer that can "
                        f"run in it (plain nn.Linear, dimensions multiples of "
                        f"{RECIPES[fmt].dim_multiple})")
    task = run.task
    tolerance = tolerance_for(task, getattr(options, task.verdict.tolerance_option))
    seeds = [config.seed + i for i in range(options.seeds)]
    search = Search(config.with_options(precision=baseline), out, fmt, baseline, seeds, task,
                    tolerance, budget, {s.name: s.flops for s in ranking})
    outdir.make(out / "search")
    search.run_baseline()
    chosen = search_along(ranking, search)
    return write_outputs(out, search, ranking, chosen, linear_flops(run.model),
                         command=command)
