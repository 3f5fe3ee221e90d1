"""Emulated half precision (fp32 kernels, half rounding): bit-for-bit against references
with explicit rounding, against native kernels within fp32 accumulation-order
differences, dtypes exactly as native autocast's, and the loss scaler's steps."""
from __future__ import annotations

import math
import threading
from typing import Callable

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from amptrain.precision import Precision
from amptrain.precision.emulation import (ENV_SWITCH, EmulatedAutocast,
                                          install_emulated_kernels)
from amptrain.precision.hardware.support import cpu_has_native_bf16, emulated_fast

HALF = [torch.float16, torch.bfloat16]
MANTISSA = {torch.float16: 10, torch.bfloat16: 7}


def _rounded(t: torch.Tensor, half: torch.dtype) -> torch.Tensor:
    return t.detach().to(half).float()


# op, shapes of its inputs (all fp32 leaves), shape of its output
OPS: dict[str, tuple[Callable[..., torch.Tensor], list[tuple[int, ...]]]] = {
    "linear": (lambda x, w, b: F.linear(x, w, b), [(6, 40), (24, 40), (24,)]),
    "linear3d": (lambda x, w: F.linear(x, w), [(2, 5, 40), (24, 40)]),
    "matmul_broadcast": (lambda a, b: a @ b, [(2, 3, 7, 16), (1, 3, 16, 5)]),
    "mm": (torch.mm, [(7, 16), (16, 5)]),
    "bmm": (torch.bmm, [(3, 7, 16), (3, 16, 5)]),
    "addmm": (lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2.0),
              [(7, 5), (7, 16), (16, 5)]),
    "baddbmm": (lambda c, a, b: torch.baddbmm(c, a, b, beta=0.5, alpha=2.0),
                [(3, 7, 5), (3, 7, 16), (3, 16, 5)]),
    "conv1d": (lambda x, w, b: F.conv1d(x, w, b, padding=1), [(2, 3, 11), (5, 3, 3), (5,)]),
    "conv2d": (lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1),
               [(2, 3, 9, 9), (5, 3, 3, 3), (5,)]),
    "conv_transpose2d": (lambda x, w: F.conv_transpose2d(x, w, stride=2),
                         [(2, 4, 5, 5), (4, 3, 3, 3)]),
    "sdpa_mask": (lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
                  [(2, 2, 8, 16), (2, 2, 8, 16), (2, 2, 8, 16), (8, 8)]),
    "sdpa_causal": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                    [(2, 2, 8, 16), (2, 2, 8, 16), (2, 2, 8, 16)]),
}


def _inputs(shapes: list[tuple[int, ...]], seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).requires_grad_() for s in shapes]


def _emulated(op, inputs, grad, half):
    with EmulatedAutocast(half):
        out = op(*inputs)
    out.backward(grad)
    return out, [t.grad for t in inputs]


@pytest.mark.parametrize("half", HALF)
@pytest.mark.parametrize("name", list(OPS))
def test_op_equals_explicit_rounding_bit_for_bit(name, half):
    op, shapes = OPS[name]
    inputs = _inputs(shapes)
    with torch.no_grad():
        grad = torch.randn(op(*inputs).shape, generator=torch.Generator().manual_seed(1)).to(half)
    out, grads = _emulated(op, inputs, grad, half)
    # The reference: round the inputs, the fp32 op, round the output; its backward from
    # the half gradient in fp32, each input's gradient rounded to the half type.
    leaves = [_rounded(t, half).requires_grad_() for t in inputs]
    ref = op(*leaves)
    ref_grads = torch.autograd.grad(ref, leaves, grad.float())
    assert out.dtype == half
    assert torch.equal(out, ref.detach().to(half))
    for got, want in zip(grads, ref_grads):
        assert got.dtype == torch.float32   # autocast's cast node hands back fp32 gradients
        assert torch.equal(got, want.to(half).float())


