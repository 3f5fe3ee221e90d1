"""The model registry and what factories share: the data facts, option parsing and
checks that a model fits the kind of data.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from ..common.errors import UserError
from ..common.registry import Registry


@dataclass(frozen=True)
class ModelInputs:
    """What a model factory knows about the data."""

    num_classes: int
    input_shape: tuple[int, ...]
    kind: str = "image"             # "image", "sequence", "features" or "tokens"
    vocab_size: int | None = None

    def __post_init__(self) -> None:
        # Next-token blocks were the data kind "lm" (the task's name) in checkpoints
        # written before they got a name of their own.
        if self.kind in LEGACY_KINDS:
            object.__setattr__(self, "kind", LEGACY_KINDS[self.kind])


#: Old data-kind names (in older checkpoints' run info) -> today's.
LEGACY_KINDS = {"lm": "tokens"}


ModelFactory = Callable[[str, ModelInputs], nn.Module]
MODELS: Registry[ModelFactory] = Registry("--model")

#: A model may offer ``model.amptrain_export(out_dir, fp32_state, info) -> Path``: after
#: training :func:`amptrain.workflows.export.export_trained` (``runner.run_training``, rank
#: 0) calls it with the trained fp32 weights and the run's info (model spec, task, class
#: names), so a
#: model from another framework is written back in that framework's format (``keras:``
#: writes DIR/model.keras, ``hf:`` DIR/hf/); ``amptrain export --format NAME`` calls it
#: for a checkpoint, NAME being the model's ``amptrain_export_format``. Every model gets
#: DIR/model.safetensors besides (amptrain.workflows.export).
EXPORT_HOOK = "amptrain_export"
EXPORT_FORMAT = "amptrain_export_format"
Exporter = Callable[[Path, dict[str, torch.Tensor], dict[str, Any]], Path]


def exporter_of(model: nn.Module) -> Exporter | None:
    """The model's export hook (:data:`EXPORT_HOOK`), or None."""
    hook = getattr(model, EXPORT_HOOK, None)
    return hook if callable(hook) else None


def export_format_of(model: nn.Module) -> str | None:
    """The name of the format the model's export hook writes (``hf``, ``keras``), or None."""
    if exporter_of(model) is None:
        return None
    return str(getattr(model, EXPORT_FORMAT, None) or "native")


def set_exporter(model: nn.Module, format: str, export: Exporter) -> None:
    """Give ``model`` an export hook writing ``format`` (see :data:`EXPORT_HOOK`)."""
    setattr(model, EXPORT_HOOK, export)
    setattr(model, EXPORT_FORMAT, format)


#: Models that bring their own tokenizer for text data: name -> factory(argument) of a
#: :class:`~amptrain.data.text.TextEncoder` (``hf`` registers one).
TextEncoderFactory = Callable[..., Any]  # (argument, option="model") -> a TextEncoder
TEXT_ENCODERS: Registry[TextEncoderFactory] = Registry("tokenizer")

#: The task a model trains when ``--task`` is ``auto`` (a model that is a generator and a
#: discriminator trains ``gan``); models not listed train what their data is for.
MODEL_TASKS: dict[str, str] = {}


def register(name: str, *, task: str | None = None) -> Callable[[ModelFactory], ModelFactory]:
    """``@register("name")``: add a factory to :data:`MODELS`; ``task``: the task the model
    trains under ``--task auto`` (:data:`MODEL_TASKS`)."""
    if task is not None:
        MODEL_TASKS[name] = task
    return MODELS.register(name)


def task_of_model(spec: str) -> str | None:
    """The task the model ``spec`` (``name:argument``) trains by itself, or None."""
    return MODEL_TASKS.get(spec.partition(":")[0])

#: ``@register_text_encoder("name")``: a tokenizer factory for the models called ``name``.
register_text_encoder = TEXT_ENCODERS.register


def text_encoder_for(spec: str, option: str = "model") -> Any:
    """The tokenizer the model ``spec`` brings for text data, or None (the built-in one).

    The runner hands it to the data as ``DataOptions.text_encoder``, so the data never
    needs to know which library the tokenizer comes from.
    """
    factory, argument = TEXT_ENCODERS.find(spec)
    if factory is None:
        return None
    # Errors name the option that named the tokenizer (--tokenizer hf:DIR or --model hf:DIR).
    return factory(argument, option=option)


def build_model(spec: str, inputs: ModelInputs) -> nn.Module:
    """Build the model named by ``spec`` (``name`` or ``name:argument``) for ``inputs``."""
    factory, argument = MODELS.lookup(spec)
    return factory(argument, inputs)


def is_conv_net(model: nn.Module) -> bool:
    """True when the model has 2-d convolutions (channels_last helps those)."""
    return any(isinstance(m, nn.Conv2d) for m in model.modules())


_A_TYPE = {int: "an integer", float: "a number", str: "a string"}


def parse_options(argument: str, defaults: dict[str, Any], spec: str,
                  positional: str | None = None) -> dict[str, Any]:
    """Parse ``key=value,...`` against typed defaults (``--model transformer:layers=4``).

    A bare value sets the ``positional`` option (``--model cnn:64`` is ``cnn:width=64``).
    """
    values = dict(defaults)
    for item in filter(None, argument.split(",")):
        key, eq, raw = item.partition("=")
        if not eq and positional is not None:
            key, raw = positional, item
        elif not eq or key not in defaults:
            listed = ", ".join(f"{k}={v}" for k, v in defaults.items()) or "none"
            raise UserError(f"--model {spec}: unknown option {item!r}; options are {listed}")
        kind = type(defaults[key])
        try:
            values[key] = kind(raw)
        except ValueError:
            raise UserError(f"--model {spec}: {key} must be {_A_TYPE[kind]} "
                            f"(got {raw!r})") from None
        if isinstance(values[key], (int, float)) and values[key] < 0:
            raise UserError(f"--model {spec}: {key} must not be negative (got {raw})")
    return values


def require_positive(values: dict[str, Any], spec: str, *names: str) -> None:
    """A UserError naming the option when a size option is below 1."""
    for name in names:
        if values[name] < 1:
            raise UserError(f"--model {spec}: {name} must be >= 1 (got {values[name]})")


def image_channels(inputs: ModelInputs, spec: str) -> int:
    """The channel count of image data, or a UserError saying which models fit instead."""
    if inputs.kind != "image" or len(inputs.input_shape) != 3:
        instead = "mlp" if inputs.kind == "image" else _FITS.get(inputs.kind, "mlp")
        raise UserError(f"--model {spec} needs images (channels x height x width); this data "
                        f"is {inputs.kind} of shape {tuple(inputs.input_shape)}: try "
                        f"--model {instead}")
    return inputs.input_shape[0]


def sequence_vocab(inputs: ModelInputs, spec: str) -> int:
    """The vocabulary size of token data, or a UserError saying which models fit instead."""
    if inputs.kind != "sequence" or len(inputs.input_shape) != 1 or not inputs.vocab_size:
        instead = "mlp" if inputs.kind == "sequence" else _FITS.get(inputs.kind, "mlp")
        raise UserError(f"--model {spec} needs token sequences (e.g. --data csv-text:FILE or "
                        f"synthetic-seq); this data is {inputs.kind} of shape "
                        f"{tuple(inputs.input_shape)}: try "
                        f"--model {instead}")
    return int(inputs.vocab_size)


#: Which built-in models fit a kind of data (for the errors above).
_FITS = {"image": "cnn or resnet18", "features": "mlp", "sequence": "lstm or transformer",
         "tokens": "gpt", "env-discrete": "actor-critic", "env-continuous": "actor-critic"}
