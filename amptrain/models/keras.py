"""``keras:FILE.keras``: train a saved Keras 3 model on Keras's PyTorch backend.

On the torch backend a Keras model is a ``torch.nn.Module`` whose variables are torch
parameters, so amptrain trains it like any other module: every precision, DDP, exact
resume, ``compare`` and ``diagnose``. What this module adds:

* **The backend.** ``KERAS_BACKEND=torch`` is set before keras is imported; keras already
  imported with another backend (TensorFlow, JAX: not supported) is a UserError.
* **Layer names.** Keras does not register a model's layers as torch submodules, so
  :class:`KerasModule` registers each top-level layer under its Keras name: ``--keep-fp32
  dense_1``, ``diagnose`` and the halt messages speak the model's own names.
* **The data.** The model's declared input shape adapts the data when the sizes agree
  (digits 1x8x8 -> 64 features; channels-first images -> Keras's channels-last).
* **Keras's rules.** The output layer runs in fp32 by default (the model offers it through
  :data:`~amptrain.precision.islands.DEFAULT_KEEP_FP32`; ``keras:FILE,fp32_output=0`` turns
  it off). A final softmax is set aside while training (amptrain's loss takes logits). A
  mixed dtype policy saved with the model is set aside too: ``--precision`` governs.
* **The way back.** After training, ``DIR/model.keras`` holds the trained fp32 weights in
  the user's model exactly as saved (policy, softmax and all), loadable with
  ``keras.saving.load_model`` (the exporter hook, :data:`~.core.EXPORT_HOOK`).

Requires keras 3 (``pip install 'amptrain[keras]'``), imported only when used.
"""
from __future__ import annotations

import importlib
import logging
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from ..common.errors import UserError
from ..precision.islands import DEFAULT_KEEP_FP32
from .core import ModelInputs, parse_options, register, set_exporter

log = logging.getLogger("amptrain")

SUFFIXES = (".keras", ".h5", ".hdf5")
INSTALL = "pip install 'amptrain[keras]'"
EXPORT_NAME = "model.keras"
#: ``keras:FILE,option=value``: fp32_output=0 lets the output layer follow --precision.
DEFAULTS: dict[str, Any] = {"fp32_output": 1}


def split_argument(argument: str) -> tuple[str, str]:
    """``FILE.keras,opt=v`` -> (``FILE.keras``, ``opt=v``); a comma inside a path stays."""
    for suffix in SUFFIXES:
        at = argument.lower().find(suffix + ",")
        if at >= 0:
            end = at + len(suffix)
            return argument[:end], argument[end + 1:]
    return argument, ""


def import_keras(spec: str) -> Any:
    """The keras module on the torch backend, or a UserError saying what to do."""
    keras = sys.modules.get("keras")
    if keras is None:
        chosen = os.environ.get("KERAS_BACKEND")
        if chosen and chosen != "torch":
            log.info("%s: KERAS_BACKEND=%s replaced by torch (amptrain trains Keras models "
                     "as torch modules)", spec, chosen)
        os.environ["KERAS_BACKEND"] = "torch"  # keras reads it once, at import
        try:
            keras = importlib.import_module("keras")
        except ImportError:
            raise UserError(f"--model {spec} needs keras 3: {INSTALL}") from None
    version = str(getattr(keras, "__version__", "0"))
    if not version.split(".")[0].isdigit() or int(version.split(".")[0]) < 3:
        raise UserError(f"--model {spec} needs keras 3 (found keras {version}): {INSTALL}")
    backend = keras.backend.backend()
    if backend != "torch":
        raise UserError(f"--model {spec}: keras is already imported with the {backend} backend; "
                        f"amptrain trains Keras models on the torch backend only (TensorFlow and "
                        f"JAX backends are not supported): set KERAS_BACKEND=torch before "
                        f"keras is imported")
    return keras


