"""``from amptrain.integrations.lightning import DiagnoseCallback``: amptrain's diagnosis
in a ``lightning.Trainer`` (see :mod:`.core` for what it records).

    trainer = L.Trainer(precision="16-mixed", callbacks=[DiagnoseCallback(every=50)])

Each log step (``log_every_n_steps``) logs ``amp/loss_scale`` and ``amp/skipped_steps``
through ``LightningModule.log`` (read from the precision plugin's GradScaler); the first
inf/NaN names its module; ``diagnose.md``/``diagnose.json`` go to the trainer's
``default_root_dir`` when training ends or stops on an exception.
"""
from __future__ import annotations

from typing import Any

from ..common.errors import UserError
from .core import DiagnoseOptions, DiagnoseSession, check_version

#: The oldest Lightning with the ``lightning.pytorch`` package and its precision plugins.
MIN_VERSION = (2, 0)
_WHAT = "amptrain.integrations.lightning.DiagnoseCallback"

try:
    import lightning
    from lightning.pytorch import Callback
except ImportError:
    raise UserError(f"{_WHAT} needs lightning: pip install 'amptrain[lightning]'") from None
check_version("lightning", lightning.__version__, MIN_VERSION, _WHAT)


def _scaler(trainer: Any) -> Any:
    return getattr(getattr(trainer, "precision_plugin", None), "scaler", None)


class DiagnoseCallback(Callback):
    """A ``lightning.pytorch.Callback`` running amptrain's diagnosis (see the module).

    Args are :class:`~amptrain.integrations.core.DiagnoseOptions`' (``every``,
    ``check_every``, ``stop_on_nonfinite``, ``out_dir``, ``verbose``).
    """

    def __init__(self, **options: Any) -> None:
        try:
            self.session = DiagnoseSession(DiagnoseOptions(**options))
        except TypeError as exc:
            raise UserError(f"{_WHAT}: {exc}") from None
        self._logged_at = -1

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.session.attach(pl_module, precision=str(trainer.precision),
                            trainer=f"lightning {lightning.__version__}",
                            out_dir=trainer.default_root_dir, is_main=trainer.is_global_zero)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                             batch_idx: int) -> None:
        self.session.step_begin(trainer.global_step, _scaler(trainer))

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self.session.before_optimizer_step(pl_module.parameters())

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.session.step_end():
            trainer.should_stop = True
        step = trainer.global_step  # steps done; micro-batches of one step log once
        if step % max(1, trainer.log_every_n_steps) == 0 and step != self._logged_at:
            self._logged_at = step
            values = self.session.log_values(trainer.global_step)
            pl_module.log_dict({f"amp/{key[4:]}": float(value)
                                for key, value in values.items() if value is not None},
                               on_step=True, on_epoch=False)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.session.finish()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.session.finish()
