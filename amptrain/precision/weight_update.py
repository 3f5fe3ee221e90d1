"""How an optimizer step lands on half weights that keep no fp32 copy (``bf16-true``, ``16-true``).

bf16 keeps 8 bits of mantissa: once ``lr x update`` falls below about ``|w| x 2^-9`` the
plain rounded add ``w + u`` returns ``w`` and training stalls (Zamirai et al., "Revisiting
BFloat16 Training", 2020). ``--weight-update`` picks what happens instead:

* ``plain``: the optimizer writes the rounded result into the weight (torch as it is).
* ``kahan``: a half-precision compensation buffer per weight keeps what rounding dropped and
  adds it back on the next step (Kahan summation; 2 bytes per parameter).
* ``stochastic``: the exact ``w + u`` is rounded up or down at random with the probabilities
  that make the rounding unbiased (no buffer; a generator whose state is checkpointed).

**How the update is captured.** The optimizer (torch's SGD/AdamW, fused, foreach or plain,
or torchao's low-bit Adam) keeps its own state exactly as it would without a rule. Around
each real ``optimizer.step()`` (step pre/post hooks, so a skip the guard decides on the host
never reaches us) every half parameter's storage is swapped for a buffer: for ``kahan`` its
compensation buffer, so the optimizer's own kernel computes ``c + u`` in fp32 and rounds it
relative to ``c``; for ``stochastic`` a zeroed buffer, so it yields ``u`` rounded relative to
``u`` itself (2^-9 of the update, not of the weight). Then the rule adds that to the real
weight. Differencing the weight before and after a plain step (``new - old``) would not do:
the half step has already rounded the update away. A weight's decay term (``lr x wd x w``) is
as small as an update and would be lost the same way, and it reads the weight, which is
swapped out during the step: the rule takes it out of the optimizer for the step and applies
it itself, as torch would (coupled: ``grad += wd x w`` before the step, for SGD and Adam;
decoupled: ``w x (1 - lr x wd)`` for AdamW), on the same terms as the update.

**Skipped steps.** A fused optimizer skips inside its kernel when ``found_inf`` is 1 (the
guards' device-side flag); the hooks still run, so every change is multiplied by
``1 - found_inf``: weights, compensation buffers and optimizer state stay bitwise as they
were (the stochastic generator still advances: deciding would need a host sync). A skip the
guard decides on the host does not call the optimizer, so nothing here runs at all.

The rule's work is a few whole-tensor operations per (device, dtype) chunk of the flattened
half parameters, not per parameter: its cost does not grow with the number of tensors.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from ..common.choices import WEIGHT_UPDATES
from ..common.errors import UserError, flag
from .modes import ModeSpec

log = logging.getLogger("amptrain")

#: Flat chunks hold at most this many elements, which bounds the rule's transient memory
#: (a few bytes per element of one chunk) however large the model.
CHUNK_ELEMENTS = 1 << 26
_HALF = (torch.float16, torch.bfloat16)


def check_rule(rule: str, spec: ModeSpec) -> None:
    """Raise a UserError when ``rule`` is unknown or does nothing in mode ``spec``."""
    if rule not in WEIGHT_UPDATES:
        raise UserError(f"{flag('weight_update')} must be one of {', '.join(WEIGHT_UPDATES)} "
                        f"(got {rule!r})")
    if rule != "plain" and not (spec.half_weights and not spec.master_weights):
        keeps = "fp32 master weights" if spec.master_weights else "fp32 weights"
        raise UserError(f"{flag('weight_update')} {rule} only applies to half weights without "
                        f"masters, but --precision {spec.name} keeps {keeps}: use --precision "
                        f"bf16-true (or 16-true) with it, or drop {flag('weight_update')}")


def raise_adam_eps(optimizer: torch.optim.Optimizer, floor: float, mode: str) -> None:
    """Raise every param group's float ``eps`` below ``floor`` to it (and say so).

    Adam's 1e-8 flushes to zero where its moments are fp16 (``16-true``), and a zero second
    moment turns the update into ``m / eps``, which overflows.
    """
    raised = False
    for group in optimizer.param_groups:
        if "eps" in group and isinstance(group["eps"], float) and group["eps"] < floor:
            group["eps"] = floor
            raised = True
    if raised:
        log.info("%s keeps Adam's moments in fp16: eps raised to %g so they cannot "
                 "divide by a flushed-to-zero second moment", mode, floor)


def fused_is_exact(optimizer_name: str, spec: ModeSpec, device: torch.device) -> bool:
    """Whether torch's fused kernel for amptrain's ``optimizer_name`` is exact here.

    torch 2.13's CPU fused SGD computes a wrong momentum for fp16/bf16 parameters
    (pytorch#191763, fixed upstream after 2.13), which the X-true modes train directly.
    """
    half_params = spec.half_weights and not spec.master_weights
    return not (optimizer_name == "sgd" and half_params and device.type == "cpu")


def _dense(t: torch.Tensor) -> bool:
    """True when ``t`` covers its memory without gaps or overlaps (any dimension order)."""
    expected = 1
    for size, stride in sorted(zip(t.shape, t.stride()), key=lambda d: d[1]):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


def _memory_order(t: torch.Tensor) -> torch.Tensor:
    """A dense tensor's elements as a 1-d view, in memory order (channels_last included)."""
    return t.as_strided((t.numel(),), (1,))


def _decoupled(optimizer: torch.optim.Optimizer, group: dict[str, Any]) -> bool:
    # torch's AdamW (and Adam(decoupled_weight_decay=True)), torchao's AdamW8bit.
    return bool(group.get("decoupled_weight_decay")) or isinstance(optimizer, torch.optim.AdamW) \
        or bool(getattr(optimizer, "is_adamw", False))


def _check_optimizer(optimizer: torch.optim.Optimizer, rule: str) -> None:
    known = isinstance(optimizer, (torch.optim.SGD, torch.optim.Adam)) \
        or type(optimizer).__module__.startswith("torchao.optim")
    decays = any(g.get("weight_decay") for g in optimizer.param_groups)
    if decays and not known:
        raise UserError(f"{flag('weight_update')} {rule} applies weight decay itself and knows "
                        f"SGD, Adam/AdamW and torchao's low-bit Adam; {type(optimizer).__name__} "
                        f"has weight_decay set: use one of those or weight_decay=0")
    if any(g.get("maximize") for g in optimizer.param_groups):
        raise UserError(f"{flag('weight_update')} {rule} does not support maximize=True")


@dataclass
class _Chunk:
    """Half parameters of one device and dtype, laid out end to end in memory order."""

    params: list[torch.Tensor]
    offsets: list[int]                     # start of each parameter in the flat layout
    numel: int
    buffer: torch.Tensor | None = None     # kahan: the compensation, flat
    step_buffer: torch.Tensor | None = None    # stochastic: the update of the step in progress
    originals: list[torch.Tensor] = field(default_factory=list)   # storages during a step

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Each parameter's part of ``flat``, shaped and strided as the parameter."""
        return [flat[o:o + p.numel()].as_strided(p.shape, p.stride())
                for p, o in zip(self.params, self.offsets)]


class WeightUpdate:
    """A ``kahan`` or ``stochastic`` weight-update rule attached to one optimizer.

    Built by :meth:`Precision.setup` in the half-weight modes without masters; it registers
    step hooks on ``optimizer``, so it acts on every real step, whoever calls it.
    ``seed`` seeds the stochastic-rounding generator (one per device).
    """

    def __init__(self, rule: str, optimizer: torch.optim.Optimizer, *, seed: int) -> None:
        if rule not in ("kahan", "stochastic"):
            raise ValueError(f"no weight-update rule {rule!r} to attach")
        _check_optimizer(optimizer, rule)
        self.rule = rule
        self.optimizer = optimizer
        self.chunks: list[_Chunk] = []
        by_kind: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.dtype in _HALF and _dense(p):
                    by_kind.setdefault((p.device, p.dtype), []).append(p)
        for members in by_kind.values():
            chunk = _Chunk([], [], 0)
            for p in members:
                if chunk.params and chunk.numel + p.numel() > CHUNK_ELEMENTS:
                    self.chunks.append(chunk)
                    chunk = _Chunk([], [], 0)
                chunk.params.append(p)
                chunk.offsets.append(chunk.numel)
                chunk.numel += p.numel()
            self.chunks.append(chunk)
        for chunk in self.chunks:
            if rule == "kahan":
                p = chunk.params[0]
                chunk.buffer = torch.zeros(chunk.numel, dtype=p.dtype, device=p.device)
        # Keyed by device type, not "cuda:N": every DDP rank draws the same stream (the
        # replicas stay identical), and a resumed rank N finds rank 0's saved state.
        self.generators: dict[str, torch.Generator] = {}
        if rule == "stochastic":
            for device in {c.params[0].device for c in self.chunks}:
                self.generators[device.type] = torch.Generator(device=device).manual_seed(seed)
        self._saved_decay: dict[int, Any] = {}
        self._decay: list[tuple[_Chunk, int, int, Any]] = []
        self._keep: torch.Tensor | None = None
        self._hooks = [optimizer.register_step_pre_hook(self._before),
                       optimizer.register_step_post_hook(self._after)]

    def buffers(self) -> list[torch.Tensor]:
        """What the rule keeps between steps: the compensation buffers (kahan)."""
        return [c.buffer for c in self.chunks if c.buffer is not None]

    @property
    def nbytes(self) -> int:
        """Bytes the rule keeps between steps."""
        return sum(b.numel() * b.element_size() for b in self.buffers())

    def remove(self) -> None:
        """Detach from the optimizer (its hooks); the buffers are kept."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    # ---------------------------------------------------------------- the step
    @torch.no_grad()
    def _before(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        found_inf = getattr(optimizer, "found_inf", None)   # the fused skip protocol
        self._keep = None if found_inf is None else 1.0 - found_inf
        keep = self._keep
        rule_params = {id(p): (c, o) for c in self.chunks for p, o in zip(c.params, c.offsets)}
        self._decay = []
        for index, group in enumerate(optimizer.param_groups):
            wd = group.get("weight_decay") or 0.0
            if not wd:
                continue
            with_grad = [p for p in group["params"] if p.grad is not None]
            if not any(id(p) in rule_params for p in group["params"]):
                continue  # an all-fp32 group: the optimizer decays it as usual
            self._saved_decay[index] = wd
            group["weight_decay"] = 0.0
            if not _decoupled(optimizer, group):
                # torch's SGD/Adam add wd x w to the gradient first; the same, before the swap.
                if with_grad:
                    torch._foreach_add_([p.grad for p in with_grad], with_grad, alpha=wd)
                continue
            factor = group["lr"] * wd
            factor = -factor if keep is None else -factor * keep
            fp32 = [p for p in with_grad if id(p) not in rule_params]
            if fp32:  # AdamW's order: w x (1 - lr x wd) before the update
                torch._foreach_mul_(fp32, 1 + factor)
            for p in with_grad:
                if id(p) in rule_params:
                    chunk, offset = rule_params[id(p)]
                    self._decay.append((chunk, offset, offset + p.numel(), factor))
        for chunk in self.chunks:
            flat = chunk.buffer if chunk.buffer is not None else \
                torch.zeros(chunk.numel, dtype=chunk.params[0].dtype,
                            device=chunk.params[0].device)
            chunk.originals = [p.data for p in chunk.params]
            for p, view in zip(chunk.params, chunk.views(flat)):
                p.data = view
            if chunk.buffer is None:
                chunk.step_buffer = flat

    def restore(self) -> None:
        """Give the parameters their storage back and the groups their weight decay
        (after the step, or after an exception inside it)."""
        for chunk in self.chunks:
            if chunk.originals:
                for p, original in zip(chunk.params, chunk.originals):
                    p.data = original
        for index, wd in self._saved_decay.items():
            self.optimizer.param_groups[index]["weight_decay"] = wd
        self._saved_decay = {}

    @torch.no_grad()
    def _after(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.restore()
        for chunk in self.chunks:
            originals, chunk.originals = chunk.originals, []
            weights = [_memory_order(t) for t in originals]
            old = torch.cat(weights)
            decay = [(a, b, f) for c, a, b, f in self._decay if c is chunk]
            if self.rule == "kahan":
                new = self._kahan(chunk, old, decay)
            else:
                delta, chunk.step_buffer = chunk.step_buffer, None
                assert delta is not None
                new = self._stochastic(old, delta, decay)
            torch._foreach_copy_(weights, list(new.split([p.numel() for p in chunk.params])))
        self._decay = []
        self._keep = None

    def _kahan(self, chunk: _Chunk, old: torch.Tensor,
               decay: list[tuple[int, int, Any]]) -> torch.Tensor:
        comp = chunk.buffer
        assert comp is not None
        for a, b, factor in decay:   # the decay joins the pending update (0 on a skip)
            comp[a:b].add_(old[a:b] * factor)
        # On a skip the pending part is not applied (x 0) and so stays pending, unchanged.
        pending = comp if self._keep is None else comp * self._keep
        new = old + pending                  # rounded once
        comp.add_(old.sub_(new))             # what the rounding dropped: c + (w - w')
        return new

    def _stochastic(self, old: torch.Tensor, delta: torch.Tensor,
                    decay: list[tuple[int, int, Any]]) -> torch.Tensor:
        exact = old.float()
        for a, b, factor in decay:
            exact[a:b].add_(exact[a:b] * factor)
        exact.add_(delta.float())            # on a skip: +0 everywhere, exact stays old
        generator = self.generators[old.device.type]
        return stochastic_round(exact, old.dtype, generator)

    # ------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The compensation buffers and generator states (copies, on the CPU)."""
        return {"rule": self.rule,
                "buffers": [c.buffer.detach().cpu().clone() for c in self.chunks
                            if c.buffer is not None],
                "generators": {d: g.get_state() for d, g in self.generators.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; another rule's (or a changed model's) state is
        dropped with a message, and the buffers start from zero."""
        buffers = [c.buffer for c in self.chunks if c.buffer is not None]
        saved = state.get("buffers") or []
        if state.get("rule") != self.rule or len(saved) != len(buffers) \
                or any(s.shape != b.shape for s, b in zip(saved, buffers)):
            log.warning("warning: the checkpoint's weight-update state (%s) does not fit "
                        "--weight-update %s: it starts afresh", state.get("rule"), self.rule)
            return
        for buffer, value in zip(buffers, saved):
            buffer.copy_(value)
        for device, gen_state in (state.get("generators") or {}).items():
            kind = device.split(":")[0]  # "cuda:1" in checkpoints written per device index
            if kind in self.generators:
                self.generators[kind].set_state(gen_state)


def stochastic_round(exact: torch.Tensor, dtype: torch.dtype,
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """Round fp32 ``exact`` to ``dtype`` up or down at random, unbiased: the upper neighbour
    is chosen with probability (exact - lower) / (upper - lower). Representable values are
    returned unchanged (and a skipped step's ``exact`` is the weight itself)."""
    if dtype == torch.bfloat16:
        # bf16 is fp32's top 16 bits: add 16 random low bits, then truncate (torchao's trick).
        # (random_ with bounds draws ~20% faster than randint on the CPU.)
        noise = torch.empty(exact.shape, dtype=torch.int32, device=exact.device).random_(
            0, 1 << 16, generator=generator)
        bits = exact.view(torch.int32).add_(noise).bitwise_and_(-65536)
        return bits.view(torch.float32).to(torch.bfloat16)
    nearest = exact.to(dtype)
    near = nearest.float()
    toward = torch.where(near > exact, float("-inf"), float("inf")).to(dtype)
    other = torch.nextafter(nearest, toward)
    chance = (exact - near).abs_().div_((other.float() - near).abs_())
    draw = torch.rand(exact.shape, device=exact.device, generator=generator)
    return torch.where(draw < chance, other, nearest)
