"""Finding and checking what ``--resume`` continues from.

``--resume auto`` takes the newest readable checkpoint of the run directory, skipping
damaged ones; a resumed run's config is checked against the checkpoint's, and the
metrics a killed run logged after its last checkpoint are dropped (the resumed run
logs those steps again).
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from ..config.train import DEFAULT_EPOCHS
from ..common.errors import UserError
from . import sharded
from .files import CHECKPOINT_DIR, LAST, load, remove_unfinished, step_checkpoints
from ..tasks import task_class
from ..tasks import DEFAULT_TASK
from ..tasks import saved_task_name

log = logging.getLogger("amptrain")

#: Config fields that change the rest of the run's trajectory when they differ on resume.
INEXACT_IF_CHANGED = ("data", "seed", "epochs", "max_steps", "lr", "scheduler", "warmup_steps",
                      "weight_decay", "momentum", "clip_grad_norm", "val_fraction",
                      "optimizer_args", "scheduler_args", "scheduler_interval")


def find_resume(target: str, out: str | Path | None, *, cleanup: bool = True
                ) -> tuple[Path, dict[str, Any]] | None:
    """The checkpoint ``--resume TARGET`` means, loaded: (path, state), or None to start fresh.

    ``auto`` takes the latest valid checkpoint under ``OUT/checkpoints`` (None when there
    is none yet): the newer of the full one and the sharded one (FSDP); a sharded
    ``step-N`` directory is that checkpoint; another directory means the same as ``auto``
    inside it; anything else is a file path. ``cleanup`` deletes leftovers of a save that
    was killed half-way.
    """
    if target == "auto":
        if out is None:
            raise UserError("--resume auto needs --out (the run directory to continue)")
        directory = Path(out) / CHECKPOINT_DIR
        if cleanup:
            for leftover in remove_unfinished(directory) + sharded.remove_unfinished(directory):
                log.info("removed %s, left by a checkpoint write that never finished", leftover)
        found = sharded.newer_of(_latest_full(directory), directory)
        if found is None:
            log.info("--resume auto: no checkpoint in %s, starting fresh", directory)
        return found
    path = Path(target)
    if sharded.is_sharded(path):
        return path, sharded.load_state(path)
    if path.is_dir():
        directory = path / CHECKPOINT_DIR if (path / CHECKPOINT_DIR).is_dir() else path
        found = sharded.newer_of(_latest_full(directory), directory)
        if found is None:
            raise UserError(f"--resume {path}: no checkpoint in {directory}")
        return found
    return path, load(path)


def _latest_full(directory: Path) -> tuple[Path, dict[str, Any]] | None:
    """:func:`latest_valid`, but none readable is no error when a sharded one is there."""
    try:
        return latest_valid(directory)
    except UserError:
        if sharded.latest_sharded(directory) is None:
            raise
        return None


def read(path: str | Path) -> dict[str, Any]:
    """The checkpoint at ``path``: a full one (a file) or a sharded one's plain values."""
    return sharded.load_state(path) if Path(path).is_dir() else load(path)


def latest_valid(directory: str | Path) -> tuple[Path, dict[str, Any]] | None:
    """``last.pt``, else the newest ``step-N.pt`` that loads; corrupt ones are skipped with a
    warning. None when the directory holds no checkpoint; an error when none is readable."""
    directory = Path(directory)
    candidates = [directory / LAST] if (directory / LAST).is_file() else []
    candidates += reversed(step_checkpoints(directory))
    for candidate in candidates:
        try:
            return candidate, load(candidate)
        except UserError as exc:
            log.warning("skipping %s", exc)
    if candidates:
        raise UserError(f"--resume: none of the {len(candidates)} checkpoints in {directory} "
                        f"is readable; remove them to start over, or --resume a good copy")
    return None


def check_compatible(state: dict[str, Any], config: dict[str, Any], run_info: dict[str, Any],
                     path: str | Path) -> None:
    """Refuse a resume whose config contradicts the checkpoint; warn where it is only inexact.

    ``config`` is the resolved config of the run that resumes. A different model, class
    count or input shape cannot load the weights, another optimizer cannot use the saved
    optimizer state, and a different global batch would read the saved data position
    and LR schedule wrongly. Other differences (:data:`INEXACT_IF_CHANGED`) are allowed
    but make the continuation differ from the original run, which a warning says.
    """
    saved = state.get("config") or {}
    if saved.get("model") and config.get("model") and saved["model"] != config["model"]:
        raise UserError(f"--model {config['model']} does not match checkpoint {path}, which was "
                        f"trained with --model {saved['model']}; resume with --model "
                        f"{saved['model']} or start a new run with another --out")
    _check_same_task(state, config, run_info, path)
    saved_inputs = (state.get("run") or {}).get("inputs") or {}
    inputs = run_info.get("inputs") or {}
    task = run_info.get("task") or _default_task()
    for key in ("num_classes", "input_shape"):
        if key not in saved_inputs or key not in inputs:
            continue
        now, then = _plain(inputs[key]), _plain(saved_inputs[key])
        if now != then:
            raise UserError(_inputs_differ(task, key, now, then, config, saved, path))
    if str(saved.get("data", "")).startswith("gym:"):
        # A ppo step's minibatch comes from the rollout: name the option that changed it,
        # not --batch-size (which ppo refuses).
        for key in ("num_envs", "rollout_steps", "minibatches"):
            if key in saved and saved[key] != config.get(key):
                raise UserError(f"--{key.replace('_', '-')} {config.get(key)} differs from "
                                f"checkpoint {path}'s {saved[key]}: its rollout and step "
                                f"count come from it; resume with --{key.replace('_', '-')} "
                                f"{saved[key]}")
    if "batch_size" in saved and saved["batch_size"] != config.get("batch_size"):
        raise UserError(f"--batch-size {config.get('batch_size')} differs from checkpoint {path}'s "
                        f"{saved['batch_size']}: its data position and learning-rate schedule "
                        f"count batches of {saved['batch_size']}; resume with --batch-size "
                        f"{saved['batch_size']}")
    if saved.get("optimizer") and saved["optimizer"] != config.get("optimizer"):
        raise UserError(f"--optimizer {config.get('optimizer')} differs from checkpoint {path}'s "
                        f"{saved['optimizer']}, whose optimizer state it cannot use; resume with "
                        f"--optimizer {saved['optimizer']}")
    saved, config = _length_spelt_out(saved), _length_spelt_out(config)
    changed = [f"--{key.replace('_', '-')} {config[key]} (checkpoint: {saved[key]})"
               for key in INEXACT_IF_CHANGED
               if key in saved and key in config and saved[key] != config[key]]
    if changed:
        log.warning("resume is not exact: %s", ", ".join(changed))


