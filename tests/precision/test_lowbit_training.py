"""The NVFP4 training recipe's parts and the DeepSeek-style fp8 blocks: the random
Hadamard transform is orthogonal, stochastic rounding is unbiased and seeded (bitwise the
same after a resume, the global RNG untouched), the 2D weight blocks match a reference
computed by hand, and the fp8 tiles match torchao's own torch references."""
from __future__ import annotations

import importlib.util
import warnings

import pytest
import torch
from torch import nn

from amptrain.common.errors import AmptrainWarning
from amptrain.common.quiet import quiet_torchao
from amptrain.precision import Precision
from amptrain.precision.lowbit import RECIPES, lowbit_linear
from amptrain.precision.lowbit_formats import qdq_fp8_blocks, qdq_nvfp4, round_e2m1_stochastic_
from amptrain.precision.lowbit_training import (StochasticSeeds, apply_rht, hadamard_matrix,
                                                rht_matrix)
from tests.precision.test_lowbit_formats import E2M1_GRID, E4M3_GRID, reference_round

needs_torchao = pytest.mark.skipif(importlib.util.find_spec("torchao") is None,
                                   reason="torchao is not installed")


# ------------------------------------------------------------------- Hadamard
def test_the_random_hadamard_transform_is_orthogonal_and_the_same_everywhere():
    h = hadamard_matrix(16)
    assert set(h.unique().tolist()) == {-1.0, 1.0}
    m = rht_matrix()
    assert torch.equal(m @ m.t(), torch.eye(16))          # exactly: entries are +-1/4
    torch.manual_seed(123)                                 # the global RNG plays no part
    assert torch.equal(rht_matrix(), m)
    signs = (m / h).mul(4).diagonal()                      # M = H diag(s) / 4
    assert set(signs.unique().tolist()) == {-1.0, 1.0}


def test_the_transform_leaves_the_exact_weight_gradient_product_unchanged():
    gen = torch.Generator().manual_seed(0)
    g = torch.randn(40, 24, generator=gen, dtype=torch.float64)   # 40 tokens: padded
    x = torch.randn(40, 32, generator=gen, dtype=torch.float64)
    product = apply_rht(g).t() @ apply_rht(x)
    assert torch.allclose(product, g.t() @ x, rtol=0, atol=1e-12)
    assert not torch.allclose(apply_rht(x)[:40], x)        # it does transform


# -------------------------------------------------------- stochastic rounding
def test_stochastic_rounding_is_unbiased():
    # 1.9 / 2.1, 3.9 / 4.1 and 0.4: next to a binade's edge, where the offset can carry
    # the value into the neighbouring binade; the last six are on the grid
    on_grid = [6.0, 0.0, 0.5, 1.5, 2.0, 4.0]
    values = torch.tensor([0.1, 0.3, 0.4, 0.7, 1.2, 1.9, 2.1, 2.4, 3.3, 3.9, 4.1, 4.6, 5.5,
                           *on_grid])
    draws = 20000
    gen = torch.Generator().manual_seed(1)
    rounded = round_e2m1_stochastic_(values.repeat(draws, 1), gen)
    assert set(rounded.unique().tolist()) <= set(E2M1_GRID)
    mean = rounded.double().mean(0)
    # spacing <= 2: the standard error of the mean is at most 1 / sqrt(draws)
    assert torch.allclose(mean, values.double(), atol=5 / draws ** 0.5)
    exact = len(on_grid)
    assert torch.equal(rounded[:, -exact:], values[-exact:].repeat(draws, 1))   # they stay
    # only the two neighbours of each value are ever drawn (1.9 never to 1.0 or 3.0, 2.1
    # never to 1.5)
    grid = torch.tensor(E2M1_GRID)
    for column, value in enumerate(values.tolist()[:-exact]):
        below, above = grid[grid <= value].max(), grid[grid >= value].min()
        assert set(rounded[:, column].unique().tolist()) == {below.item(), above.item()}
    nearest = reference_round(values, E2M1_GRID)
    assert not torch.allclose(mean, nearest.double(), atol=0.05)        # not nearest


