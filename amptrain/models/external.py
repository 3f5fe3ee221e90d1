"""Models from outside amptrain: the user's own factory (``module:``), ``timm:NAME`` and
``hf:PATH`` (optional packages, imported only when asked for)."""
from __future__ import annotations

import importlib
import inspect
import os
import sys
from typing import Any, Callable

from torch import nn

from ..common.errors import UserError
from .core import ModelInputs, image_channels, register, register_text_encoder


def import_factory(argument: str, spec: str, option: str = "--model") -> Callable[..., Any]:
    """``pkg.mod.factory`` (or ``pkg.mod:factory``) imported, from the current directory too;
    errors name ``option`` (``--data`` for a data factory)."""
    module_name, sep, attribute = argument.partition(":")
    if not sep:
        module_name, _, attribute = argument.rpartition(".")
    if not module_name or not attribute:
        raise UserError(f"{option} {spec}: give the factory as module:PACKAGE.MODULE.FUNCTION, "
                        f"e.g. {option} module:mymodels.build")
    if module_name.endswith(".py"):  # a file name where the import name goes
        dotted = module_name[:-3].replace(os.sep, ".").replace("/", ".").lstrip(".")
        raise UserError(f"{option} {spec}: give the module's import name, not its file: "
                        f"{option} module:{dotted}:{attribute}")
    # `python -m amptrain` puts the working directory on sys.path, the `amptrain` script
    # does not; both should find ./mymodels.py.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UserError(f"{option} {spec}: cannot import {module_name} ({exc}); is it on "
                        f"PYTHONPATH or in the current directory?") from None
    except SyntaxError as exc:
        raise UserError(f"{option} {spec}: {exc.filename}:{exc.lineno}: syntax error in "
                        f"{module_name}") from None
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise UserError(f"{option} {spec}: {module_name} has no callable {attribute!r}")
    return factory


@register("module")
def user_module(argument: str, inputs: ModelInputs) -> nn.Module:
    """``module:pkg.mod.factory``: ``factory(num_classes=..., input_shape=...)``.

    ``kind`` and ``vocab_size`` are passed as well when the factory accepts them (by name
    or through ``**kwargs``). It must return an ``nn.Module`` whose forward takes the
    inputs and returns logits (or an object/dict with ``logits`` and/or ``loss``).
    """
    spec = f"module:{argument}"
    factory = import_factory(argument, spec)
    offered = {"num_classes": inputs.num_classes, "input_shape": tuple(inputs.input_shape),
               "kind": inputs.kind, "vocab_size": inputs.vocab_size}
    try:
        signature: inspect.Signature | None = inspect.signature(factory)
    except (TypeError, ValueError):  # builtins without a signature: pass the two required
        signature = None
    parameters = signature.parameters if signature is not None else {}
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    # What it names (a class whose constructor takes nothing gets nothing: pytorch/examples'
    # Net); without a signature, the two every factory used to be given.
    kwargs = {k: v for k, v in offered.items()
              if (k in ("num_classes", "input_shape") if signature is None
                  else takes_any or k in parameters)}
    if signature is not None:
        try:
            signature.bind(**kwargs)
        except TypeError as exc:
            raise UserError(f"--model {spec}: the factory is called with those of the "
                            f"keywords num_classes, input_shape, kind and vocab_size it names "
                            f"({exc})") from None
    try:
        model = factory(**kwargs)
    except UserError:
        raise
    except Exception as exc:  # the user's code: its failure is reported, not ours
        raise UserError(f"--model {spec}: the factory raised {type(exc).__name__}: "
                        f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
                        ) from None
    if not isinstance(model, nn.Module):
        raise UserError(f"--model {spec}: the factory returned a {type(model).__name__}, "
                        f"not a torch.nn.Module")
    return model


@register("timm")
def timm_model(argument: str, inputs: ModelInputs) -> nn.Module:
    """``timm:NAME``: ``timm.create_model(NAME, num_classes=..., in_chans=...)``, untrained."""
    spec = f"timm:{argument}"
    try:
        import timm
    except ImportError:
        raise UserError(f"--model {spec} needs the timm package: pip install timm") from None
    if not argument:
        raise UserError("--model timm:NAME needs a model name, e.g. timm:resnet18")
    channels = image_channels(inputs, spec)
    if not timm.is_model(argument):
        raise UserError(f"--model {spec}: timm has no model {argument!r} "
                        f"(list them with timm.list_models())")
    return timm.create_model(argument, pretrained=False, num_classes=inputs.num_classes,
                             in_chans=channels)


@register("hf")
def hf_model(argument: str, inputs: ModelInputs) -> nn.Module:
    """``hf:PATH``: a Hugging Face sequence classifier from a local directory (see
    :mod:`amptrain.models.hf`, imported only now so that amptrain runs without transformers)."""
    return _hf(f"hf:{argument}").hf_model(argument, inputs)


@register_text_encoder("hf")
def hf_text_encoder(argument: str, option: str = "model") -> Any:
    """The tokenizer saved with an ``hf:PATH`` model (or named by ``--tokenizer hf:DIR``)."""
    return _hf(f"hf:{argument}").HFTextEncoder(argument, option=option)


def _hf(spec: str) -> Any:
    # Before transformers (and huggingface_hub) read it at import: never reach the network.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        importlib.import_module("transformers")
    except ImportError:
        raise UserError(f"--model {spec} needs the transformers package: "
                        f"pip install transformers (or pip install 'amptrain[hf]')") from None
    return importlib.import_module("amptrain.models.hf")