def model_file(path: str, spec: str) -> Path:
    """The saved model's path, checked before keras is imported."""
    if not path:
        raise UserError("--model keras:FILE needs a model saved with model.save('FILE.keras'), "
                        "e.g. --model keras:digits.keras")
    file = Path(path).expanduser()
    if not file.exists():
        raise UserError(f"--model {spec}: no such file {path!r}")
    if not file.is_file() or file.suffix.lower() not in SUFFIXES:
        raise UserError(f"--model {spec}: {path!r} is not a Keras model file (expected "
                        f"{', '.join(SUFFIXES)}, written by model.save())")
    return file


#: What a .keras archive (zip) and an .h5 file (HDF5) start with.
_MAGIC = {".keras": b"PK\x03\x04", ".h5": b"\x89HDF\r\n\x1a\n", ".hdf5": b"\x89HDF\r\n\x1a\n"}


def load_keras(file: Path, spec: str) -> Any:
    """``keras.saving.load_model(file)``; any failure is one line naming the file."""
    keras = import_keras(spec)
    magic = _MAGIC[file.suffix.lower()]
    with open(file, "rb") as handle:
        if handle.read(len(magic)) != magic:
            kind = "zip archive" if file.suffix.lower() == ".keras" else "HDF5 file"
            raise UserError(f"--model {spec}: {file} is not a {kind}: the file is corrupt or "
                            f"was not written by a Keras model.save()")
    try:
        # safe_mode=True (keras' default, said here so it stays): a Lambda layer's marshalled
        # Python bytecode is refused, never run.
        return keras.saving.load_model(str(file), compile=False, safe_mode=True)
    except Exception as exc:  # keras raises many kinds for a bad file: all mean the same
        if "lambda" in str(exc).lower() and "safe_mode" in str(exc):
            raise UserError(f"--model {spec}: {file} holds a Lambda layer, whose Python code "
                            f"amptrain does not run (a file must not execute code when "
                            f"loaded); replace the Lambda by built-in layers") from None
        hint = (": custom classes (subclassed models, custom layers) must be importable and "
                "registered, which amptrain cannot do for you; save a functional or "
                "Sequential model" if "locate" in str(exc) or "custom" in str(exc).lower()
                else "")
        raise UserError(f"--model {spec}: cannot load a Keras model from {file} "
                        f"({_first_line(exc)}){hint}") from None


