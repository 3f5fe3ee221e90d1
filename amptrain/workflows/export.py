"""Trained models handed back: ``DIR/model.safetensors`` for every model, and the model's
own format (``hf/``, ``model.keras``) for models that bring an export hook.

After training, :func:`export_trained` (called by ``runner.run_training`` on rank 0)
writes the fp32 weights as safetensors with ``DIR/model.json`` beside them (what the
weights belong to: model spec, task, classes, amptrain version), then calls the model's
hook (:data:`~amptrain.models.core.EXPORT_HOOK`) generically. :func:`export_checkpoint`
(``amptrain export``) does the same for an existing checkpoint, in one chosen format.

Tied weights (one tensor under two names, as a tied LM head) are written once: safetensors
refuses shared storage, so the second name is recorded as an alias in the file's metadata
and :func:`load_safetensors` restores it. Nothing that exists already is overwritten.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..version import __version__
from ..common.errors import UserError, flag
from ..common.pathkind import not_regular_reason
from ..models.core import export_format_of
from ..models.core import exporter_of
from ..common import outdir
from .saved_run import checkpoint_file, open_run

log = logging.getLogger("amptrain")

SAFETENSORS_NAME = "model.safetensors"
INFO_NAME = "model.json"
#: ``--dtype`` -> the dtype floating tensors are written in.
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
#: The formats every model has (the others are named by the models' hooks).
BUILT_IN_FORMATS = ("safetensors",)
#: safetensors is a base dependency: an install without it is broken, and this says how to mend it.
INSTALL = "pip install 'safetensors>=0.4' (a dependency of amptrain that this install lacks)"
#: What each format writes under the output directory (never over what is there).
TARGETS = {"safetensors": (SAFETENSORS_NAME, INFO_NAME), "hf": ("hf",),
           "keras": ("model.keras",)}


def _safetensors() -> Any:
    try:
        import safetensors.torch
    except ImportError:
        raise UserError(f"writing or reading {SAFETENSORS_NAME} needs the safetensors "
                        f"package: {INSTALL}") from None
    return safetensors.torch


def model_info(info: dict[str, Any], *, dtype: str, source: str | None = None,
               step: int | None = None, aliases: dict[str, str] | None = None) -> dict[str, Any]:
    """The JSON written beside the weights: what they belong to and how to read them."""
    return {"format": "amptrain safetensors", "amptrain_version": __version__,
            "model": info.get("model"), "task": info.get("task"),
            "class_names": info.get("class_names"), "inputs": info.get("inputs"),
            "data": info.get("data"), "dtype": dtype, "step": step, "source": source,
            "aliases": aliases or {}}


def _aliases(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(state without repeated tensors, {repeated name: the name kept})."""
    kept: dict[tuple, str] = {}
    unique: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    for name, tensor in state.items():
        key = (tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset(),
               tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)
        if tensor.numel() and key in kept:
            aliases[name] = kept[key]
        else:
            kept.setdefault(key, name)
            unique[name] = tensor
    return unique, aliases


def cast_state(state: dict[str, torch.Tensor], dtype: str) -> dict[str, torch.Tensor]:
    """Floating tensors in ``dtype`` (``fp32``/``bf16``), on the CPU; others as they are.
    Tensors that shared storage still do after the cast."""
    target = DTYPES[dtype]
    done: dict[int, torch.Tensor] = {}
    out = {}
    for name, tensor in state.items():
        key = id(tensor)
        if key not in done:
            t = tensor.detach().cpu()
            done[key] = t.to(target) if t.is_floating_point() else t
        out[name] = done[key]
    return out


def write_safetensors(out_dir: str | Path, state: dict[str, torch.Tensor],
                      info: dict[str, Any], *, dtype: str = "fp32", source: str | None = None,
                      step: int | None = None, replace: bool = True) -> Path:
    """``out_dir/model.safetensors`` and ``out_dir/model.json``, through the one writer
    (:func:`amptrain.common.outdir.write_file`): whole or not at all, a full disk in one
    line. ``replace``: files there may be replaced (a resumed run's own earlier export)."""
    st = _safetensors()
    out_dir = Path(out_dir)
    unique, aliases = _aliases(cast_state(state, dtype))
    unique = {k: v.contiguous() for k, v in unique.items()}
    metadata = {"format": "pt", "amptrain_model": str(info.get("model")),
                "amptrain_aliases": json.dumps(aliases)}
    target = outdir.write_file(out_dir / SAFETENSORS_NAME,
                               lambda p: st.save_file(unique, str(p), metadata=metadata),
                               replace=replace)
    description = model_info(info, dtype=dtype, source=source, step=step, aliases=aliases)
    outdir.write_text(out_dir / INFO_NAME, json.dumps(description, indent=2) + "\n",
                      replace=replace)
    return target


def _exported(model: nn.Module, out_dir: Path, state: dict[str, torch.Tensor],
              info: dict[str, Any]) -> Path:
    """The model's own format by its hook (hf/, model.keras), which writes beside and
    renames; a full disk there is the one writer's line naming what it was writing."""
    export = exporter_of(model)
    assert export is not None  # the model names a format
    format = export_format_of(model)
    with outdir.writing(out_dir / TARGETS.get(str(format), (str(format),))[0]):
        return export(out_dir, state, info)


