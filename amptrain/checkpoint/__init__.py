"""Checkpoint files: written atomically, validated when read, found again on resume.

A checkpoint is a dict saved with ``torch.save``; ``format`` marks it as ours. Weights
are always fp32 (master copies where the precision keeps them), so a checkpoint loads
in any precision and without the libraries a precision needed. Everything in it is a
tensor or a plain Python value, so it is read with ``weights_only=True``: opening a file
never runs code from it.

The Trainer decides *what* goes into a checkpoint (``Trainer.state_dict``); this package
decides how it reaches the disk and is read back (:mod:`.files`; off the training thread:
:mod:`.background`; sharded under FSDP: :mod:`.sharded`), how its parts are
captured and restored (:mod:`.state`), how each part's section is written and brought up
to date (:mod:`.registry`, over the parts' :class:`~.stateful.Stateful`), and which file
``--resume`` continues from (:mod:`.resume`).
"""
from __future__ import annotations

from .background import BackgroundWriter
from .files import (
    CHECKPOINT_DIR,
    FORMAT,
    FORMAT_VERSION,
    LAST,
    SLOW_SAVE_ENV,
    CheckpointWriteError,
    atomic_save,
    load,
    prune,
    remove_unfinished,
    save_run_checkpoint,
    step_checkpoints,
)
from .resume import (
    INEXACT_IF_CHANGED,
    check_compatible,
    find_resume,
    latest_valid,
    read,
    resume_message,
    trim_metrics,
)
from .registry import SECTIONS, StateRegistry, section_versions
from .sharded import ShardedWriter, is_sharded, load_into
from .state import (
    RUNTIME_GROUP_KEYS,
    RngState,
    capture_rng,
    load_optimizer_state,
    load_weights,
    plain_tensor,
    restore_rng,
    weights_mismatch,
)

__all__ = [
    "BackgroundWriter", "CHECKPOINT_DIR", "FORMAT", "FORMAT_VERSION", "INEXACT_IF_CHANGED", "LAST",
    "RUNTIME_GROUP_KEYS", "SLOW_SAVE_ENV", "CheckpointWriteError", "atomic_save", "capture_rng",
    "check_compatible", "find_resume", "latest_valid", "load", "load_optimizer_state", "prune",
    "remove_unfinished", "restore_rng", "resume_message", "save_run_checkpoint",
    "step_checkpoints", "trim_metrics", "weights_mismatch", "load_weights", "read",
    "ShardedWriter", "is_sharded", "load_into", "plain_tensor", "RngState", "SECTIONS",
    "StateRegistry", "section_versions",
]
