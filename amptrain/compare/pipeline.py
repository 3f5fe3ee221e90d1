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
from ..common.errors import UserError, flag
from ..report import write_reports
from ..tasks import Task, delta_field
from .options import CURVE_POINTS, CompareOptions, resolve_precisions, resolve_tolerance
from .rows import row_names, warn_unread
from .reliability import assess_timing, check_against_training, machine_load, usable_cores
from .runs import train_runs
from .seeds import BOOTSTRAP_REPS, BOOTSTRAP_SEED, MIN_SEEDS
from .summary import summarise
from .timing import measure_speed_and_memory, memory_method, speed_figures

log = logging.getLogger("amptrain")


def check_out(out: Path) -> None:
    """Refuse to mix a new study into a directory that already holds one, or to replace
    any report file there (the rule of :mod:`amptrain.common.outdir`)."""
    if (out / "compare.json").exists() or (out / "runs").exists():
        raise UserError(f"--out {out} already holds a compare study; choose another --out")
    outdir.claim_locked(out, outdir.COMPARE_OUTPUTS)


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
    if config.checkpointing.resume:
        raise UserError("compare starts every run fresh: drop --resume")
    if not config.out:
        raise UserError("compare needs --out DIR")
    out = Path(config.out)
    check_out(out)
    device = resolve_device(config.device)
    baseline, precisions = resolve_precisions(options, device,
                                              weight_update=config.precision.weight_update)
    warn_unread(config, precisions, flag("precisions"))
    seeds = [config.seed + i for i in range(options.seeds)]
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()

    log.info("compare: timing %s (%d warm-up + %d timed steps each, %s)", ", ".join(precisions),
             options.timing_warmup, options.timed_steps,
             "interleaved" if options.interleave else "one after another")
    timing_config = config  # a second timing (below) must time the same steps
    speed, task, timing_load = time_precisions(timing_config, precisions, options)
    # Records every few steps for smooth curves, but lines printed as `train` prints them.
    print_every = config.logging.log_every
    if pick_log_every:
        steps = speed[baseline]["total_steps"]
        config = config.with_options(log_every=max(1, steps // CURVE_POINTS))
    runs = [] if options.speed_only else train_runs(config, precisions, seeds, out,
                                                    print_every=print_every)
    speed, timing_load = _match_training(timing_config, precisions, options, runs, speed,
                                         timing_load)

    tolerance = resolve_tolerance(options, task)
    log.info("compare: verdict tolerance %s", tolerance.why)
    # compare.json's keys are fixed (docs/design.md); which tolerance judged the verdicts
    # and why goes to study.json's "task" and to the reports.
    result = {"baseline": baseline, "runs": runs,
              "summary": summarise(baseline, precisions, runs, speed, tolerance.value, task)}
    # Through the one writer: a full disk is one line, and no half-written report is left.
    outdir.write_text(out / "compare.json", json.dumps(result, indent=2) + "\n", replace=False)
    study = {
        "command": command, "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
        "duration_s": round(time.time() - started, 1), "device": str(device),
        "config": {k: v for k, v in to_dict(config).items() if k not in ("precision", "out")},
        "options": dataclasses.asdict(options), "seeds": seeds, "speed": speed,
        # The rows' displayed names, where a low-bit setting sets one apart (mxfp4 rceil).
        "row_names": row_names(config, precisions),
        # How the verdicts over seeds were computed, for the report to say.
        "seed_method": {"bootstrap_reps": BOOTSTRAP_REPS, "bootstrap_seed": BOOTSTRAP_SEED,
                        "min_seeds": MIN_SEEDS},
        # What the reports label: the task and its primary metric.
        "task": {"name": task.name, "metric": task.metrics.primary.key,
                 "label": task.metrics.primary.label,
                 "delta_field": delta_field(task),
                 "tolerance": tolerance.value, "tolerance_option": task.verdict.tolerance_option,
                 "tolerance_source": tolerance.source, "tolerance_why": tolerance.why},
        "timing_load": timing_load,
        "memory_method": memory_method(device), "env": collect_env(),
    }
    outdir.write_text(out / "study.json", json.dumps(study, indent=2) + "\n", replace=False)
    write_reports(out, replace=False)  # claimed above: new files, never a report replaced
    return result


def time_precisions(config: RunConfig, precisions: list[str], options: CompareOptions
                    ) -> tuple[dict[str, dict[str, Any]], Task, dict[str, Any]]:
    """Speed and memory of every precision (``precisions[0]`` the baseline) with the
    reliability fields, the task the runs learn, and the load the timing ran under."""
    load_before = machine_load()
    contenders = measure_speed_and_memory(config, precisions, options)
    speed = {p: {**speed_figures(c), "total_steps": c.total_steps}
             for p, c in contenders.items()}
    task = contenders[precisions[0]].task  # the set-up Trainer's: names the metric fields
    assert task is not None, "build_contender sets every contender's task"
    # The higher of the two: a load that rose during the timing counts as much as one
    # that was there before it.
    loads = [x for x in (load_before, machine_load()) if x is not None]
    load, cores = (max(loads) if loads else None), usable_cores()
    reliability = assess_timing({p: s.get("step_times_ms", []) for p, s in speed.items()},
                                precisions[0],
                                speed[precisions[0]].get("control_step_times_ms", []),
                                load=load, cores=cores, interleaved=options.interleave)
    for p, fields in reliability.items():
        speed[p].update(fields)
    return speed, task, {"load_average": load, "cores": cores}


def _match_training(config: RunConfig, precisions: list[str], options: CompareOptions,
                    runs: list[dict[str, Any]], speed: dict[str, dict[str, Any]],
                    timing_load: dict[str, Any]
                    ) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """The timing held against the step times the training runs logged: where a precision's
    timed step is far off its runs' (the machine was busy for a while, issue 38's 40x), it
    is timed once more, now; the second timing is kept where it agrees with training, else
    the first stays, marked not reliable, with both numbers in its note."""
    notes = check_against_training(speed, runs)
    if not notes:
        return speed, timing_load
    log.warning("compare: the timing is not the speed training has (%s); timing again",
                "; ".join(notes))
    again, _, load_again = time_precisions(config, precisions, options)
    if check_against_training(again, runs):
        log.warning("compare: timed again, still not the speed training has: the speed "
                    "table is marked not reliable, and study.json holds the runs' step times")
        return speed, timing_load
    first = "; ".join(notes)
    for s in again.values():
        s["first_timing_note"] = first  # study.json: why it was timed twice
    log.info("compare: the second timing agrees with the training runs")
    return again, load_again
