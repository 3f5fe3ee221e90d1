"""``from amptrain.integrations.hf import DiagnoseCallback``: amptrain's diagnosis in a
Hugging Face ``transformers.Trainer`` (see :mod:`.core` for what it records).

    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[DiagnoseCallback(every=50)])

Each log step adds ``amp_loss_scale`` and ``amp_skipped_steps`` to the trainer's log
history (read from the GradScaler that accelerate holds); the first inf/NaN names its
module; ``diagnose.md``/``diagnose.json`` go to ``args.output_dir`` when training ends.
"""
from __future__ import annotations

from typing import Any

from ..common.errors import UserError
from .core import DiagnoseOptions, DiagnoseSession, check_version

#: The oldest transformers with TrainerCallback.on_pre_optimizer_step (gradients complete).
MIN_VERSION = (4, 40)
_WHAT = "amptrain.integrations.hf.DiagnoseCallback"

try:
    import transformers
except ImportError:
    raise UserError(f"{_WHAT} needs transformers: pip install 'amptrain[hf]'") from None
check_version("transformers", transformers.__version__, MIN_VERSION, _WHAT)


def precision_of(args: Any) -> str:
    """amptrain's name for the precision of ``TrainingArguments``."""
    if getattr(args, "fp16", False):
        return "16-mixed"
    if getattr(args, "bf16", False):
        return "bf16-mixed"
    return "32-true"


class DiagnoseCallback(transformers.TrainerCallback):
    """A ``transformers.TrainerCallback`` running amptrain's diagnosis (see the module).

    Args are :class:`~amptrain.integrations.core.DiagnoseOptions`' (``every``,
    ``check_every``, ``stop_on_nonfinite``, ``out_dir``, ``verbose``).
    """

    def __init__(self, **options: Any) -> None:
        try:
            self.session = DiagnoseSession(DiagnoseOptions(**options))
        except TypeError as exc:
            raise UserError(f"{_WHAT}: {exc}") from None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       **kwargs: Any) -> None:
        self.session.attach(model, precision=precision_of(args),
                            trainer=f"transformers {transformers.__version__}",
                            out_dir=args.output_dir, is_main=state.is_world_process_zero)

    def on_step_begin(self, args: Any, state: Any, control: Any, optimizer: Any = None,
                      **kwargs: Any) -> None:
        self.session.step_begin(state.global_step, getattr(optimizer, "scaler", None))

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None,
                              **kwargs: Any) -> None:
        self.session.before_optimizer_step(model.parameters())

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.session.step_end():
            control.should_training_stop = True

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None,
               **kwargs: Any) -> None:
        if logs is None or "loss" not in logs:  # evaluation and the final summary
            return
        values = self.session.log_values(state.global_step)
        logs.update(values)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(values)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.session.finish()