def test_stochastic_rounding_is_seeded_resumable_and_leaves_the_global_rng_alone():
    torch.manual_seed(0)
    x = torch.randn(64, 48)
    before = torch.get_rng_state()
    run = StochasticSeeds(7, ["a", "b"])
    outputs = [qdq_nvfp4(x, generator=run.generator("a", x.device), stochastic=True)
               for _ in range(3)]
    assert torch.equal(torch.get_rng_state(), before)
    assert not torch.equal(outputs[0], outputs[1])           # a fresh draw per call
    # a run that stopped after two calls and resumed from its checkpointed counters
    stopped = StochasticSeeds(7, ["a", "b"])
    for _ in range(2):
        stopped.generator("a", x.device)
    resumed = StochasticSeeds(0, ["a", "b"])
    resumed.load_state_dict(stopped.state_dict())
    again = qdq_nvfp4(x, generator=resumed.generator("a", x.device), stochastic=True)
    assert torch.equal(again, outputs[2])
    other_layer = qdq_nvfp4(x, generator=run.generator("b", x.device), stochastic=True)
    assert not torch.equal(other_layer, outputs[0])


def test_nvfp4_recipe_training_resumes_bitwise_through_the_precision_checkpoint():
    def steps(model, precision, optimizer, count):
        gen = torch.Generator().manual_seed(5)
        for _ in range(count):
            x = torch.randn(32, 16, generator=gen)
            with precision.autocast():
                loss = model(x).float().pow(2).mean()
            optimizer.zero_grad()
            precision.backward(loss)
            precision.step(optimizer)

    def build():
        torch.manual_seed(3)
        model = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 4))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", AmptrainWarning)
            precision = Precision("nvfp4", device="cpu")
            precision.setup(model, optimizer)
        return model, precision, optimizer

    model, precision, optimizer = build()
    steps(model, precision, optimizer, 2)
    saved = (precision.state_dict(), {k: v.clone() for k, v in model.state_dict().items()})
    assert saved[0]["stochastic_rounding"][0]["calls"] == {"1": 2}
    steps(model, precision, optimizer, 1)
    model2, precision2, optimizer2 = build()
    precision2.load_state_dict(saved[0])
    model2.load_state_dict(saved[1])
    steps(model2, precision2, optimizer2, 1)
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)


# ----------------------------------------------------------------- 2D blocks
def reference_nvfp4_2d(w: torch.Tensor) -> torch.Tensor:
    """By hand: one e4m3 scale per 16x16 tile, the fp32 per-tensor scale over all."""
    tensor_scale = torch.tensor(float(w.abs().max()) / 2688.0, dtype=torch.float32)
    out = torch.empty_like(w)
    for r in range(0, w.shape[0], 16):
        for c in range(0, w.shape[1], 16):
            tile = w[r:r + 16, c:c + 16]
            ratio = torch.tensor(float(tile.abs().max()) / 6.0, dtype=torch.float32) \
                / tensor_scale
            block = reference_round(ratio.clamp(2.0 ** -6, 448.0).reshape(1), E4M3_GRID)
            reciprocal = (1.0 / tensor_scale) / block
            values = reference_round((tile * reciprocal).clamp(-6, 6).flatten(), E2M1_GRID)
            out[r:r + 16, c:c + 16] = values.reshape(tile.shape) * (tensor_scale * block)
    return out


def test_nvfp4_recipe_weights_use_16x16_blocks_as_computed_by_hand():
    torch.manual_seed(2)
    w = torch.randn(32, 48) * torch.logspace(-2, 2, 48)
    w[:16, 16:32] = 0.0                                      # an all-zero tile
    got = RECIPES["nvfp4"].weight(w, -1)
    assert torch.equal(got, reference_nvfp4_2d(w))
    assert torch.equal(RECIPES["nvfp4"].weight(w, 0), got)   # whichever axis reduces
    assert not torch.equal(got, qdq_nvfp4(w))                # not the 1x16 blocks


def reference_fp8_tiles(tiles: torch.Tensor) -> torch.Tensor:
    """torchao's torch reference, transcribed: per row of ``tiles``, s = fp32(448 /
    max(amax, 1e-12) in fp64), q = e4m3(clamp(x s)), dequantised q / s."""
    amax = tiles.abs().amax(1, keepdim=True).double().clamp(min=1e-12)
    scale = (448.0 / amax).float()
    q = (tiles * scale).clamp(-448, 448).to(torch.float8_e4m3fn).float()
    return q / scale


def test_fp8_blockwise_tiles_match_the_reference():
    torch.manual_seed(4)
    x = torch.randn(256, 384) * torch.logspace(-3, 3, 384)
    rows = reference_fp8_tiles(x.reshape(-1, 128)).reshape(256, 384)
    assert torch.equal(qdq_fp8_blocks(x, -1), rows)                       # 1x128
    columns = reference_fp8_tiles(x.t().reshape(-1, 128)).reshape(384, 256).t()
    assert torch.equal(qdq_fp8_blocks(x, 0), columns)                      # 128x1
    tiles = x.reshape(2, 128, 3, 128).transpose(1, 2).reshape(6, -1)
    blocks = reference_fp8_tiles(tiles).reshape(2, 3, 128, 128).transpose(1, 2)
    assert torch.equal(qdq_fp8_blocks(x, square=True), blocks.reshape(256, 384))


