"""Optional dependencies' import-time noise, held back narrowly.

torchao's import logs a "Failed to load ... _C_mxfp8 / _C_cutlass_90a" line for every CUDA
kernel library it cannot load (all of them on a CPU) and trips torch's pytree deprecation
warning; torch's compiler then warns at the first compiled step of torchao's 8-bit
optimizer that its state classes have no cache hash. None of it is actionable for an
amptrain user, and all of it landed in the middle of normal output. Only these loggers
(for the duration of an import) and these messages are silenced: anything else they say
still shows.
"""
from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

#: Loggers whose import-time warnings are held back (torchao's, and torch's pytree one).
NOISY_IMPORT_LOGGERS = ("torchao", "torch.utils._pytree")

#: torch's UserWarnings about torchao's tensor subclasses, by message (regular expressions).
TORCHAO_WARNINGS = (r".* does not implement _stable_hash_for_caching",)


@contextlib.contextmanager
def quiet_imports(loggers: tuple[str, ...] = NOISY_IMPORT_LOGGERS) -> Iterator[None]:
    """Within this block ``loggers`` show errors only; their levels are restored after."""
    noisy = [logging.getLogger(name) for name in loggers]
    levels = [logger.level for logger in noisy]
    for logger in noisy:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(noisy, levels):
            logger.setLevel(level)


@contextlib.contextmanager
def quiet_torchao() -> Iterator[None]:
    """Wrap amptrain's ``import torchao...`` statements: the import's log lines are held
    back, and torch's warnings about torchao's state classes are filtered from then on."""
    with quiet_imports():
        yield
    for pattern in TORCHAO_WARNINGS:
        warnings.filterwarnings("ignore", pattern, UserWarning)
