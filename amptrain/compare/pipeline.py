"""The whole study, from options to compare.json, study.json and the reports."""
from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

from ..common import outdir
from ..trainer.reporting import banners_once
from ..config import RunConfig, to_dict
from ..precision.hardware.devices import resolve_device
from ..precision.hardware.probe import collect_env
from ..common.errors import UserError
from .options import CURVE_POINTS, CompareOptions, resolve_precisions, resolve_tolerance
from .reliability import assess_timing, machine_load, usable_cores
from .runs import train_runs
from .summary import summarise
from .timing import measure_speed_and_memory, memory_method, speed_figures

log = logging.getLogger("amptrain")


def check_out(out: Path) -> None:
    """Refuse to mix a new study into a directory that already holds one, or to replace
    any report file there (the rule of :mod:`amptrain.common.outdir`)."""
    if (out / "compare.json").exists() or (out / "runs").exists():
        raise UserError(f"--out {out} already holds a compare study; choose another --out")
    outdir.claim(out, outdir.COMPARE_OUTPUTS)


def run_compare(config: RunConfig, options: CompareOptions, *, command: str | None = None,
                pick_log_every: bool | None = None) -> dict[str, Any]:
    """Run the whole study into ``config.out``; returns compare.json's content.

    ``config`` holds the training options shared by every run (its ``precision`` and
    ``seed`` are set per run: seeds ``config.seed`` .. ``config.seed + seeds - 1``).
    With ``pick_log_every`` (default: unless the user gave --log-every, ``config.given``)
    --log-every is chosen for smooth loss curves. Each
    precision's first line ("amptrain: precision ...") is shown once.
    """
    with banners_once():
        return _study(config, options, command=command,
                      pick_log_every="log_every" not in config.given
                      if pick_log_every is None else pick_log_every)


def _study(config: RunConfig, options: CompareOptions, *, command: str | None,
           pick_log_every: bool) -> dict[str, Any]:
    from .. import report

    if config.checkpointing.resume:
        raise UserError("compare starts every run fresh: drop --resume")
    if not config.out:
        raise UserError("compare needs --out DIR")
    out = Path(config.out)
    check_out(out)
    device = resolve_device(config.device)
    baseline, precisions = resolve_precisions(options, device,
                                              weight_update=config.precision.weight_update)
    seeds = [config.seed + i for i in range(options.seeds)]
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()

    log.info("compare: timing %s (%d warm-up + %d timed steps each, %s)", ", ".join(precisions),
             options.timing_warmup, options.timed_steps,
             "interleaved" if options.interleave else "one after another")
    load_before = machine_load()
    contenders = measure_speed_and_memory(config, precisions, options)
    speed = {p: speed_figures(c) for p, c in contenders.items()}
    task = contenders[baseline].task  # the set-up Trainer's: names compare's metric fields
    assert task is not None, "build_contender sets every contender's task"
    # The higher of the two: a load that rose during the timing counts as much as one
    # that was there before it.
    loads = [x for x in (load_before, machine_load()) if x is not None]
    load, cores = (max(loads) if loads else None), usable_cores()
    timing_load = {"load_average": load, "cores": cores}
    reliability = assess_timing({p: s.get("step_times_ms", []) for p, s in speed.items()},
                                baseline, speed[baseline].get("control_step_times_ms", []),
                                load=load, cores=cores, interleaved=options.interleave)
    for p, fields in reliability.items():
        speed[p].update(fields)
    # Records every few steps for smooth curves, but lines printed as `train` prints them.
    print_every = config.logging.log_every
    if pick_log_every:
        steps = contenders[baseline].total_steps
        config = config.with_options(log_every=max(1, steps // CURVE_POINTS))
    runs = [] if options.speed_only else train_runs(config, precisions, seeds, out,
                                                    print_every=print_every)

    tolerance = resolve_tolerance(options, task)
    log.info("compare: verdict tolerance %s", tolerance.why)
    # compare.json's keys are fixed (docs/design.md); which tolerance judged the verdicts
    # and why goes to study.json's "task" and to the reports.
    result = {"baseline": baseline, "runs": runs,
              "summary": summarise(baseline, precisions, runs, speed, tolerance.value, task)}
    (out / "compare.json").write_text(json.dumps(result, indent=2) + "\n")
    study = {
        "command": command, "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
        "duration_s": round(time.time() - started, 1), "device": str(device),
        "config": {k: v for k, v in to_dict(config).items() if k not in ("precision", "out")},
        "options": dataclasses.asdict(options), "seeds": seeds, "speed": speed,
        # What the reports label: the task and its primary metric.
        "task": {"name": task.name, "metric": task.primary.key, "label": task.primary.label,
                 "delta_field": task.delta_field,
                 "tolerance": tolerance.value, "tolerance_option": task.tolerance_option,
                 "tolerance_source": tolerance.source, "tolerance_why": tolerance.why},
        "timing_load": timing_load,
        "memory_method": memory_method(device), "env": collect_env(),
    }
    (out / "study.json").write_text(json.dumps(study, indent=2) + "\n")
    report.write_reports(out)
    return result