@needs_torchao
@pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                    reason="torchao's blockwise module imports Triton")
def test_fp8_blockwise_tiles_match_torchaos_references():
    with quiet_torchao():
        from torchao.prototype.blockwise_fp8_training.kernels import (
            torch_blockwise_scale_act_quant_lhs, torch_blockwise_scale_act_quant_rhs,
            torch_blockwise_scale_weight_quant)
    torch.manual_seed(4)
    x = torch.randn(256, 384) * torch.logspace(-3, 3, 384)
    data, scale = torch_blockwise_scale_act_quant_lhs(x, 128)      # 1x128 tiles
    theirs = (data.float().reshape(256, 3, 128) * scale.reshape(256, 3, 1)).reshape(256, 384)
    assert torch.equal(qdq_fp8_blocks(x, -1), theirs)
    data, scale = torch_blockwise_scale_act_quant_rhs(x, 128)      # 128x1 tiles
    theirs = (data.float().reshape(2, 128, 384) * scale.reshape(2, 1, 384)).reshape(256, 384)
    assert torch.equal(qdq_fp8_blocks(x, 0), theirs)
    data, scale = torch_blockwise_scale_weight_quant(x, 128)       # 128x128 blocks
    theirs = data.float() * scale.repeat_interleave(128, 0).repeat_interleave(128, 1)
    assert torch.equal(qdq_fp8_blocks(x, square=True), theirs)


def test_fp8_blockwise_and_nvfp4_recipes_train_a_wide_mlp():
    for name in ("fp8-blockwise", "nvfp4"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                              nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", AmptrainWarning)
            precision = Precision(name, device="cpu", lowbit_bf16_last=1)
            precision.setup(model, optimizer)
        plan = precision.float8_plan
        assert plan.convert == ["2"] and "bf16" in plan.skipped["4"]   # the last one kept
        x, y = torch.randn(64, 8), torch.randint(0, 2, (64,))
        losses = []
        for _ in range(6):
            with precision.autocast():
                loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            precision.backward(loss)
            assert all(torch.isfinite(p.grad).all() for p in model.parameters())
            precision.step(optimizer)
            losses.append(float(loss))
        assert losses[-1] < losses[0], name


def test_the_recipe_backward_is_the_exact_product_before_quantisation():
    """With the quantisers' error taken out (a value grid every format holds exactly),
    the RHT leaves the weight gradient as the plain product: the transform is applied to
    both operands alike."""
    torch.manual_seed(6)
    x = torch.randn(32, 64, requires_grad=True)
    w = torch.randn(48, 64, requires_grad=True)
    out = lowbit_linear(x, w, None, RECIPES["nvfp4"])
    grad = torch.randn_like(out)
    out.backward(grad)
    exact = grad.t() @ x.detach()
    error = float((w.grad - exact).norm() / exact.norm())
    assert 0 < error < 0.3          # quantised (NVFP4's ~10 % per operand), not broken


@pytest.mark.parametrize("part,changed", [("rht", "hadamard"), ("sr", "stochastic"),
                                          ("2d", "square")])
def test_the_ablation_leaves_one_part_of_the_nvfp4_recipe_out(part, changed):
    from amptrain.precision.lowbit import recipe_for
    from amptrain.precision.modes import MODES
    full, ablated = recipe_for(MODES["nvfp4"]), recipe_for(MODES["nvfp4"], without=part)
    assert full.hadamard and full.stochastic and full.weight.square
    parts = {"hadamard": ablated.hadamard, "stochastic": ablated.stochastic,
             "square": ablated.weight.square}
    assert parts == {name: name != changed for name in parts}
    assert recipe_for(MODES["fp8-blockwise"], without=part) == RECIPES["fp8-blockwise"]
    with pytest.warns(AmptrainWarning, match="does nothing"):
        Precision("mxfp8", device="cpu", nvfp4_without=part)


def test_a_broken_stochastic_rounding_section_is_refused_by_name():
    from amptrain.common.errors import UserError
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AmptrainWarning)
        precision = Precision("nvfp4", device="cpu")
    with pytest.raises(UserError, match="stochastic_rounding"):
        precision.load_state_dict({"name": "nvfp4", "stochastic_rounding": [{"calls": {"1": "x"}}]})