def _length_spelt_out(config: dict[str, Any]) -> dict[str, Any]:
    """``epochs`` as the run's length rule reads it: not given (None) and no ``max_steps``
    is the default number of passes, which checkpoints written before epochs could be left
    unset (they hold 3) spell out."""
    if "epochs" in config and config["epochs"] is None and not config.get("max_steps"):
        return {**config, "epochs": DEFAULT_EPOCHS}
    return config


def _task_class(name: Any) -> Any:
    """The Task class called ``name`` (its wording), or None for an unknown name."""

    return task_class(name)


def _default_task() -> str:
    """The task of a run that names none (older than tasks: a classifier)."""

    return DEFAULT_TASK


def _check_same_task(state: dict[str, Any], config: dict[str, Any], run_info: dict[str, Any],
                     path: str | Path) -> None:
    """A checkpoint continues only the task it trained (checkpoints older than tasks were
    classifiers)."""

    then = saved_task_name(state)
    now = run_info.get("task") or config.get("task")
    current = _task_class(now)
    if current is not None and _task_class(then) is not None and now != then:
        raise UserError(f"--data {config.get('data')} holds {current.wording.data_holds} "
                        f"({now}), but "
                        f"checkpoint {path} trained a {then} model; resume on the data it was "
                        f"trained on (--data {(state.get('config') or {}).get('data')}) or "
                        f"start a new run with another --out")


def _inputs_differ(task: str, key: str, now: Any, then: Any, config: dict[str, Any],
                   saved: dict[str, Any], path: str | Path) -> str:
    """The message for a resume whose model facts differ, naming the flag that differs."""
    cls = _task_class(task)
    own = cls.wording.resume_mismatch(key, now, then, config=config, saved=saved, path=str(path)) \
        if cls is not None else None
    if own is not None:
        return own
    noun = cls.wording.output_noun if cls is not None else "outputs"
    what = f"{now} {noun}" if key == "num_classes" \
        else f"inputs of shape {now}"
    was = f"{then} {noun}" if key == "num_classes" \
        else f"inputs of shape {then}"
    return (f"--data {config.get('data')} has {what}, but checkpoint {path} was trained on "
            f"{was} (--data {saved.get('data')}); resume on data of the same shape")


def _plain(value: Any) -> Any:
    return tuple(value) if isinstance(value, (list, tuple)) else value


def resume_message(path: str | Path, state: dict[str, Any], precision: str,
                   steps_per_epoch: int | None) -> str:
    """One line for the user: where the run continues and which precision trained it."""
    trained = state.get("precision_name", "unknown")
    position = f"epoch {int(state['epoch']) + 1}"
    if steps_per_epoch:
        position = (f"next: batch {int(state['window_in_epoch']) + 1}/{steps_per_epoch} of "
                    f"{position}")
    if trained == precision:
        how = f"trained with {trained}"
    else:
        how = (f"trained with {trained}, continuing in {precision}: its fp32 weights and "
               f"optimizer state carry over")
        had_scale = bool((state.get("precision") or {}).get("scaler"))
        if had_scale:
            how += "; its loss-scale state does not apply here"
    return f"resuming from {path} at step {int(state['step'])} ({position}; {how})"


def trim_metrics(path: str | Path, step: int) -> int:
    """Drop records after ``step`` from a metrics.jsonl (a killed run logged past its
    last checkpoint; the resumed run logs those steps again). Returns how many went."""
    path = Path(path)
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
            keep = int(record.get("step", 0)) <= step
        except (ValueError, TypeError, AttributeError):  # a line cut short by a kill
            keep = False
        if keep:
            kept.append(line)
        else:
            dropped += 1
    if dropped:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, path)
        log.info("%s: dropped %d records logged after step %d (the resumed run logs them again)",
                 path, dropped, step)
    return dropped


def saved_so_far(out: str | Path) -> str:
    """What a run in ``out`` can continue from, said truthfully for a message about a
    failed write: its last checkpoint, or that none was saved."""
    directory = Path(out) / CHECKPOINT_DIR
    found = [p for p in (directory / LAST,) if p.is_file()] + step_checkpoints(directory)[-1:]
    shards = sharded.latest_sharded(directory)
    if found or shards is not None:
        latest = found[0] if found else shards
        return f"its last checkpoint {latest} is intact"
    return "no checkpoint was saved yet"
