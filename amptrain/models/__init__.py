"""Built-in models: a registry of factories from a spec string to an ``nn.Module``.

Every factory receives the data's shape (:class:`ModelInputs`) so models size their
first and last layers to it, and refuses data of the wrong kind with a UserError.
Classifier outputs are called ``head`` in every built-in model, so ``--keep-fp32 head``
works everywhere. A spec is ``name`` or ``name:options`` (``transformer:layers=4``).

* :mod:`.basic` -- ``mlp``, ``cnn``
* :mod:`.resnet` -- ``resnet18``, ``resnet50``
* :mod:`.sequence` -- ``lstm``, ``transformer``
* :mod:`.external` -- ``module:pkg.mod.factory``, ``timm:NAME``, ``hf:PATH`` (in
  :mod:`amptrain.hf`, imported when used)
* :mod:`.range_demos` -- ``demo-overflow``, ``demo-underflow`` (for ``diagnose``)
"""
from __future__ import annotations

from . import basic, external, range_demos, resnet, sequence  # noqa: F401  (register factories)
from .basic import MLP, SmallCNN
from .core import (
                   MODELS,
                   TEXT_ENCODERS,
                   ModelFactory,
                   ModelInputs,
                   build_model,
                   is_conv_net,
                   register,
                   register_text_encoder,
                   text_encoder_for,
)
from .resnet import ResNet
from .sequence import LSTMClassifier, TransformerClassifier

__all__ = ["MODELS", "TEXT_ENCODERS", "ModelFactory", "ModelInputs", "build_model", "is_conv_net",
           "register", "register_text_encoder", "text_encoder_for",
           "MLP", "SmallCNN", "ResNet", "LSTMClassifier", "TransformerClassifier"]
