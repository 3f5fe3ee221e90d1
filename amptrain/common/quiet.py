"""Optional dependencies' import-time noise, held back narrowly.

torchao's import logs a "Failed to load ... _C_mxfp8 / _C_cutlass_90a" line for every CUDA
kernel library it cannot load (all of them on a CPU) and trips torch's pytree deprecation
warning; torch's compiler then warns at the first compiled step of torchao's 8-bit
optimizer that its state classes have no cache hash. None of it is actionable for an
amptrain user, and all of it landed in the middle of normal output.

Holding back named loggers by their level is not enough: a dependency's import may reset
the levels of the loggers it knows (torch's ``_logging`` sets every registered logger to
NOTSET when it initialises) or log through a logger nobody named. So for the duration of
a dependency's import, and only then, every log record below ERROR and every Python
warning is dropped (``logging.disable`` and a warnings filter, both put back afterwards);
errors still show. Outside these blocks nothing is silenced but :data:`TORCHAO_WARNINGS`.
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
    """Wrap a dependency's import: within this block log records below ERROR (of any
    logger; ``loggers`` also get level ERROR) and Python warnings are dropped; the levels,
    the disable threshold and the warning filters are restored after."""
    noisy = [logging.getLogger(name) for name in loggers]
    levels = [logger.level for logger in noisy]
    disabled = logging.root.manager.disable
    for logger in noisy:
        logger.setLevel(logging.ERROR)
    logging.disable(max(disabled, logging.WARNING))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(disabled)
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
