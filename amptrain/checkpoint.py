"""Checkpoint files: written atomically, validated when read, found again on resume.

A checkpoint is a dict saved with ``torch.save``; ``format`` marks it as ours. Weights
are always fp32 (master copies where the precision keeps them), so a checkpoint loads
in any precision and without the libraries a precision needed. Everything in it is a
tensor or a plain Python value, so it is read with ``weights_only=True``: opening a file
never runs code from it.

The Trainer decides *what* goes into a checkpoint (``Trainer.state_dict``); this module
decides how it reaches the disk, how it is read back and checked, and which file
``--resume`` continues from.
"""
from __future__ import annotations

import contextlib
import errno as errno_names
import json
import logging
import os
import pickle
import random
import re
import secrets
import time
import zipfile
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from .errors import AmptrainError, UserError

log = logging.getLogger("amptrain")

FORMAT = "amptrain-checkpoint"
FORMAT_VERSION = 1
CHECKPOINT_DIR = "checkpoints"
LAST = "last.pt"
_STEP_FILE = re.compile(r"step-(\d+)\.pt$")
# Leftovers of a write that never finished: atomic_save's temporary file, _link_or_copy's link.
_UNFINISHED = re.compile(r"^\..+\.pt\.(?:[^.]+\.tmp|link)$")
_ZIP_MAGIC = b"PK\x03\x04"

#: Fault injection for tests: ``N`` or ``N:SECONDS`` pauses the N-th checkpoint write of
#: the process for SECONDS (default 120) after its first bytes reach the temporary file,
#: so that a test can kill a real training process in the middle of a save.
SLOW_SAVE_ENV = "AMPTRAIN_FAULT_SLOW_SAVE"
_writes_started = 0

#: Optimizer group entries that describe how this process runs the optimizer (kernel
#: choice, the precision layer's Adam eps floor), not the training state: the running
#: optimizer keeps its own values when a checkpoint is loaded.
RUNTIME_GROUP_KEYS = ("eps", "fused", "foreach", "capturable", "differentiable")

#: Config fields that change the rest of the run's trajectory when they differ on resume.
INEXACT_IF_CHANGED = ("data", "seed", "epochs", "max_steps", "lr", "scheduler", "warmup_steps",
                      "weight_decay", "momentum", "clip_grad_norm", "val_fraction")


class CheckpointWriteError(AmptrainError):
    """A checkpoint could not be written (disk full, no permission); the old one is intact."""

    exit_code = 1


