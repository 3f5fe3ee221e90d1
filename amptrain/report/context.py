"""What a study was and where it ran, in words: the title, device, configuration, method
and environment lines that the plots, report.md and report.html all show.

Kept apart from markdown.py and html.py so that plots.py (the PNG's title line) can use
them too without importing a renderer.
"""
from __future__ import annotations

from typing import Any

from .load import Study, human_bytes


def _title(study: Study) -> str:
    cfg = study.details.get("config", {})
    model, data = cfg.get("model", "?"), cfg.get("data", "?")
    return f"amptrain compare — {model} on {data}"


# ------------------------------------------------------------- environment
def _device_line(study: Study) -> str:
    env = study.details.get("env", {})
    device = study.details.get("device", "?")
    if str(device).startswith("cuda") and env.get("gpus"):
        return f"{env['gpus'][0].get('name', 'GPU')} ({device})"
    cores = f", {env['cpu_cores']} cores" if env.get("cpu_cores") else ""
    return f"{env.get('cpu', 'CPU')}{cores} ({device})"


def _env_value(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)) and key.endswith("bytes"):
        return human_bytes(value)
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_env_value(k, v)}" for k, v in value.items()) or "—"
    if isinstance(value, (list, tuple)):
        return "; ".join(_env_value(key, v) for v in value) or "none"
    return "—" if value is None else str(value)


def env_rows(study: Study) -> list[tuple[str, str]]:
    """(name, value) rows of the hardware and software the study ran on."""
    rows = [("device used", str(study.details.get("device", "?")))]
    rows += [(k, _env_value(k, v)) for k, v in study.details.get("env", {}).items()]
    return rows


def _method_lines(study: Study) -> list[str]:
    d = study.details
    o = d.get("options", {})
    task = study.task
    metric = task.metrics.primary.label
    tolerance = task.verdict.format_tolerance(study.tolerance).lstrip("±")
    timed = o.get("bench_steps") or o.get("timing_steps")
    order = "interleaved (round-robin, rotating order)" if o.get("interleave", True) else \
        "one precision after another"
    unit = max([s.get("timed_unit_steps", 1) for s in d.get("speed", {}).values()] or [1])
    timed_what = "timed optimizer steps" if unit == 1 else (
        f"timed units of {unit} optimizer steps (a whole update, the task's acting included; "
        f"a step's time is the unit's over {unit})")
    lines = [
        (f"Speed: {o.get('timing_warmup')} warm-up + {timed} {timed_what} per "
         f"precision, {order}, device synchronised around every "
         f"{'step' if unit == 1 else 'unit'}; median step time, "
         f"samples/s = global batch / median step time; whiskers: step-time quartiles."),
        f"Memory: {d.get('memory_method', 'n/a')}",
        (f"{metric.capitalize()}: final validation {metric} of each run; mean and sample "
         f"standard deviation over seeds {', '.join(map(str, d.get('seeds', [])))}; verdict ok "
         f"when |Δ {metric}| ≤ {tolerance}"
         f"{'' if task.verdict.unit == 'pp' else ' of the baseline (relative change)'}."),
        *_seed_method(study),
        ("Every run of a seed starts from identical initial weights and sees the same data "
         "order (checked per run: see compare.json runs[].same_initial_weights, "
         "data_order_sha256, first_step_loss_fp32)."),
        f"Verdict tolerance: {study.tolerance_why}.",
    ]
    if d.get("duration_s") is not None:
        lines.append(f"Whole study: {d['duration_s']:.0f} s, started {d.get('started', '?')}.")
    return lines


def _seed_method(study: Study) -> list[str]:
    """How a study judged over seeds (compare/seeds.py) computed its intervals and verdicts."""
    if not any("weak_verdict" in row for row in study.summary):
        return []
    # The study's own numbers (study.json), not today's defaults.
    method = study.details.get("seed_method") or {}
    reps, seed = method.get("bootstrap_reps", "?"), method.get("bootstrap_seed", "?")
    metric = study.task.metrics.primary.label
    return [(f"Over seeds: the interquartile mean (IQM: the middle 50 % of the runs' final "
             f"{metric}, as rliable and scipy.stats.trim_mean(x, 0.25) define it) with a "
             f"stratified-bootstrap 95 % percentile interval ({reps} resamples of "
             f"the seeds, RNG seed {seed}); the difference of IQMs to the baseline "
             f"with its interval, seeds paired across precisions; verdict ok when that "
             f"interval holds 0 and the mean change is within the tolerance, else better or "
             f"worse; fewer than {method.get('min_seeds', '?')} seeds make a weak verdict.")]


def _config_line(study: Study) -> str:
    cfg = study.details.get("config", {})
    keys = ("model", "data", "epochs", "max_steps", "batch_size", "optimizer", "lr", "scheduler",
            "device")
    return ", ".join(f"{k} {cfg[k]}" for k in keys if cfg.get(k) is not None)