def load_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """A ``model.safetensors`` written here, with its aliases (tied weights) restored."""
    st = _safetensors()
    from safetensors import SafetensorError, safe_open


    special = not_regular_reason(path)
    if special:
        raise UserError(special)
    if not Path(path).is_file():
        raise UserError(f"{path}: no such file")
    try:  # safetensors bounds its header (100 MB) and checks every offset itself
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
        state = st.load_file(str(path))
        aliases = json.loads(metadata.get("amptrain_aliases", "{}"))
    except (SafetensorError, ValueError, OSError) as exc:
        text = str(exc).strip().splitlines()
        reason = text[0][:160] if text else type(exc).__name__
        raise UserError(f"{path}: not a readable safetensors file ({reason}; a damaged "
                        f"file)") from None
    if not isinstance(aliases, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and v in state for k, v in aliases.items()):
        raise UserError(f"{path}: its amptrain_aliases name tensors the file does not hold "
                        f"(a damaged or hand-edited file)")
    for alias, name in aliases.items():
        state[alias] = state[name]
    return state


def export_formats(model: nn.Module) -> tuple[str, ...]:
    """The formats ``model`` can be exported in: safetensors, and its hook's format."""

    own = export_format_of(model)
    return BUILT_IN_FORMATS + ((own,) if own else ())


def export_trained(out_dir: str | Path, model: nn.Module, state: dict[str, torch.Tensor],
                   info: dict[str, Any], *, step: int | None = None,
                   replace: bool = False) -> list[Path]:
    """After training: safetensors for every model, then the model's own format.

    A file already there is left alone with a warning (it is not this run's), unless
    ``replace`` (a resumed run replaces what its earlier part wrote).
    """

    out_dir = Path(out_dir)
    written: list[Path | None] = []
    for format in export_formats(model):
        taken = [name for name in TARGETS.get(format, ()) if (out_dir / name).exists()]
        if taken and not replace:
            log.warning("%s: %s left as it is (not written by this run); write the %s export "
                        "elsewhere with amptrain export --format %s --out DIR", out_dir,
                        ", ".join(taken), format, format)
        elif format == "safetensors":
            written.append(write_safetensors(out_dir, state, info, step=step,
                                             replace=replace))
        elif format == export_format_of(model):
            written.append(_exported(model, out_dir, state, info))
    return [p for p in written if p is not None]


# ------------------------------------------------------------ an existing run


def default_out(checkpoint_path: Path) -> Path:
    """``RUN/export-<checkpoint>``: beside the run's checkpoints (``runs/x/export-step-40``)."""
    parent = checkpoint_path.parent
    run_dir = parent.parent if parent.name == "checkpoints" else parent
    return run_dir / f"export-{checkpoint_path.stem}"


def export_checkpoint(checkpoint: str | Path, format: str, out: str | Path | None = None,
                      dtype: str = "fp32") -> tuple[Path, list[Path]]:
    """Export a checkpoint written by ``amptrain train`` (or a run directory's last one)
    as ``format``; returns (output directory, files written)."""

    if dtype not in DTYPES:
        raise UserError(f"{flag('dtype')} {dtype}: choose one of {', '.join(DTYPES)}")
    path = checkpoint_file(checkpoint)
    if not path.is_file():
        raise UserError(f"{flag('checkpoint')} {checkpoint}: no such file")
    saved = open_run(path)
    state, run = saved.state, saved.run
    try:
        model = saved.build_model()
    except UserError as exc:
        raise UserError(f"cannot rebuild the model of {path} ({run['model']}) to export it: "
                        f"{exc}") from None
    formats = export_formats(model)
    if format not in formats:
        raise UserError(f"{flag('format')} {format}: the model {run['model']} cannot be exported "
                        f"as {format}; it exports as {' or '.join(formats)}")
    if format == "keras" and dtype != "fp32":
        raise UserError(f"{flag('dtype')} {dtype}: a Keras model is exported with fp32 "
                        f"weights; drop {flag('dtype')} or use {flag('format')} safetensors")
    weights = state["model"]
    missing = [k for k in model.state_dict() if k not in weights]
    if missing:
        raise UserError(f"checkpoint {path} does not fit the rebuilt {run['model']}: "
                        f"{', '.join(missing[:3])} missing")
    out_dir = Path(out) if out is not None else default_out(path)
    taken = [name for name in TARGETS.get(format, ()) if (out_dir / name).exists()]
    if taken:
        raise UserError(f"{flag('out')} {out_dir} already holds {', '.join(taken)}; amptrain "
                        f"never overwrites it: choose another {flag('out')}")
    outdir.make_run_dir(out_dir, resume=True)  # writable, not a file; a run there is fine
    step = state.get("step")
    info = {**run, "step": step}
    if format == "safetensors":
        written = write_safetensors(out_dir, weights, info, dtype=dtype, source=str(path),
                                    step=step, replace=False)
        return out_dir, [written, out_dir / INFO_NAME]
    return out_dir, [_exported(model, out_dir, cast_state(weights, dtype), info)]