@pytest.mark.parametrize("half", HALF)
def test_linear_backward_by_hand(half):
    """The backward's three products written out: x.grad = g W, W.grad = g^T x, b.grad = sum g."""
    x, w, b = _inputs([(6, 40), (24, 40), (24,)])
    grad = torch.randn(6, 24).to(half)
    out, (gx, gw, gb) = _emulated(lambda *a: F.linear(*a), [x, w, b], grad, half)
    xr, wr, br, g = _rounded(x, half), _rounded(w, half), _rounded(b, half), grad.float()
    assert torch.equal(out, (xr @ wr.T + br).to(half))
    assert torch.equal(gx, (g @ wr).to(half).float())
    assert torch.equal(gw, (g.T @ xr).to(half).float())
    assert torch.equal(gb, g.sum(0).to(half).float())


@pytest.mark.parametrize("half", HALF)
def test_half_weights_get_half_gradients(half):
    """X-true/X-master modes: half leaves keep half gradients, as under native autocast."""
    x = torch.randn(4, 8).to(half).requires_grad_()
    w = torch.randn(3, 8).to(half).requires_grad_()
    grad = torch.randn(4, 3).to(half)
    out, (gx, gw) = _emulated(lambda a, b: F.linear(a, b), [x, w], grad, half)
    assert out.dtype == gx.dtype == gw.dtype == half
    assert torch.equal(gw, (grad.float().T @ x.detach().float()).to(half))


def test_fp16_range_overflow_and_subnormals():
    """fp16's range, exactly: inputs and outputs above 65504 are inf, small values keep
    fp16's subnormals (not flushed), smaller ones underflow to zero."""
    x = torch.tensor([[300.0, 300.0], [70000.0, 0.0], [3e-6, 0.0], [1e-8, 0.0]])
    w = torch.eye(2)
    with EmulatedAutocast(torch.float16):
        y = F.linear(x, w)
        big = F.linear(torch.tensor([[300.0, 300.0]]), torch.tensor([[300.0, 300.0]]))
    assert math.isinf(y[1, 0]) and y[0, 0] == 300.0
    assert y[2, 0] == torch.tensor(3e-6).half() and 0 < y[2, 0] < 6.1e-5   # a subnormal
    assert y[3, 0] == 0.0
    assert math.isinf(big.item())   # 180000 > 65504: the output rounds to inf
    # the same in the backward: a gradient beyond fp16 becomes inf in the input's grad
    a = torch.ones(1, 2, requires_grad=True)
    with EmulatedAutocast(torch.float16):
        out = F.linear(a, torch.full((2, 2), 300.0))
    out.backward(torch.full((1, 2), 200.0, dtype=torch.float16))
    assert torch.isinf(a.grad).all()   # 2 * 200 * 300 = 120000


def ulp_difference(a: torch.Tensor, b: torch.Tensor, half: torch.dtype) -> float:
    """Largest |a - b| in units of the half type's last place at each element's magnitude,
    over the elements at least 1/64 of the largest (smaller ones come from cancellation,
    where an fp32 accumulation-order difference is large relative to the result)."""
    a, b = a.detach().double(), b.detach().double()
    scale = torch.maximum(a.abs(), b.abs())
    keep = scale >= scale.max() / 64
    tiny = torch.finfo(half).tiny
    ulp = torch.exp2(torch.floor(torch.log2(scale.clamp(min=tiny))) - MANTISSA[half])
    return float(((a - b).abs() / ulp)[keep].max())


