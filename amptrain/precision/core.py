""":class:`Precision`: one precision mode behind one step protocol (autocast, the gradient
guard, master weights and fp32 islands), for one device and every model/optimizer pair set
up on it. The package's docstring (``amptrain.precision``) shows it in use.
"""
from __future__ import annotations

import contextlib
import logging
from typing import Any, ContextManager, Iterable

import torch
from torch import nn

from ..common.errors import UserError, warn
from .emulation import EmulatedAutocast
from .fp8 import Float8Selection
from .hardware.advice import emulation_warning
from .hardware.support import autocast_mode, device_features, emulated_fast
from .islands import (ForwardPatches, cpu_fp32_layers, default_keep_fp32,
                      install_forward_patches, match_modules)
from .loss_scales import LossScales
from .lowbit import lowbit_warning, setup_lowbit
from .lowbit_settings import check_lowbit_options, settings_shown
from .lowbit_scratch import release as release_scratch
from .lowbit_training import StochasticSeeds
from .master import check_no_shared_kept, modules_kept_fp32
from .misuse import CallOrder, check_setup, checked_arguments, checked_state
from .modes import MODES, ModeSpec
from .halt import LastForward
from .outcome import NonFiniteHalt, SkipCounter, StepOutcome
from .views import PrecisionViews
from .pairs import Pairs
from .policies import WeightPolicy, weight_policy
from .precision_plan import (BASE_MODE, check_resumed_plan, plan_emulation_note,
                             setup_plan)
from .options import PrecisionConfig
from .resolve import ResolvedPrecision, resolve_precision
from .scaling import FoundInfAgreement
from .state import FORMAT_VERSION, SECTION, migrate_state
from .tf32 import set_tf32
from .weight_update import check_rule, fused_is_exact, raise_adam_eps

log = logging.getLogger("amptrain")


