"""The sections every amptrain checkpoint holds, checked when one is read.

A file can pass the format check (it is ours, of a known version) and still lack a
section or hold one of the wrong type: edited by hand, written by a tool that copied only
part of it, or crafted. Every command that reads a checkpoint gets one line naming the
file and the section instead of a ``KeyError`` deep in a loader.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..common.errors import UserError
from ..common.nested import tensors

#: section -> the types it may have; ``None`` among them: the section may be None.
REQUIRED: dict[str, tuple[type | None, ...]] = {
    "model": (dict,), "step": (int,), "epoch": (int,), "window_in_epoch": (int,),
    "config": (dict,),
}
#: Sections older checkpoints may lack; when present they must have these types. The
#: parts' own sections (registry.py) come with ``sections``, their layout versions;
#: ``optimizer``, ``scheduler`` and ``log_window`` are those of files of format 1.
OPTIONAL: dict[str, tuple[type | None, ...]] = {
    "optimizer": (dict,), "scheduler": (dict, None), "precision": (dict,), "task": (dict,),
    "run": (dict,), "rng": (dict,), "log_window": (dict, None), "precision_name": (str,),
    "steps_per_epoch": (int, None), "sections": (dict,), "position": (dict,),
    "log_interval": (dict,), "optimizers": (dict,),
}


def _type_name(kinds: tuple[type | None, ...]) -> str:
    return " or ".join("None" if k is None else k.__name__ for k in kinds)


def check_sections(state: dict[str, Any], path: str | Path) -> None:
    """Raise :class:`UserError` naming ``path`` and the section that is missing or of the
    wrong type; the model's weights must all be tensors."""
    for name, kinds in (*REQUIRED.items(), *OPTIONAL.items()):
        if name not in state:
            if name in REQUIRED:
                raise UserError(f"checkpoint {path}: its '{name}' section is missing (a "
                                f"damaged or hand-edited file); use a checkpoint that "
                                f"amptrain wrote")
            continue
        value = state[name]
        ok = any(value is None if k is None else
                 isinstance(value, k) and not (k is int and isinstance(value, bool))
                 for k in kinds)
        if not ok:
            raise UserError(f"checkpoint {path}: its '{name}' section is a "
                            f"{type(value).__name__}, not a {_type_name(kinds)} (a damaged "
                            f"or hand-edited file)")
    _check_values(state, path)
    for key, value in state["model"].items():
        if not isinstance(value, torch.Tensor):
            raise UserError(f"checkpoint {path}: model entry '{key}' is a "
                            f"{type(value).__name__}, not a tensor (a damaged or hand-edited "
                            f"file)")
    for tensor in tensors(state):
        _check_backed(tensor, path)


def _check_backed(tensor: torch.Tensor, path: str | Path) -> None:
    """A tensor whose shape asks for more elements than its stored data holds (an edited
    size or a zero stride) would allocate that much the moment anything copies it: refused
    before then (amptrain writes every tensor with its own data)."""
    needed = tensor.numel() * tensor.element_size()
    held = tensor.untyped_storage().nbytes()
    if needed > held:
        raise UserError(f"checkpoint {path}: a tensor of shape {tuple(tensor.shape)} asks for "
                        f"{needed:,} bytes but the file holds {held:,} for it (a damaged or "
                        f"hand-edited file)")


#: A count no run reaches (steps, epochs, batches): an edited checkpoint beyond it is
#: refused instead of training "10^18 steps".
MAX_COUNT = 10 ** 12
#: Config values that must be positive whole numbers when a checkpoint holds them.
_POSITIVE_CONFIG = ("batch_size", "epochs", "seq_len", "max_steps", "accumulate",
                    "log_every", "keep_last")


def _check_values(state: dict[str, Any], path: str | Path) -> None:
    """The ranges of the position counters, the config's counts and the RNG states' types:
    a checkpoint edited to hold step -5 or a batch size of -1 is a damaged file (not a run
    to continue, nor "resume with --batch-size -1")."""
    def damaged(what: str) -> UserError:
        return UserError(f"checkpoint {path}: {what} (a damaged or hand-edited file)")

    position = state.get("position") or {}
    for name in ("step", "epoch", "window_in_epoch", "steps_per_epoch", "step_epoch"):
        for value in (state.get(name), position.get(name)):
            if value is not None and not (isinstance(value, int) and 0 <= value <= MAX_COUNT):
                raise damaged(f"its '{name}' is {value}, outside 0..{MAX_COUNT}")
    for name, version in (state.get("sections") or {}).items():
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise damaged(f"its '{name}' section has layout {version!r}")
    config = state["config"]
    for name in _POSITIVE_CONFIG:
        value = config.get(name)
        if value is None or name == "keep_last" and value == 0:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= MAX_COUNT:
            raise damaged(f"its config holds {name}: {value!r}, not a positive whole number")
    rng = state.get("rng") or {}
    kinds: dict[str, type | tuple[type, ...]] = {
        "python": tuple, "numpy": dict, "torch": torch.Tensor, "cuda": (list, tuple)}
    for name, value in rng.items():
        kind = kinds.get(name)
        if kind is None or not isinstance(value, kind):
            raise damaged(f"its RNG state '{name}' is a {type(value).__name__}")
    python = rng.get("python")
    if python is not None and not (len(python) == 3 and isinstance(python[1], tuple)
                                   and all(isinstance(v, int) for v in python[1])):
        raise damaged("its Python RNG state is not a Mersenne Twister state")
    numpy_state = rng.get("numpy")
    if numpy_state is not None and not (
            isinstance(numpy_state.get("keys"), torch.Tensor)
            and tuple(numpy_state["keys"].shape) == (624,)
            and all(isinstance(numpy_state.get(k), t) for k, t in
                    (("kind", str), ("pos", int), ("has_gauss", int),
                     ("cached_gaussian", float)))):
        raise damaged("its numpy RNG state is not a Mersenne Twister state")
    generator = rng.get("torch")
    if generator is not None and (generator.dtype != torch.uint8 or generator.dim() != 1):
        raise damaged(f"its torch RNG state is a {generator.dtype} tensor of shape "
                      f"{tuple(generator.shape)}, not bytes")


def nonfinite_weights(weights: dict[str, torch.Tensor]) -> list[str]:
    """Names of the floating-point tensors in ``weights`` holding NaN or infinity."""
    return [name for name, value in weights.items()
            if value.is_floating_point() and not bool(torch.isfinite(value).all())]


def check_finite_weights(weights: dict[str, torch.Tensor], path: str | Path,
                         option: str = "--checkpoint") -> None:
    """Refuse weights that hold NaN or infinity: whatever they compute is garbage."""
    bad = nonfinite_weights(weights)
    if bad:
        raise UserError(f"{option} {path} holds non-finite weights ({len(bad)} of "
                        f"{len(weights)} tensors, e.g. '{bad[0]}'): the run diverged before "
                        f"this checkpoint; use an earlier one (OUT/checkpoints/step-N.pt)")