#: Largest (forward, backward) difference allowed between emulated and native kernels,
#: in ulps: one rounding step where both accumulate in fp32 and round once (measured: 0
#: on an AVX512-BF16 EPYC; docs/performance.md lists them). More where the native kernel
#: rounds intermediate results to the half type: matmul's backward for a broadcast
#: operand rounds each batch's product before summing them (emulation sums in fp32);
#: CPU flash attention (is_causal) rounds the softmax probabilities and their gradients;
#: PyTorch's software fp16 convolutions round partial sums (bounds: measured x 2).
BOUNDS_BF16 = {"matmul_broadcast": (1, 18), "sdpa_causal": (10, 44)}
BOUNDS_FP16 = {"matmul_broadcast": (1, 20), "sdpa_causal": (12, 74), "conv1d": (32, 32),
               "conv2d": (32, 32), "conv_transpose2d": (32, 32)}


@pytest.mark.parametrize("name", list(OPS))
def test_matches_native_bf16_kernels_within_accumulation_order(name):
    if not cpu_has_native_bf16():
        pytest.skip("this CPU (or ONEDNN_MAX_CPU_ISA) has no native bf16 kernels to compare")
    _close_to_native(name, torch.bfloat16, BOUNDS_BF16.get(name, (1, 1)))


@pytest.mark.parametrize("name", list(OPS))
def test_matches_torch_fp16_kernels(name):
    """PyTorch's own fp16 CPU kernels (the slow path; native ones on AVX512-FP16)."""
    _close_to_native(name, torch.float16, BOUNDS_FP16.get(name, (1, 1)))


def _close_to_native(name: str, half: torch.dtype, bounds: tuple[int, int]) -> None:
    op, shapes = OPS[name]
    inputs = _inputs(shapes, seed=2)
    native_inputs = [t.detach().clone().requires_grad_() for t in inputs]
    with torch.no_grad():
        grad = torch.randn(op(*inputs).shape, generator=torch.Generator().manual_seed(3)).to(half)
    out, grads = _emulated(op, inputs, grad, half)
    with torch.autocast("cpu", dtype=half):
        native = op(*native_inputs)
    native.backward(grad)
    assert native.dtype == out.dtype
    assert ulp_difference(out, native, half) <= bounds[0]
    for got, t in zip(grads, native_inputs):
        assert got.dtype == t.grad.dtype
        assert ulp_difference(got, t.grad, half) <= bounds[1]


def test_outside_the_context_autocast_is_unchanged():
    """Once installed, the replaced kernels do what autocast does for everyone else:
    plain autocast, another dtype nested inside, and other threads."""
    install_emulated_kernels()
    x, w = torch.randn(4, 8), torch.randn(3, 8)
    native = F.linear(x.bfloat16(), w.bfloat16())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(F.linear(x, w), native)
    with EmulatedAutocast(torch.float16), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(F.linear(x, w), native)
    seen = []

    def other_thread():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            seen.append(F.linear(x, w))
    with EmulatedAutocast(torch.bfloat16):
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
    assert torch.equal(seen[0], native)


def test_autocast_off_inside_runs_fp32():
    x, w = torch.randn(4, 8), torch.randn(3, 8)
    with EmulatedAutocast(torch.float16), torch.autocast("cpu", enabled=False):
        assert torch.equal(F.linear(x, w), x @ w.T)


def test_switch_and_support(monkeypatch):
    cpu = torch.device("cpu")
    features = {"tensor_cores": False, "amx": False, "fp16": False, "bf16": False,
                "tf32": False, "fp8": False}
    fast = emulated_fast(cpu, features)
    assert fast["16-mixed"] and fast["bf16-true"] and not fast["32-true"]
    monkeypatch.setenv(ENV_SWITCH, "off")
    assert not any(on for name, on in emulated_fast(cpu, features).items()
                   if name in ("16-mixed", "16-master", "16-true", "bf16-mixed", "bf16-master",
                               "bf16-true"))
    assert not Precision("16-mixed", device="cpu").emulated_fast


