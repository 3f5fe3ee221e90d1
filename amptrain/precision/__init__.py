"""The precision layer: every difference between precision modes lives here.

:class:`Precision` wraps autocast, the gradient guard (loss scaler or non-finite skip),
master weights and fp32 islands behind one step protocol::

    prec = Precision("16-mixed")
    model, optimizer = prec.setup(model, optimizer)
    with prec.autocast():
        loss = criterion(model(x), y)
    prec.backward(loss)                              # scaled for fp16
    prec.clip_grad_norm_(model.parameters(), 1.0)   # unscales first
    stepped = prec.step(optimizer)                   # False when skipped (inf/NaN)

The Trainer uses :meth:`Precision.step_async`, which leaves the skip flag on the device
and lets it be read one step later, so a steady-state step never waits for the GPU.
"""
from __future__ import annotations

import contextlib
import logging
from typing import Any, ContextManager, Iterable, Protocol, TypedDict

import torch
from torch import nn

from ..devices import resolve_device
from ..errors import UserError, flag, warn
from .advice import emulation_warning, range_safe_choice
from .emulation import EmulatedAutocast
from .fp8 import Float8Plan, convert_linears, plan_float8
from .islands import (
    ForwardPatches,
    cpu_fp32_island_types,
    cpu_fp32_modules,
    default_keep_fp32,
    install_cpu_fp16_conv,
    install_cpu_fp32_islands,
    install_fp32_islands,
    match_modules,
)
from .master import (MasterWeights, cast_model, check_no_shared_kept,
                     is_fsdp_sharded, modules_kept_fp32)
from .tf32 import set_tf32
from .misuse import CallOrder
from .modes import ALIASES, MODES, PRECISION_NAMES, ModeSpec, as_given, canonical_name, label
from .outcome import NonFiniteHalt, StepOutcome
from .scaling import DynamicLossScaler, FoundInfAgreement, NonFiniteGuard
from .support import (auto_mode, device_features, emulated_fast,
                      onednn_has_bf16_kernels, resolve_name, unsupported_reason)
from .weight_update import (WEIGHT_UPDATES, WeightUpdate, check_rule, fused_is_exact,
                            raise_adam_eps)


class PrecisionOptions(Protocol):
    """What :meth:`Precision.from_config` reads (``amptrain.config.PrecisionConfig`` is one)."""

    name: str
    init_scale: float
    growth_factor: float
    backoff_factor: float
    growth_interval: int
    min_scale: float
    keep_fp32: list[str]
    max_bad_steps: int
    weight_update: str

__all__ = ["Precision", "StepOutcome", "NonFiniteHalt", "MODES", "PRECISION_NAMES", "ALIASES",
           "ModeSpec", "as_given", "canonical_name", "label", "resolve_name",
           "WEIGHT_UPDATES", "WeightUpdate"]

log = logging.getLogger("amptrain")


class _ScalerOptions(TypedDict):
    """The dynamic loss scaler's settings, as :class:`Precision` passes them on."""

    init_scale: float
    growth_factor: float
    backoff_factor: float
    growth_interval: int