class KerasModule(nn.Module):
    """A Keras model as amptrain trains it: its layers registered as submodules under
    their Keras names, the data adapted to its input, ``training`` passed through.

    ``keras_model`` stays outside the module tree (its variables are the same torch
    parameters as its layers'), so every weight has one name: ``LAYER._torch_params.PATH``.
    """

    keras_model: Any  # the keras.Model (typed loosely: keras is optional and untyped)

    def __init__(self, keras_model: Any,
                 adapt: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        super().__init__()
        object.__setattr__(self, "keras_model", keras_model)
        self._adapt = adapt
        self.layer_names: dict[str, str] = {}   # Keras name -> module name (they differ
        for layer in keras_model.layers:        # only where nn.Module has the attribute)
            if type(layer).__name__ == "InputLayer":
                continue
            name = layer.name if layer.name.isidentifier() and not hasattr(self, layer.name) \
                else f"layer_{len(self.layer_names)}"
            self.add_module(name, layer)
            self.layer_names[layer.name] = name
        self._rebuild: Callable[[], KerasModule] | None = None

    def forward(self, x: torch.Tensor) -> Any:
        """Run the Keras model (training mode as this module's) on adapted inputs."""
        if self._adapt is not None:
            x = self._adapt(x)
        return self.keras_model(x, training=self.training)

    def __deepcopy__(self, memo: dict[int, Any]) -> KerasModule:
        # A Keras model deep-copies itself its own way (memo not shared), so a plain
        # deepcopy leaves the registered layers detached from the copy's model, and
        # training the copy changes nothing it computes. Load the file again and copy the
        # weights in (diagnose starts each of its runs from a copy).
        if self._rebuild is None:
            raise TypeError("this KerasModule cannot be copied (built without its file)")
        copy = self._rebuild()
        copy.load_state_dict(self.state_dict())
        copy.train(self.training)
        return copy


def _adapter(declared: tuple[Any, ...], given: tuple[int, ...], kind: str, spec: str,
             say: Callable[..., None]) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """How a batch of ``given``-shaped samples becomes the model's ``declared`` input."""
    fits = len(declared) == len(given) and all(d is None or d == g
                                              for d, g in zip(declared, given))
    if fits:
        return None
    if kind == "image" and len(given) == 3 and tuple(declared) == (*given[1:], given[0]):
        say("%s: images fed channels-last %s (the model's input)", spec, tuple(declared))
        return lambda x: x.permute(0, 2, 3, 1)
    if None not in declared and math.prod(declared) == math.prod(given):
        shape = tuple(int(d) for d in declared)
        say("%s: samples of shape %s reshaped to the model's input %s", spec, given, shape)
        return lambda x: x.reshape(x.shape[0], *shape)
    raise UserError(f"--model {spec}: the model's input shape {_shape(declared)} does not fit "
                    f"the data's samples of shape {tuple(given)}; save a model whose Input "
                    f"takes {tuple(given)} (or {math.prod(given)} features)")


def _shape(shape: tuple[Any, ...]) -> str:
    return "(" + ", ".join("None" if d is None else str(d) for d in shape) + \
        ("," if len(shape) == 1 else "") + ")"


def _declared_shapes(keras_model: Any) -> tuple[Any, Any]:
    """(input shape, output shape) as the model declares them; a subclassed model knows
    only the input shape it was built with (and amptrain checks its outputs on the first
    batch), so None where unknown."""
    try:
        return keras_model.input_shape, keras_model.output_shape
    except (AttributeError, ValueError):
        built = (keras_model.get_build_config() or {}).get("input_shape")
        return (tuple(built) if built else None), None


def _output_layer(keras_model: Any) -> Any:
    try:
        return keras_model.outputs[0]._keras_history.operation
    except (AttributeError, IndexError, TypeError, ValueError):
        return keras_model.layers[-1]


def _drop_softmax(keras: Any, layer: Any, spec: str, say: Callable[..., None]) -> None:
    """Train on logits: amptrain's cross-entropy applies the softmax itself."""
    if getattr(layer, "activation", None) is keras.activations.softmax:
        layer.activation = keras.activations.linear
    elif type(layer).__name__ == "Softmax":
        layer.call = lambda inputs, mask=None: inputs
    else:
        return
    say("%s: the output layer %r applies softmax; amptrain trains on its logits (the "
             "softmax stays in the exported %s)", spec, layer.name, EXPORT_NAME)


def _set_aside_mixed_policy(keras: Any, keras_model: Any, spec: str,
                            say: Callable[..., None]) -> None:
    layers = keras_model._flatten_layers(include_self=True, recursive=True)
    mixed = sorted({layer.dtype_policy.name for layer in layers
                    if str(layer.dtype_policy.name).startswith("mixed_")})
    if not mixed:
        return
    for layer in layers:
        if str(layer.dtype_policy.name).startswith("mixed_"):
            layer.dtype_policy = keras.DTypePolicy("float32")
    say("%s: the saved model's dtype policy %s is set aside while training: amptrain's "
             "--precision governs (--precision %s trains as that policy does); %s keeps it",
             spec, ", ".join(mixed), mixed[0], EXPORT_NAME)


def check_saveable(keras: Any, keras_model: Any, spec: str) -> None:
    """A UserError now, not after training, when the model cannot be saved back."""
    try:
        keras.saving.serialize_keras_object(keras_model)
        keras_model.get_config()
    except Exception as exc:  # the user's classes: whatever get_config raises
        raise UserError(f"--model {spec}: the model cannot be saved back after training "
                        f"({type(exc).__name__}: {_first_line(exc)}); give the subclass a "
                        f"get_config(), or save a functional or Sequential model") from None


def export(rebuild: Callable[[], KerasModule], out_dir: Path,
           state: dict[str, torch.Tensor]) -> Path:
    """Write ``out_dir/model.keras``: the user's model as saved, with ``state``'s weights."""
    fresh = rebuild()
    fresh.load_state_dict(state)
    target = Path(out_dir) / EXPORT_NAME
    # keras insists on the .keras suffix, so the temporary file has it too.
    with tempfile.TemporaryDirectory(dir=out_dir) as scratch:
        partial = Path(scratch) / EXPORT_NAME
        fresh.keras_model.save(str(partial))
        os.replace(partial, target)
    log.info("wrote %s (the trained fp32 weights; keras.saving.load_model reads it)",
             target)
    return target


@register("keras")
def keras_model(argument: str, inputs: ModelInputs) -> nn.Module:
    """``keras:FILE.keras[,fp32_output=0]``: a saved Keras 3 model (functional, Sequential
    or a registered subclass), trained as a torch module; see the module's docstring."""
    spec = f"keras:{argument}"
    path, options = split_argument(argument)
    values = parse_options(options, DEFAULTS, spec)
    return _assemble(model_file(path, spec), spec, inputs, bool(values["fp32_output"]))


def _assemble(file: Path, spec: str, inputs: ModelInputs, fp32_output: bool,
              announce: bool = True) -> KerasModule:
    """The saved model adapted for training (copies rebuild it quietly)."""
    keras = import_keras(spec)
    model = load_keras(file, spec)
    check_saveable(keras, model, spec)
    declared_in, declared_out = _declared_shapes(model)
    if isinstance(declared_in, list) or isinstance(declared_out, list):
        raise UserError(f"--model {spec}: the model has several inputs or outputs; amptrain "
                        f"feeds one tensor and trains one classifier output")
    declared_out = None if declared_out is None else declared_out[-1]
    if declared_out is not None and declared_out != inputs.num_classes:
        raise UserError(f"--model {spec}: the model outputs {declared_out} values per sample "
                        f"but the data has {inputs.num_classes} classes; its last layer needs "
                        f"{inputs.num_classes} units")
    say = log.info if announce else (lambda *args: None)
    adapt = None if declared_in is None else _adapter(
        tuple(declared_in[1:]), tuple(inputs.input_shape), inputs.kind, spec, say)
    _set_aside_mixed_policy(keras, model, spec, say)
    output = _output_layer(model)
    _drop_softmax(keras, output, spec, say)
    module = KerasModule(model, adapt)
    module._rebuild = lambda: _assemble(file, spec, inputs, fp32_output, announce=False)
    if fp32_output:
        weighted = [layer for layer in model.layers if layer.weights]
        kept = [layer for layer in (weighted[-1:] + [output]) if layer.name in module.layer_names]
        names = list(dict.fromkeys(module.layer_names[layer.name] for layer in kept))
        setattr(module, DEFAULT_KEEP_FP32, names)
        say("%s: %s %s in float32 (Keras's rule for the output layer; %s,fp32_output=0 "
            "lets %s follow --precision)", spec, " and ".join(repr(n) for n in names),
            "run" if len(names) > 1 else "runs", spec, "them" if len(names) > 1 else "it")

    def as_saved() -> KerasModule:
        return KerasModule(load_keras(file, spec))

    set_exporter(module, "keras", lambda out_dir, state, info: export(as_saved, out_dir, state))
    return module


def _first_line(exc: BaseException, limit: int = 200) -> str:
    """The first paragraph of a message, on one line and cut short (keras's messages run
    to whole pages, with the model's full config inside)."""
    text = str(exc).strip().split("\n\n")[0]
    text = " ".join(text.split()).split(" Full object config")[0].split(" Make sure")[0]
    text = text or type(exc).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."
