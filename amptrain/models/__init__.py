"""Built-in models: a registry of factories from a spec string to an ``nn.Module``.

Every factory receives the data's shape (:class:`ModelInputs`) so models size their
first and last layers to it, and refuses data of the wrong kind with a UserError.
Classifier outputs are called ``head`` in every built-in model, so ``--keep-fp32 head``
works everywhere. A spec is ``name`` or ``name:options`` (``transformer:layers=4``).

* :mod:`.basic` -- ``mlp``, ``cnn``
* :mod:`.resnet` -- ``resnet18``, ``resnet50``
* :mod:`.sequence` -- ``lstm``, ``transformer``
* :mod:`.gpt` -- ``gpt`` (a decoder-only language model; its output is ``head`` too)
* :mod:`.actor_critic` -- ``actor-critic`` (policy and value MLPs for the ``ppo`` task)
* :mod:`.dcgan` -- ``dcgan`` (a generator/discriminator pair for the ``gan`` task)
* :mod:`.external` -- ``module:pkg.mod.factory``, ``timm:NAME``, ``hf:PATH`` (in
  :mod:`amptrain.models.hf`, imported when used)
* :mod:`.keras` -- ``keras:FILE.keras``, a saved Keras 3 model on the torch backend (keras
  imported when used)
* :mod:`.range_demos` -- ``demo-overflow``, ``demo-underflow`` (for ``diagnose``)
"""
from __future__ import annotations

from . import actor_critic, basic, dcgan, external, gpt, keras, range_demos, resnet, sequence  # noqa: F401  (register)
from .basic import MLP, SmallCNN
from .core import (
                   EXPORT_FORMAT,
                   EXPORT_HOOK,
                   MODELS,
                   TEXT_ENCODERS,
                   ModelFactory,
                   ModelInputs,
                   build_model,
                   export_format_of,
                   exporter_of,
                   is_conv_net,
                   register,
                   register_text_encoder,
                   set_exporter,
                   task_of_model,
                   text_encoder_for,
)
from .gpt import GPT
from .resnet import ResNet
from .sequence import LSTMClassifier, TransformerClassifier

__all__ = ["EXPORT_HOOK", "MODELS", "TEXT_ENCODERS", "ModelFactory", "ModelInputs", "build_model",
           "EXPORT_FORMAT",
           "export_format_of", "exporter_of", "is_conv_net", "set_exporter",
           "register", "register_text_encoder", "task_of_model", "text_encoder_for",
           "MLP", "SmallCNN", "ResNet", "LSTMClassifier", "TransformerClassifier", "GPT"]
