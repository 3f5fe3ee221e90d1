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

A source's own options are declared beside it, torch-free (:mod:`.text_options`,
:mod:`.image_options`, :mod:`.gym_options`; :mod:`.scope`: the data each applies to), and
handed to its factory as a section of :class:`DataOptions`.

Every malformed input is a :class:`~amptrain.common.errors.UserError` naming ``--data``.

The face is lazy (:mod:`amptrain.common.lazy`): the command line's parser reads the
options modules without importing torch; the registry imports the sources on its first
read (:data:`~.core.BUILT_IN_SOURCES`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..common.lazy import lazy_exports
from .gym_options import GymOptions
from .image_options import ImageOptions
from .text_options import TextOptions

if TYPE_CHECKING:
    from .core import (DATASETS, SPLIT_SEED, DataBundle, DataFactory, DataOptions, TensorData,
                       TextEncoder, build_data, labels_to_classes, parse_options, register,
                       split)
    from .corpus import ByteTokenizer, TokenBlocks
    from .text import TokenData

_WHERE = {
    ".core": ("DATASETS", "SPLIT_SEED", "DataBundle", "DataFactory", "DataOptions",
              "TensorData", "TextEncoder", "build_data", "labels_to_classes", "parse_options",
              "register", "split"),
    ".corpus": ("ByteTokenizer", "TokenBlocks"),
    ".text": ("TokenData",),
}
__getattr__ = lazy_exports(__name__, {name: module for module, names in _WHERE.items()
                                      for name in names})

__all__ = ["ByteTokenizer", "DATASETS", "SPLIT_SEED", "DataBundle", "DataFactory", "DataOptions",
           "GymOptions", "ImageOptions", "TensorData", "TextEncoder", "TextOptions",
           "TokenBlocks", "TokenData", "build_data", "labels_to_classes", "parse_options",
           "register", "split"]