# ------------------------------------------------------------------- writing
def atomic_save(state: dict[str, Any], path: str | Path) -> None:
    """Write ``state`` to ``path`` so that a crash leaves either the old file or the new one.

    The bytes go to a temporary file in the same directory, are fsynced, and then
    renamed over the target; the directory is fsynced so the rename itself survives.
    A failed write (disk full, read-only directory) removes the temporary file and
    raises :class:`CheckpointWriteError`; ``path`` is untouched.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = _create_temporary(path)
    except OSError as exc:
        raise CheckpointWriteError(_write_failure(path, exc)) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            _write(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        # torch.save reports a failed write() of the file object as a RuntimeError whose
        # context is the real error: the OSError (disk full), or the SystemExit /
        # KeyboardInterrupt of a second signal, which must keep ending the process.
        cause = _root_cause(exc)
        if not isinstance(cause, Exception):
            raise cause from None
        if isinstance(cause, OSError):
            raise CheckpointWriteError(_write_failure(path, cause)) from None
        raise
    with contextlib.suppress(OSError):  # the file is in place; some file systems refuse this
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _create_temporary(path: Path) -> tuple[int, str]:
    """A new file next to ``path``. Unlike ``mkstemp`` (mode 0600) it gets the umask's
    permissions, so the checkpoint is as readable as any other file the user writes."""
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), str(tmp)
        except FileExistsError:
            continue


def _root_cause(exc: BaseException) -> BaseException:
    seen = exc
    while seen is not None:
        if isinstance(seen, OSError) or not isinstance(seen, Exception):
            return seen
        seen = seen.__cause__ or seen.__context__
    return exc


def _write_failure(path: Path, exc: OSError) -> str:
    code = errno_names.errorcode.get(exc.errno or 0)
    reason = f"{exc.strerror or exc}" + (f" ({code})" if code else "")
    kept = (f"the previous checkpoint {path} is intact" if path.exists()
            else "no earlier checkpoint was there")
    return (f"could not write checkpoint {path}: {reason}; {kept}. Free disk space or make "
            f"{path.parent} writable, then continue with --resume auto")


def _write(state: dict[str, Any], handle: BinaryIO) -> None:
    """``torch.save`` into an open file (the seam that fault-injection tests patch)."""
    global _writes_started
    _writes_started += 1
    spec = os.environ.get(SLOW_SAVE_ENV)
    if spec:
        nth, _, seconds = spec.partition(":")
        if int(nth) == _writes_started:
            handle = _PausingWriter(handle, float(seconds or 120))  # type: ignore[assignment]
    torch.save(state, handle)


class _PausingWriter:
    """Passes bytes through, but sleeps after the first write (see :data:`SLOW_SAVE_ENV`)."""

    def __init__(self, handle: BinaryIO, seconds: float) -> None:
        self.handle, self.seconds, self.paused = handle, seconds, False

    def write(self, data: bytes) -> int:
        written = self.handle.write(data)
        if not self.paused:
            self.paused = True
            self.handle.flush()
            time.sleep(self.seconds)
        return written

    def flush(self) -> None:
        self.handle.flush()


def save_run_checkpoint(state: dict[str, Any], directory: str | Path, step: int,
                        keep_last: int) -> Path:
    """Write ``last.pt`` atomically, keep it as ``step-N.pt`` too, prune old step files.

    ``step-N.pt`` is a hard link to the new ``last.pt`` (one write, not two); the next
    save replaces ``last.pt`` with a new file and the link keeps the old bytes. Failing
    to make the step file or to prune only warns: ``last.pt`` is already safe.
    """
    directory = Path(directory)
    last = directory / LAST
    atomic_save(state, last)
    try:
        if keep_last > 0:
            _link_or_copy(last, directory / f"step-{step}.pt")
        prune(directory, keep_last)
    except OSError as exc:
        log.warning("wrote %s, but could not keep step-%d.pt or prune old ones: %s",
                    last, step, exc.strerror or exc)
    return last


def _link_or_copy(source: Path, target: Path) -> None:
    tmp = target.with_name(f".{target.name}.link")
    tmp.unlink(missing_ok=True)
    try:
        os.link(source, tmp)
    except OSError:  # file systems without hard links
        import shutil

        shutil.copyfile(source, tmp)
    os.replace(tmp, target)


def step_checkpoints(directory: str | Path) -> list[Path]:
    """``step-N.pt`` files in ``directory``, oldest step first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _STEP_FILE.search(p.name))]
    return [p for _, p in sorted(found)]


def prune(directory: str | Path, keep_last: int) -> None:
    """Delete all but the newest ``keep_last`` step-N.pt files."""
    files = step_checkpoints(directory)
    for old in files[:max(0, len(files) - keep_last)]:
        old.unlink(missing_ok=True)