# -------------------------------------------------------------- whole models
class _Tiny(nn.Module):
    """Conv, BatchNorm, attention and Linear layers: every emulated kind in one model."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn(self.conv(x))).flatten(2).transpose(1, 2)   # b x 16 x 8
        h = self.norm(h + self.attn(h, h, h, need_weights=False)[0])
        return self.head(h.mean(1))


def _train(mode: str, monkeypatch, switch: str | None, steps: int = 12, **scaler):
    if switch is None:
        monkeypatch.delenv(ENV_SWITCH, raising=False)
    else:
        monkeypatch.setenv(ENV_SWITCH, switch)
    # On a CPU with native bf16, capping oneDNN makes the precision layer treat bf16 as
    # emulated (the slow path then still runs oneDNN's bf16 kernels: same dtypes).
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    torch.manual_seed(0)
    model = _Tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    prec = Precision(mode, device="cpu", **scaler)
    model, optimizer = prec.setup(model, optimizer)
    dtypes: list[tuple[str, torch.dtype]] = []

    def record(module, args, out, name):
        dtypes.append((name, (out[0] if isinstance(out, tuple) else out).dtype))
    hooks = [m.register_forward_hook(lambda m, i, o, name=name: record(m, i, o, name))
             for name, m in model.named_modules() if name]
    g = torch.Generator().manual_seed(1)
    skipped, scales = [], []
    for step in range(steps):
        x = torch.randn(8, 1, 4, 4, generator=g) * (1 + step)
        y = torch.randint(0, 3, (8,), generator=g)
        with prec.autocast():
            loss = F.cross_entropy(model(x), y)
        prec.backward(loss)
        if step == 0:
            grad_dtypes = [p.grad.dtype for p in model.parameters() if p.grad is not None]
            for hook in hooks:
                hook.remove()
        skipped.append(not prec.step(optimizer))
        optimizer.zero_grad()
        scales.append(prec.loss_scale)
    prec.teardown()
    return prec, dtypes, grad_dtypes, skipped, scales, model


@pytest.mark.parametrize("mode", ["16-mixed", "bf16-mixed", "16-master", "bf16-true"])
def test_model_dtypes_match_the_slow_path(mode, monkeypatch):
    """Every module output and every gradient has the dtype native autocast gives."""
    fast = _train(mode, monkeypatch, None, steps=1)
    slow = _train(mode, monkeypatch, "off", steps=1)
    assert fast[0].emulated_fast and not slow[0].emulated_fast
    assert fast[1] == slow[1] and fast[2] == slow[2]


def test_fp16_overflow_and_backoff_at_the_same_steps_as_the_slow_path(monkeypatch):
    """A large initial scale and a short growth interval make the fp16 scaler overflow,
    back off and grow again; the emulated and the slow path skip the same steps."""
    scaler = dict(init_scale=2.0 ** 24, growth_interval=3)
    fast = _train("16-mixed", monkeypatch, None, steps=14, **scaler)
    slow = _train("16-mixed", monkeypatch, "off", steps=14, **scaler)
    assert fast[0].emulated_fast
    assert any(fast[3]) and not all(fast[3])
    assert fast[3] == slow[3]
    assert fast[4] == slow[4]
    for a, b in zip(fast[5].parameters(), slow[5].parameters()):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-3)


@pytest.mark.parametrize("half", HALF)
def test_fp64_ops_stay_fp64_as_under_native_autocast(half):
    # Autocast never casts fp64: statistics summed in fp64 inside an evaluation's autocast
    # (the GAN's Fréchet distance) must not come back rounded to the half format.
    g = torch.Generator().manual_seed(0)
    f = torch.randn(64, 8, generator=g, dtype=torch.float64)
    exact = f.T @ f
    with torch.autocast("cpu", dtype=half):
        native = f.T @ f
    with EmulatedAutocast(half):
        emulated = f.T @ f
        linear = F.linear(f, f[:3])
    assert native.dtype == emulated.dtype == linear.dtype == torch.float64
    assert torch.equal(emulated, exact) and torch.equal(native, exact)
    assert torch.equal(linear, f @ f[:3].T)