class Precision:
    """One precision mode: autocast, loss scaling, master weights and fp32 islands.

    Args:
        name: a mode from :data:`PRECISION_NAMES` (Lightning spellings accepted) or ``auto``.
        device: where the model runs; default CUDA when available, else CPU.
        init_scale, growth_factor, backoff_factor, growth_interval: dynamic loss-scaler
            settings (fp16 modes only), as in ``torch.amp.GradScaler``.
        min_scale: the loss-scale floor; reaching it stops training with advice.
        keep_fp32: glob patterns of module names that run in fp32 inside autocast.
        max_bad_steps: consecutive non-finite steps tolerated in modes without a scaler.
        fp8_skip_first_last: in ``fp8``, keep the model's first and last ``nn.Linear``
            out of float8 (the default; see :mod:`amptrain.precision.fp8`).
        weight_update: ``plain``, ``kahan`` or ``stochastic`` (X-true modes; see weight_update.py).
    """

    def __init__(self, name: str = "32-true", *, device: str | torch.device | None = None,
                 init_scale: float = 65536.0, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 min_scale: float = 1.0, keep_fp32: Iterable[str] = (),
                 max_bad_steps: int = 10, fp8_skip_first_last: bool = True,
                 weight_update: str = "plain") -> None:
        self.requested = canonical_name(name)
        self.given = str(name)  # the user's spelling (a Keras policy name, say), for outputs
        self.device = torch.device(device) if device is not None else resolve_device("auto")
        self._scaler_options = _ScalerOptions(init_scale=init_scale,
                                              growth_factor=growth_factor,
                                              backoff_factor=backoff_factor,
                                              growth_interval=growth_interval)
        self.min_scale = min_scale
        self.keep_fp32 = list(keep_fp32)
        self.max_bad_steps = max_bad_steps
        self.fp8_skip_first_last = fp8_skip_first_last
        self.weight_update_rule = weight_update
        self.weight_update: WeightUpdate | None = None   # attached by setup() (X-true modes)
        self.float8_plan: Float8Plan | None = None   # what setup() converted (fp8 only)
        self.skipped_steps = 0
        self.consecutive_skips = 0
        self._first_bad_step: int | None = None
        self._master: MasterWeights | None = None
        self._patches = ForwardPatches()
        self._order = CallOrder()
        self._optimizers: list[torch.optim.Optimizer] = []
        self._grads_moved: set[int] = set()
        self._host_flags: list[torch.Tensor] = []
        self._flag_index = 0
        self._agree: FoundInfAgreement | None = None
        self._select_mode()

    @classmethod
    def from_config(cls, config: PrecisionOptions, *,
                    device: str | torch.device | None = None) -> Precision:
        """The precision that a run's ``--precision`` and loss-scaler options describe."""
        return cls(config.name, device=device, init_scale=config.init_scale,
                   growth_factor=config.growth_factor, backoff_factor=config.backoff_factor,
                   growth_interval=config.growth_interval, min_scale=config.min_scale,
                   keep_fp32=config.keep_fp32, max_bad_steps=config.max_bad_steps,
                   weight_update=config.weight_update)

    # ------------------------------------------------------------------ mode
    def _select_mode(self) -> None:
        name = auto_mode(self.device) if self.requested == "auto" else self.requested
        self.spec: ModeSpec = MODES[name]
        reason = unsupported_reason(self.spec, self.device)
        if reason:
            raise UserError(reason)
        check_rule(self.weight_update_rule, self.spec)
        self.emulated_fast = emulated_fast(self.device, device_features(self.device))[name]
        self.guard = (DynamicLossScaler(self.device.type, **self._scaler_options,
                                        half_grads=self.spec.half_weights
                                        and not self.spec.master_weights)
                      if self.spec.loss_scaling else NonFiniteGuard())
        self.guard.agree = self._agree

    @property
    def name(self) -> str:
        """The mode actually used (``auto`` resolved)."""
        return self.spec.name

    def emulation_note(self) -> str | None:
        """A warning when this device only emulates the mode, naming the fastest native
        choice (:mod:`.advice`) and, when :mod:`.emulation` computes it at fp32 speed, what
        its timings mean; None when the mode runs natively."""
        return emulation_warning(self.name, self.device, fast=self.emulated_fast)

    # ----------------------------------------------------------------- setup
    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None
              ) -> tuple[nn.Module, torch.optim.Optimizer | None]:
        """Prepare ``model`` (and ``optimizer``) for this mode; call once, before training.

        Casts half-weight modes (keeping norm layers and fp32 islands in fp32), swaps fp32
        master copies into the optimizer where the mode keeps them, installs fp32 islands
        (``keep_fp32``, and norm/recurrent layers under fp16 on the CPU), swaps eligible
        Linear layers for float8 ones in ``fp8`` (in place, parameters kept; teardown does
        not undo it), and sets the TF32 switches. The model must already be on its device.
        """
        self._order.setup(self.name, self.spec.master_weights, optimizer is not None)
        param = next(model.parameters(), None)
        if param is not None and param.device.type != self.device.type:
            self.device = param.device
            self._select_mode()
        note = self.emulation_note() if optimizer is not None else None
        if note:  # training, not evaluation: a library user sees it too (warnings.warn)
            warn(note)
        islands = match_modules(model, self.keep_patterns(model))
        cpu = self.device.type == "cpu"
        cpu_fp16 = cpu and self.spec.compute_dtype == torch.float16
        # Layers whose reduced-precision CPU kernels are missing or differ from CUDA's run
        # in fp32 (see islands.py): norms and RNNs under fp16, RNNs under bf16 on AVX2.
        fp32_on_cpu = cpu_fp32_modules(model, cpu_fp32_island_types(
            self.spec.compute_dtype, onednn_has_bf16_kernels()), skip=islands.values()) \
            if cpu else []
        if fp32_on_cpu and not cpu_fp16:
            warn(f"{self.name}: oneDNN has no bf16 kernels on this CPU; {len(fp32_on_cpu)} "
                 f"recurrent layer(s) run as fp32 islands")
        if self.spec.float8_linears:
            self.float8_plan = convert_linears(model, plan_float8(
                model, islands=list(islands), skip_first_last=self.fp8_skip_first_last))
            log.info("%s", self.float8_plan.summary())
        if is_fsdp_sharded(model):
            self._setup_sharded()
        elif self.spec.half_weights:
            kept = check_no_shared_kept(model, modules_kept_fp32(
                model, [*islands.values(), *fp32_on_cpu]), self.name)
            if self.spec.master_weights and optimizer is not None:
                self._master = MasterWeights(model, optimizer, self.spec.param_dtype, kept)
            else:  # no optimizer (evaluation): nothing to keep masters for
                cast_model(model, self.spec.param_dtype, kept)
        if optimizer is not None and self.spec.min_adam_eps is not None:
            raise_adam_eps(optimizer, self.spec.min_adam_eps, self.name)
        if optimizer is not None and self.weight_update_rule != "plain":
            self.weight_update = WeightUpdate(self.weight_update_rule, optimizer,
                                              seed=torch.initial_seed() % 2 ** 63)
        install_fp32_islands(self._patches, islands.values(), self.device.type)
        if cpu_fp16 and not self.emulated_fast:  # emulation computes the conv in fp32 anyway
            install_cpu_fp16_conv(self._patches, model, skip=set(islands.values()))
        if fp32_on_cpu and self.spec.compute_dtype is not None:
            install_cpu_fp32_islands(self._patches, fp32_on_cpu, self.spec.compute_dtype)
        set_tf32(self.spec, self.device)
        if optimizer is not None:
            self._optimizers.append(optimizer)
        return model, optimizer

    def _setup_sharded(self) -> None:
        # FSDP2 keeps each rank's shard in fp32 (the master copy) and casts per forward
        # with the policy from fsdp_policy(): nothing to cast or copy here.
        if self.spec.master_weights:
            log.info("%s under FSDP: the fp32 master weights are FSDP's fp32 shards", self.name)
        if self.spec.loss_scaling:
            self.guard = DynamicLossScaler(self.device.type, **self._scaler_options, sharded=True)
            self.guard.agree = self._agree

    def set_found_inf_agreement(self, agree: FoundInfAgreement | None) -> None:
        """Make ranks agree on skipped steps: ``agree(flag)`` combines each step's found-inf
        flag in place with the other ranks' (all-reduce MAX) before the step is decided.

        Without it a rank whose gradients alone hold an inf would skip (and back off its
        loss scale) while the others step, and the replicas would silently diverge. The
        flag stays on the device: on NCCL the all-reduce is stream-ordered, no host sync.
        """
        self._agree = agree
        self.guard.agree = agree

    def keep_patterns(self, model: nn.Module) -> list[str]:
        """``keep_fp32`` plus the patterns the model asks for itself (a Keras model's output
        layer: :func:`~.islands.default_keep_fp32`)."""
        return list(dict.fromkeys([*self.keep_fp32, *default_keep_fp32(model)]))

    def allows_fused(self, optimizer_name: str) -> bool:
        """Whether torch's fused kernel for amptrain's ``optimizer_name`` is exact here
        (see :func:`.weight_update.fused_is_exact`)."""
        return fused_is_exact(optimizer_name, self.spec, self.device)

    def teardown(self) -> None:
        """Remove the forward wrappers installed by :meth:`setup`."""
        self._patches.remove()
        if self.weight_update is not None:
            self.weight_update.remove()

    def installed(self) -> ContextManager:
        """The forward wrappers of :meth:`setup` back in place for a block (after teardown)."""
        return self._patches.reinstated()

    # --------------------------------------------------------------- forward
    def autocast(self) -> ContextManager:
        """The autocast context for forward passes and the loss (emulated: emulation.py)."""
        if self.spec.compute_dtype is None:
            return contextlib.nullcontext()
        return EmulatedAutocast(self.spec.compute_dtype) if self.emulated_fast \
            else torch.autocast(self.device.type, dtype=self.spec.compute_dtype)

    # -------------------------------------------------------------- backward
    def backward(self, loss: torch.Tensor) -> None:
        """Backpropagate ``loss``, scaled where the mode uses loss scaling."""
        self._order.backward(loss)
        self.guard.scale(loss).backward()

    def _optimizer(self, optimizer: torch.optim.Optimizer | None) -> torch.optim.Optimizer:
        if optimizer is not None:
            return optimizer
        if len(self._optimizers) != 1:
            raise UserError("pass the optimizer explicitly: setup() registered "
                            f"{len(self._optimizers)} optimizers")
        return self._optimizers[0]

    def unscale_(self, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Make the optimizer's gradients true (unscaled, fp32 masters) and check them.

        Idempotent within a step; :meth:`clip_grad_norm_` and :meth:`step` call it.
        """
        optimizer = self._optimizer(optimizer)
        if self._master is not None and id(optimizer) not in self._grads_moved:
            self._master.copy_grads_to_masters()
            self._grads_moved.add(id(optimizer))
        self.guard.unscale_(optimizer)

    def _grads_of(self, parameters: Iterable[torch.Tensor]) -> list[torch.Tensor]:
        params = list(parameters)
        if self._master is not None:
            params = self._master.map_params(params)
        return [p for p in params if p.grad is not None]

    def clip_grad_norm_(self, parameters: Iterable[torch.Tensor], max_norm: float,
                        norm_type: float = 2.0,
                        optimizer: torch.optim.Optimizer | None = None) -> torch.Tensor:
        """Unscale, then clip the gradient norm; returns the (unscaled) norm on the device."""
        self.unscale_(optimizer)
        return torch.nn.utils.clip_grad_norm_(self._grads_of(parameters), max_norm, norm_type,
                                              foreach=True)

    def grad_norm(self, parameters: Iterable[torch.Tensor],
                  optimizer: torch.optim.Optimizer | None = None) -> torch.Tensor:
        """The unscaled gradient norm without clipping (a device tensor)."""
        self.unscale_(optimizer)
        grads = [p.grad for p in self._grads_of(parameters) if p.grad is not None]
        if not grads:
            return torch.zeros((), device=self.device)
        return torch.nn.utils.get_total_norm(grads, foreach=True)

    # ------------------------------------------------------------------ step
    def step_async(self, optimizer: torch.optim.Optimizer | None = None) -> StepOutcome:
        """Step (or skip on inf/NaN), update the loss scale, refresh half weights.

        Returns a :class:`StepOutcome` whose flag is still on the device; pass it to
        :meth:`confirm` when the answer is needed.
        """
        optimizer = self._optimizer(optimizer)
        self._order.step()
        self.unscale_(optimizer)
        try:
            found_inf = self.guard.step(optimizer)
        finally:  # a step that raised must not leave the weights swapped out
            if self.weight_update is not None:
                self.weight_update.restore()
        self.guard.update()
        self._grads_moved.discard(id(optimizer))
        if self._master is not None:
            # A skipped step left the masters unchanged, so copying back is harmless and
            # avoids reading the flag here.
            self._master.copy_masters_to_model()
        return StepOutcome(found_inf, self._next_host_flag())

    def update(self) -> None:
        """Loss-scale update once per iteration (the precision branch replaces this)."""
        return None

    def step(self, optimizer: torch.optim.Optimizer | None = None) -> bool:
        """:meth:`step_async` and :meth:`confirm` in one call: True when the weights changed."""
        return self.confirm(self.step_async(optimizer))

    def confirm(self, outcome: StepOutcome, step: int | None = None) -> bool:
        """Account for a finished step; raise :class:`NonFiniteHalt` when training must stop.

        Returns True when the optimizer updated the weights. ``step`` (the optimizer-step
        number) only improves the error message.
        """
        if not outcome.skipped():
            self.consecutive_skips = 0
            self._first_bad_step = None
            return True
        self.skipped_steps += 1
        self.consecutive_skips += 1
        if self._first_bad_step is None:
            self._first_bad_step = step
        where = f" at step {step}" if step is not None else ""
        scale = self.loss_scale
        if scale is not None and scale <= self.min_scale:
            raise NonFiniteHalt(
                f"fp16 loss scale fell to {scale:g} ({flag('min_scale')} {self.min_scale:g})"
                f"{where} after {self.consecutive_skips} consecutive overflowing steps: the "
                f"model overflows fp16 even unscaled. Train with "
                f"{range_safe_choice(self.device)}, keep the overflowing modules in fp32 with "
                f"{flag('keep_fp32')}, or find them with `amptrain diagnose`", step)
        if scale is None and self.consecutive_skips >= self.max_bad_steps:
            first = f" (first at step {self._first_bad_step})" \
                if self._first_bad_step is not None else ""
            raise NonFiniteHalt(
                f"{self.consecutive_skips} consecutive steps had a non-finite loss or gradient"
                f"{where}{first} (--max-bad-steps {self.max_bad_steps}); lower --lr, set "
                f"--clip-grad-norm, or run `amptrain diagnose`", step)
        return False

    def _next_host_flag(self) -> torch.Tensor | None:
        if self.device.type != "cuda":
            return None
        if not self._host_flags:
            # Two buffers: the Trainer reads step t's flag while step t+1's copy is in flight.
            self._host_flags = [torch.zeros((), dtype=torch.float32).pin_memory() for _ in range(2)]
        self._flag_index ^= 1
        return self._host_flags[self._flag_index]

    # --------------------------------------------------------------- state
    @property
    def loss_scale(self) -> float | None:
        """The current loss scale (reads the device), or None without a scaler."""
        scale = self.guard.scale_tensor
        return None if scale is None else float(scale.item())

    @property
    def loss_scale_tensor(self) -> torch.Tensor | None:
        """The current loss scale on the device (no sync), or None without a scaler."""
        return self.guard.scale_tensor

    def state_dict(self) -> dict[str, Any]:
        """Scaler state, skip counters and weight-update buffers, for checkpoints."""
        return {"name": self.name, "scaler": self.guard.state_dict(),
                "skipped_steps": self.skipped_steps, "consecutive_skips": self.consecutive_skips,
                "weight_update": self.weight_update.state_dict() if self.weight_update else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; scaler state only applies when both modes scale."""
        if state.get("scaler") and self.spec.loss_scaling:
            self.guard.load_state_dict(state["scaler"])
        self.skipped_steps = int(state.get("skipped_steps", 0))
        self.consecutive_skips = int(state.get("consecutive_skips", 0))
        if self.weight_update is not None and state.get("weight_update"):
            self.weight_update.load_state_dict(state["weight_update"])

    def fp32_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The model's state with fp32 weights (the master copies where the mode keeps them)."""
        state = model.state_dict()
        if self._master is not None:
            state.update(self._master.masters_by_name(model))
        return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}

    def load_fp32_state_dict(self, model: nn.Module, state: dict[str, torch.Tensor]) -> None:
        """Load fp32 weights into a set-up model, its half weights and its masters."""
        model.load_state_dict(state)
        if self._master is not None:
            values = {id(p): state[name] for name, p in model.named_parameters() if name in state}
            self._master.load_fp32(values)