def remove_unfinished(directory: str | Path) -> list[Path]:
    """Delete temporary files left by a save that was killed; returns what was removed."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    removed = []
    for leftover in directory.iterdir():
        if _UNFINISHED.match(leftover.name) and leftover.is_file():
            with contextlib.suppress(OSError):
                leftover.unlink()
                removed.append(leftover)
    return removed


# ------------------------------------------------------------------- reading
def load(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read and validate an amptrain checkpoint; any problem is a one-line UserError."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint {path}: no such file")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError,
            OSError, AttributeError, ImportError, IndexError, KeyError, TypeError) as exc:
        raise UserError(f"checkpoint {path}: {_unreadable(path, exc)}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise UserError(f"checkpoint {path}: not an amptrain checkpoint ({_describe(state)}); "
                        f"--resume and eval need a file that amptrain wrote, such as "
                        f"OUT/{CHECKPOINT_DIR}/{LAST}")
    if state.get("format_version", 0) > FORMAT_VERSION:
        raise UserError(f"checkpoint {path}: written by a newer amptrain "
                        f"(format {state.get('format_version')}); upgrade amptrain")
    return state


def _unreadable(path: Path, exc: BaseException) -> str:
    with open(path, "rb") as handle:
        head = handle.read(4)
    if head == _ZIP_MAGIC and not zipfile.is_zipfile(path):
        return "truncated (its end is missing: an interrupted copy or write?)"
    if head == _ZIP_MAGIC and "Weights only load failed" in str(exc):
        return ("holds pickled Python objects, not an amptrain checkpoint (which holds only "
                "tensors and plain values)")
    if head == _ZIP_MAGIC:
        return f"damaged PyTorch file ({type(exc).__name__})"
    return "not a PyTorch checkpoint file (unreadable bytes)"


def _describe(state: Any) -> str:
    if isinstance(state, dict) and state \
            and all(isinstance(v, torch.Tensor) for v in state.values()):
        return f"a bare state_dict of {len(state)} tensors"
    if isinstance(state, dict):
        keys = ", ".join(map(str, list(state)[:4]))
        return f"a dict with keys {keys}" if keys else "an empty dict"
    return f"a {type(state).__name__}"


def weights_mismatch(expected: dict[str, torch.Tensor], found: dict[str, Any]) -> str | None:
    """The first difference between a model's state_dict and a checkpoint's, or None."""
    for key, value in expected.items():
        if key not in found:
            return f"the model's '{key}' is missing from the checkpoint"
        other = found[key]
        if isinstance(value, torch.Tensor) and isinstance(other, torch.Tensor) \
                and value.shape != other.shape:
            return (f"'{key}' has shape {tuple(other.shape)} in the checkpoint but "
                    f"{tuple(value.shape)} in the model")
    extra = [key for key in found if key not in expected]
    if extra:
        return f"the checkpoint's '{extra[0]}' is not in the model"
    return None


def load_optimizer_state(optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
    """Load a checkpoint's optimizer state into ``optimizer``, whatever precision wrote it.

    State is keyed by parameter position, which is the same with or without fp32 master
    copies (the masters take their parameters' places), and torch casts moments to each
    parameter's dtype. The entries in :data:`RUNTIME_GROUP_KEYS` keep this optimizer's
    values: they belong to the current precision and device, not to the run.
    """
    runtime = [{k: g[k] for k in RUNTIME_GROUP_KEYS if k in g} for g in optimizer.param_groups]
    sizes = [len(g["params"]) for g in optimizer.param_groups]
    saved_sizes = [len(g["params"]) for g in saved.get("param_groups", [])]
    if sizes != saved_sizes:
        raise UserError(f"the checkpoint's optimizer has parameter groups of sizes {saved_sizes}, "
                        f"this one {sizes}: a different model or optimizer setup")
    try:
        optimizer.load_state_dict(saved)
    except (ValueError, KeyError, RuntimeError) as exc:
        raise UserError(f"the checkpoint's optimizer state does not fit: "
                        f"{str(exc).strip().splitlines()[0]}") from None
    for group, kept in zip(optimizer.param_groups, runtime):
        group.update(kept)
        if not (group.get("fused") or group.get("capturable")):
            # Plain kernels keep the step count as a CPU scalar; fused ones on the device.
            for param in group["params"]:
                step = optimizer.state.get(param, {}).get("step")
                if isinstance(step, torch.Tensor) and step.device.type != "cpu":
                    optimizer.state[param]["step"] = step.to("cpu", torch.float32)


# ------------------------------------------------------------------------ RNG
def capture_rng() -> dict[str, Any]:
    """Python, numpy, torch and CUDA generator states, as tensors and plain values."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    rng: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def restore_rng(rng: dict[str, Any]) -> None:
    """Undo :func:`capture_rng` (CUDA states only where CUDA is available)."""
    if "python" in rng:
        random.setstate(rng["python"])
    numpy_state = rng.get("numpy")
    if isinstance(numpy_state, dict):
        np.random.set_state((numpy_state["kind"], numpy_state["keys"].numpy().astype(np.uint32),
                             numpy_state["pos"], numpy_state["has_gauss"],
                             numpy_state["cached_gaussian"]))
    if "torch" in rng:
        torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        states = rng["cuda"]
        if len(states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(states)
        else:
            log.warning("checkpoint has CUDA RNG states for %d devices, this process sees %d: "
                        "CUDA random streams restart", len(states), torch.cuda.device_count())


# --------------------------------------------------------------------- resume
def find_resume(target: str, out: str | Path | None, *, cleanup: bool = True
                ) -> tuple[Path, dict[str, Any]] | None:
    """The checkpoint ``--resume TARGET`` means, loaded: (path, state), or None to start fresh.

    ``auto`` takes the latest valid checkpoint under ``OUT/checkpoints`` (None when there
    is none yet); a directory means the same inside it; anything else is a file path.
    ``cleanup`` deletes leftovers of a save that was killed half-way.
    """
    if target == "auto":
        if out is None:
            raise UserError("--resume auto needs --out (the run directory to continue)")
        directory = Path(out) / CHECKPOINT_DIR
        if cleanup:
            for leftover in remove_unfinished(directory):
                log.info("removed %s, left by a checkpoint write that never finished", leftover)
        found = latest_valid(directory)
        if found is None:
            log.info("--resume auto: no checkpoint in %s, starting fresh", directory)
        return found
    path = Path(target)
    if path.is_dir():
        directory = path / CHECKPOINT_DIR if (path / CHECKPOINT_DIR).is_dir() else path
        found = latest_valid(directory)
        if found is None:
            raise UserError(f"--resume {path}: no checkpoint in {directory}")
        return found
    return path, load(path)


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
    saved_inputs = (state.get("run") or {}).get("inputs") or {}
    inputs = run_info.get("inputs") or {}
    for key, what in (("num_classes", "{} classes"), ("input_shape", "inputs of shape {}")):
        if key not in saved_inputs or key not in inputs:
            continue
        now, then = _plain(inputs[key]), _plain(saved_inputs[key])
        if now != then:
            raise UserError(f"--data {config.get('data')} has {what.format(now)}, but checkpoint "
                            f"{path} was trained on {what.format(then)} (--data "
                            f"{saved.get('data')}); resume with the same data")
    if "batch_size" in saved and saved["batch_size"] != config.get("batch_size"):
        raise UserError(f"--batch-size {config.get('batch_size')} differs from checkpoint {path}'s "
                        f"{saved['batch_size']}: its data position and learning-rate schedule "
                        f"count batches of {saved['batch_size']}; resume with --batch-size "
                        f"{saved['batch_size']}")
    if saved.get("optimizer") and saved["optimizer"] != config.get("optimizer"):
        raise UserError(f"--optimizer {config.get('optimizer')} differs from checkpoint {path}'s "
                        f"{saved['optimizer']}, whose optimizer state it cannot use; resume with "
                        f"--optimizer {saved['optimizer']}")
    changed = [f"--{key.replace('_', '-')} {config[key]} (checkpoint: {saved[key]})"
               for key in INEXACT_IF_CHANGED
               if key in saved and key in config and saved[key] != config[key]]
    if changed:
        log.warning("resume is not exact: %s", ", ".join(changed))



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
