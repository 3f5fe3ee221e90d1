"""Built-in datasets: a registry of factories from a spec string to train/val data.

A spec is ``name`` or ``name:argument`` -- a path for file formats (``npz:FILE``,
``imagefolder:DIR,size=64``), or ``key=value`` options for generated data
(``synthetic-image:samples=4096,size=32``). One module per format family:

* :mod:`.generated` -- ``digits``, ``synthetic-image``, ``synthetic-seq``
* :mod:`.arrays` -- ``npz:FILE``
* :mod:`.images` -- ``idx:DIR`` (MNIST/Fashion-MNIST), ``cifar10:DIR``
* :mod:`.folders` -- ``imagefolder:DIR``
* :mod:`.text` -- ``csv-text:FILE``
* :mod:`.corpus` -- ``text:PATH`` (language modelling)
* :mod:`.tokens` -- ``tokens:DIR`` (shards written by ``amptrain prepare``, read from disk)
* :mod:`.module` -- ``module:pkg.mod.factory`` (the user's own Datasets)
* :mod:`.gym` -- ``gym:ENV_ID`` (a Gymnasium environment's rollouts, for the ``ppo`` task)

Every malformed input is a :class:`~amptrain.common.errors.UserError` naming ``--data``.
"""
from __future__ import annotations

from . import arrays, corpus, folders, generated, gym, images, module, text, tokens  # noqa: F401
from .core import (DATASETS, SPLIT_SEED, DataBundle, DataFactory, DataOptions, TensorData,
                   TextEncoder, build_data, labels_to_classes, parse_options, register, split)
from .corpus import ByteTokenizer, TokenBlocks
from .text import TokenData

__all__ = ["ByteTokenizer", "DATASETS", "SPLIT_SEED", "DataBundle", "DataFactory", "DataOptions",
           "TensorData", "TextEncoder", "TokenBlocks", "TokenData", "build_data",
           "labels_to_classes", "parse_options", "register", "split"]