class Precision(PrecisionViews):
    """One precision mode: autocast, loss scaling, master weights and fp32 islands.

    Args:
        name: a mode from :data:`~amptrain.common.choices.PRECISION_NAMES` (Lightning spellings
            accepted) or ``auto``; or a decision already made
            (:class:`~amptrain.precision.resolve.ResolvedPrecision`), which is used as it is.
        device: where the model runs; default CUDA when available, else CPU.
        fp8_skip_first_last: in the low-bit modes (fp8, MX, NVFP4), keep the model's first
            and last ``nn.Linear`` out of the format (the default; see :mod:`.lowbit`).
        separate_loss_scales: one loss scale per ``backward(..., loss_id=)`` instead of one
            for all losses (fp16 modes; Apex's ``num_losses``; see :mod:`.loss_scales`).
        config: the mode's settings as one :class:`~amptrain.precision.options.PrecisionConfig`
            (a run's ``config.precision``); or give them as keywords instead.
        **settings: any of :class:`~amptrain.precision.options.PrecisionConfig`'s settings by
            name, with its defaults and checks: the loss scaler's ``init_scale``,
            ``growth_factor``, ``backoff_factor`` and ``growth_interval`` (as
            ``torch.amp.GradScaler``'s) and ``min_scale`` (the floor that stops training);
            ``keep_fp32`` (module-name globs run in fp32 inside autocast); ``max_bad_steps``
            (consecutive non-finite steps tolerated without a scaler); ``weight_update``
            (``plain``, ``kahan`` or ``stochastic``, X-true modes); ``lowbit_bf16_last``,
            ``mx_scale`` and ``nvfp4_without`` (the low-bit options).
    """

    def __init__(self, name: str | ResolvedPrecision = "32-true", *,
                 device: str | torch.device | None = None, fp8_skip_first_last: bool = True,
                 separate_loss_scales: bool = False, config: PrecisionConfig | None = None,
                 **settings: Any) -> None:
        if config is not None and settings:
            raise UserError(f"Precision() takes config= or its settings as keywords, not both "
                            f"(got config= and {', '.join(sorted(settings))}=)")
        config = config if config is not None else PrecisionConfig.from_keywords(**settings)
        device = checked_arguments(device, fp8_skip_first_last, separate_loss_scales)
        self.config = config   # the settings, read through the views (views.py)
        self.fp8_skip_first_last = fp8_skip_first_last
        self.separate_loss_scales = separate_loss_scales
        self.float8_plan: Float8Selection | None = None   # the low-bit layers of setup()
        self._seeds: list[StochasticSeeds] = []      # stochastic rounding, per setup()
        self.skipped_steps = 0          # all pairs together (each pair: skipped_steps_of)
        self.consecutive_skips = 0      # of the pair that confirmed last
        self._unpaired = SkipCounter()  # outcomes that name no pair
        self._pairs = Pairs()
        self._patches = ForwardPatches()
        self._last_forward: dict[int, LastForward] = {}  # own loops' last inputs (.halt)
        self._order = CallOrder()
        #: The ``loss_id`` of the backward now running, else None (read by the non-finite
        #: watch's gradient hooks to name the loss that overflowed).
        self.backward_loss_id: int | None = None
        self._agree: FoundInfAgreement | None = None
        self._elsewhere: dict[int, str] = {}    # id(parameter) -> who keeps its fp32 weights
        self._scaler_class: type | None = None
        self._bind(resolve_precision(name, device))

    @classmethod
    def from_config(cls, config: PrecisionConfig, *, device: str | torch.device | None = None,
                    mode: ResolvedPrecision | None = None) -> Precision:
        """The precision that a run's ``--precision`` and its options describe; ``mode``:
        the decision already made for ``config.name`` (the runner's), used as it is."""
        return cls(mode if mode is not None else config.name, device=device, config=config)

    # ------------------------------------------------------------------ mode
    def _bind(self, mode: ResolvedPrecision) -> None:
        """Take the decided mode: its spec, whether this device emulates it, and the loss
        scales it uses (checking the weight-update rule against it)."""
        self.mode = mode
        self.device = mode.device
        self.given = mode.given         # the user's spelling (a Keras policy name, say)
        self.requested = mode.requested  # a mode or "auto"
        self.spec: ModeSpec = mode.spec
        check_rule(self.weight_update_rule, self.spec)
        check_lowbit_options(self.spec, self.config)
        fast = emulated_fast(self.device, device_features(self.device))
        # A precision plan is bf16-mixed outside its low-bit layers.
        base = BASE_MODE if mode.plan is not None else mode.name
        self.emulated_fast = fast[base]
        self.emulated_autocast = fast[autocast_mode(MODES[base], self.device)
                                      if mode.plan is not None
                                      else autocast_mode(self.spec, self.device)]
        self._build_scales()

    def _build_scales(self) -> None:
        """The loss scales of this mode (a no-op guard without loss scaling), with the
        scaler class a strategy asked for and the ranks' found-inf agreement."""
        self._scales = LossScales(self.device.type, self.spec, self.scaler_settings,
                                  separate=self.separate_loss_scales,
                                  scaler_class=self._scaler_class)
        self._scales.set_agreement(self._agree)

    name = property(lambda self: self.spec.name, doc="The mode used (``auto`` resolved).")

    guard = property(lambda self: self._scales.step_guard,
                     doc="The step guard: the (shared) loss scaler or the non-finite check.")

    def emulation_note(self) -> str | None:
        """A warning when this device only emulates the mode (:mod:`.hardware.advice`; a low-bit
        format: :mod:`.lowbit`); None when the mode runs natively."""
        if self.mode.plan is not None:
            return plan_emulation_note(self.mode.plan, self.device)
        if self.spec.lowbit:
            return lowbit_warning(self.spec, self.device, settings_shown(self.spec, self.config))
        return emulation_warning(self.name, self.device, fast=self.emulated_fast)

    # ----------------------------------------------------------------- setup
    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None
              ) -> tuple[nn.Module, torch.optim.Optimizer | None]:
        """Prepare ``model`` (and ``optimizer``) for this mode, before training; once per
        model/optimizer pair (a GAN: once for the discriminator, once for the generator).

        Casts half-weight modes (keeping norm layers and fp32 islands in fp32), swaps fp32
        master copies into the optimizer where the mode keeps them, installs fp32 islands
        (``keep_fp32``, and norm/recurrent layers under fp16 on the CPU), makes eligible
        Linear layers low-bit in fp8/MX/NVFP4 (:mod:`.lowbit`), and sets the TF32 switches.
        """
        check_setup(model, optimizer)
        self._follow_model_device(model)
        islands = match_modules(model, self.keep_patterns(model))   # a bad pattern: no warning
        note = self.emulation_note() if optimizer is not None else None
        if note:  # training, not evaluation: a library user sees it too (warnings.warn)
            warn(note)
        fp32_on_cpu = cpu_fp32_layers(model, self.spec.compute_dtype, self.device,
                                      islands.values(), self.name)
        if self.spec.lowbit:
            self.float8_plan, seeds = setup_lowbit(
                model, self._patches, self.spec, self.device, list(islands),
                self.fp8_skip_first_last, bf16_last=self.lowbit_bf16_last,
                mx_scale=self.mx_scale, without=self.nvfp4_without,
                seed=(torch.initial_seed() + len(self._pairs)) % 2 ** 63)
            if seeds is not None:
                self._seeds.append(seeds)
        elif self.mode.plan is not None:
            self.float8_plan, seeds = setup_plan(
                model, self._patches, self.mode.plan, self.device, list(islands),
                mx_scale=self.mx_scale, seed=(torch.initial_seed() + len(self._pairs)) % 2 ** 63)
            if seeds is not None:
                self._seeds.append(seeds)
        policy = self._weight_policy(model, optimizer, [*islands.values(), *fp32_on_cpu])
        if optimizer is not None:
            self._register(model, optimizer, policy)
        cpu_fp16 = self.device.type == "cpu" and self.spec.compute_dtype == torch.float16
        install_forward_patches(  # emulation computes fp16 convolutions in fp32 anyway
            self._patches, model, device_type=self.device.type,
            compute_dtype=self.spec.compute_dtype, islands=list(islands.values()),
            cpu_fp32=fp32_on_cpu, fp16_conv_in_fp32=cpu_fp16 and not self.emulated_fast)
        set_tf32(self.spec, self.device)
        return model, optimizer

    def _follow_model_device(self, model: nn.Module) -> None:
        """Before the first pair, a model on another kind of device than the one the mode
        was decided for moves the precision there (a library user's ``Precision("auto")``
        with a CPU model on a GPU machine): the mode is decided for that device instead."""
        param = next(model.parameters(), None)
        if param is None or param.device.type == self.device.type:
            return
        if len(self._pairs):
            raise UserError(f"setup(): this model is on {param.device.type}, the models "
                            f"set up before on {self.device.type}; one Precision serves "
                            "one device")
        self._bind(resolve_precision(self.given, param.device))

    def _weight_policy(self, model: nn.Module, optimizer: torch.optim.Optimizer | None,
                       kept_fp32: list[nn.Module]) -> WeightPolicy:
        """How the optimizer's steps reach ``model``'s weights (:mod:`.policies`): cast and
        mastered by this mode, or left to the owner of its fp32 weights (FSDP's shards)."""
        owner = next((self._elsewhere[id(p)] for p in model.parameters()
                      if id(p) in self._elsewhere), None)
        if owner and self.spec.master_weights:
            log.info("%s: the fp32 master weights are %s", self.name, owner)
        kept = check_no_shared_kept(model, modules_kept_fp32(model, kept_fp32), self.name) \
            if self.spec.half_weights and owner is None else set()
        return weight_policy(model, optimizer, self.spec, rule=self.weight_update_rule,
                             kept_fp32=kept, managed_elsewhere=owner is not None,
                             seed=(torch.initial_seed() + len(self._pairs)) % 2 ** 63)

    def _register(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                  policy: WeightPolicy) -> None:
        """Add the pair (its skip counters, found by its optimizer) and raise Adam's eps
        where the mode's format would round it to zero."""
        self._pairs.add(model, optimizer, policy)
        if self.spec.min_adam_eps is not None:
            raise_adam_eps(optimizer, self.spec.min_adam_eps, self.name)

    def weights_managed_elsewhere(self, model: nn.Module, *, owner: str,
                                  grad_scaler: type | None = None) -> None:
        """Declare, before :meth:`setup`, that ``owner`` (a distributed strategy, e.g. FSDP
        with its fp32 shards) keeps ``model``'s fp32 weights and casts them per forward:
        setup() then neither casts nor copies them. ``grad_scaler``: a GradScaler subclass
        that handles the owner's gradients (used for every loss scale from now on)."""
        self._elsewhere.update({id(p): owner for p in model.parameters()})
        if grad_scaler is not None and grad_scaler is not self._scaler_class:
            if len(self._pairs):
                raise UserError("weights_managed_elsewhere(grad_scaler=...) must come before "
                                "setup()")
            self._scaler_class = grad_scaler
            self._build_scales()

    def set_found_inf_agreement(self, agree: FoundInfAgreement | None) -> None:
        """Make ranks agree on skipped steps: ``agree(flag)`` combines each step's found-inf
        flag in place with the other ranks' (all-reduce MAX) before the step is decided.

        Without it a rank whose gradients alone hold an inf would skip (and back off its
        loss scale) while the others step, and the replicas would silently diverge. The
        flag stays on the device: on NCCL the all-reduce is stream-ordered, no host sync.
        """
        self._agree = agree
        self._scales.set_agreement(agree)

    @property
    def skips_agreed(self) -> bool:
        """Whether the ranks agree on skipped steps (:meth:`set_found_inf_agreement`)."""
        return self._agree is not None

    def keep_patterns(self, model: nn.Module) -> list[str]:
        """``keep_fp32`` plus the patterns the model asks for (:func:`.default_keep_fp32`)."""
        return list(dict.fromkeys([*self.keep_fp32, *default_keep_fp32(model)]))

    def allows_fused(self, optimizer_name: str) -> bool:
        """Whether torch's fused ``optimizer_name`` is exact here (:func:`.fused_is_exact`)."""
        return fused_is_exact(optimizer_name, self.spec, self.device)

    def teardown(self) -> None:
        """Remove the forward wrappers of every :meth:`setup` and the weight rules' hooks; free
        the low-bit emulation's reused temporaries (:mod:`.lowbit_scratch`)."""
        self._patches.remove()
        for last in self._last_forward.values():
            last.remove()
        self._last_forward.clear()
        for pair in self._pairs:
            pair.policy.remove()
        release_scratch()   # the emulated low-bit GEMMs' reused temporaries (this thread's)

    def installed(self) -> ContextManager:
        """The forward wrappers of :meth:`setup` back in place for a block (after teardown)."""
        return self._patches.reinstated()

    # ------------------------------------------------------- forward, backward
    def autocast(self) -> ContextManager:
        """The autocast context for forward passes and the loss (emulated: emulation.py)."""
        if self.spec.compute_dtype is None:
            return contextlib.nullcontext()
        return EmulatedAutocast(self.spec.compute_dtype) if self.emulated_autocast \
            else torch.autocast(self.device.type, dtype=self.spec.compute_dtype)

    def backward(self, loss: torch.Tensor, *, loss_id: int = 0) -> None:
        """Backpropagate ``loss``, scaled where the mode uses loss scaling (with its own
        scale per ``loss_id`` when ``separate_loss_scales``)."""
        self._order.backward(loss, loss_id)
        self.backward_loss_id = loss_id
        try:
            self._scales.backward(loss, loss_id, self._pairs.grad_links()
                                  if self._scales.separate else [], [p.policy for p in self._pairs])
        finally:
            self.backward_loss_id = None

    def scale_loss(self, loss: torch.Tensor, loss_id: int = 0) -> torch.Tensor:
        """``loss`` times its loss scale (itself without one), for a backward of your own."""
        return self._scales.scale(loss, loss_id)

    def unscale_(self, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Make the optimizer's gradients true (unscaled, fp32 masters) and check them.

        Idempotent within a step; :meth:`clip_grad_norm_` and :meth:`step` call it.
        """
        pair = self._pairs.of(optimizer)
        self._scales.unscale_(pair.optimizer, pair.policy)

    def _grads_of(self, parameters: Iterable[torch.Tensor],
                  optimizer: torch.optim.Optimizer | None) -> list[torch.Tensor]:
        return [p for p in self._pairs.of(optimizer).policy.stepped_params(parameters)
                if p.grad is not None]

    def clip_grad_norm_(self, parameters: Iterable[torch.Tensor], max_norm: float,
                        norm_type: float = 2.0,
                        optimizer: torch.optim.Optimizer | None = None) -> torch.Tensor:
        """Unscale, then clip the gradient norm; returns the (unscaled) norm on the device."""
        self.unscale_(optimizer)
        return _whole(torch.nn.utils.clip_grad_norm_(self._grads_of(parameters, optimizer),
                                                     max_norm, norm_type, foreach=True))

    def grad_norm(self, parameters: Iterable[torch.Tensor],
                  optimizer: torch.optim.Optimizer | None = None) -> torch.Tensor:
        """The unscaled gradient norm without clipping (a device tensor)."""
        self.unscale_(optimizer)
        grads = [p.grad for p in self._grads_of(parameters, optimizer) if p.grad is not None]
        if not grads:
            return torch.zeros((), device=self.device)
        return _whole(torch.nn.utils.get_total_norm(grads, foreach=True))

    # ------------------------------------------------------------------ step
    def step_async(self, optimizer: torch.optim.Optimizer | None = None) -> StepOutcome:
        """Step ``optimizer`` (or skip it alone on inf/NaN) and refresh its half weights.

        With one optimizer set up this also updates the loss scale; with several, call
        :meth:`update` once per iteration after their steps. Returns a :class:`StepOutcome`
        whose flag is still on the device; pass it to :meth:`confirm` when it is needed.
        """
        pair = self._pairs.of(optimizer)
        several = len(self._pairs) > 1
        self._order.step(pair.optimizer, several)
        self.unscale_(pair.optimizer)
        try:
            found_inf = self._scales.step_guard.step(pair.optimizer, own_flag=several)
        finally:  # a step that raised must not leave the weights swapped out
            pair.policy.after_step()
        if not several:
            self.update()
        return StepOutcome(found_inf, pair.next_host_flag(self.device), owner=pair.index)

    def step(self, optimizer: torch.optim.Optimizer | None = None) -> bool:
        """:meth:`step_async` and :meth:`confirm` in one call: True when the weights changed.
        A :class:`NonFiniteHalt` names the first module whose output on the last batch held
        inf/NaN (:mod:`.halt`)."""
        pair = self._pairs.of(optimizer)
        last = self._last_forward.get(pair.index)
        if last is None:  # an own loop's: the Trainer confirms its steps itself
            last = self._last_forward[pair.index] = LastForward(pair.model)
        try:
            return self.confirm(self.step_async(optimizer))
        except NonFiniteHalt as halt:
            raise last.explain(halt, self.autocast) from None

    def update(self) -> None:
        """The loss-scale update, once per iteration after the optimizers' steps (PyTorch's
        ``scaler.update()``): backs off when a step found inf/NaN, grows after
        ``growth_interval`` clean iterations. Does nothing when no optimizer stepped since
        the last update (so it is a no-op after :meth:`step` with one optimizer)."""
        if self._order.updated():
            self._scales.update()

    def confirm(self, outcome: StepOutcome, step: int | None = None) -> bool:
        """Account for a finished step; raise :class:`NonFiniteHalt` when training must stop.

        Returns True when the optimizer updated the weights. ``step`` (the optimizer-step
        number) only improves the error message.
        """
        skipped = outcome.skipped()
        counter = self._pairs[outcome.owner].skips \
            if outcome.owner is not None and outcome.owner < len(self._pairs) else self._unpaired
        counter.count(skipped, step)
        self.consecutive_skips = counter.consecutive
        if not skipped:
            return True
        self.skipped_steps += 1
        scale = self.loss_scale if self.loss_scale_tensor is None \
            else min(self.loss_scales().values())
        counter.check(scale=scale, min_scale=self.min_scale, max_bad_steps=self.max_bad_steps,
                      step=step, device=self.device)
        return False

    # ------------------------------------------------------------ checkpoint
    #: The checkpoint section and its layout (a :class:`~amptrain.checkpoint.stateful.Stateful`).
    section = SECTION
    format_version = FORMAT_VERSION

    def state_dict(self) -> dict[str, Any]:
        """Loss scaler(s), the skip counters, and each pair's counters and weight-rule
        buffers, in registration order (the layout: :mod:`.state`)."""
        state = {"name": self.name, **self._scales.state_dict(),
                 "skipped_steps": self.skipped_steps,
                 "consecutive_skips": self.consecutive_skips,
                 "pairs": self._pairs.state_dict()}
        if self.mode.plan is not None:   # the plan's content: a resume checks it
            state["precision_plan"] = self.mode.plan.state()
        if self._seeds:   # the stochastic rounding's counters (an optional key)
            state["stochastic_rounding"] = [seeds.state_dict() for seeds in self._seeds]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (today's layout: an older file goes through
        :meth:`migrate` first); scaler state only applies when both modes scale."""
        state = checked_state(state)  # type: ignore[assignment]
        check_resumed_plan(self.mode.plan, state.get("precision_plan"))
        if self.spec.loss_scaling:
            self._scales.load_state_dict(state)
        self.skipped_steps = int(state.get("skipped_steps", 0))
        self.consecutive_skips = int(state.get("consecutive_skips", 0))
        self._unpaired = SkipCounter(self.skipped_steps, self.consecutive_skips) \
            if not len(self._pairs) else SkipCounter()
        self._pairs.load_state_dict(state.get("pairs") or [])
        for seeds, saved in zip(self._seeds, state.get("stochastic_rounding") or []):
            seeds.load_state_dict(saved)

    def migrate(self, state: dict[str, Any], version: int) -> dict[str, Any]:
        """A section written at layout ``version`` in today's (:func:`.state.migrate_state`);
        at version 0 ``state`` is the whole file, which kept the section under its name."""
        return migrate_state(state.get(SECTION, {}) if version == 0 else state, version)

    def fp32_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The model's state with fp32 weights (the master copies where the mode keeps them);
        ``model`` may hold several set-up models (a GAN's generator and discriminator)."""
        return self._pairs.fp32_state_dict(model)

    def load_fp32_state_dict(self, model: nn.Module, state: dict[str, torch.Tensor]) -> None:
        """Load fp32 weights into a set-up model, its half weights and its masters."""
        self._pairs.load_fp32_state_dict(model, state)


def _whole(norm: torch.Tensor) -> torch.Tensor:
    # Sharded (DTensor) gradients give a DTensor norm: the full norm, as a plain tensor
    # (a scalar all-reduce, on the device), is what logs and checkpoints can hold.
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm
