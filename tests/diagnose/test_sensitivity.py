"""The ranking's order: a layer whose loss probe stands far above the others' goes last,
whatever its flush and noise terms (the end-to-end probe runs are in
tests/commands/test_plan.py)."""
from __future__ import annotations

from amptrain.diagnose.sensitivity import LayerSensitivity, by_cost, loss_noise, rank_layers
from tests.diagnose.conftest import bundle, config, peaked_model


def _layer(name: str, loss_delta: float | None, flushed: float = 0.1,
           flops: int = 16384) -> LayerSensitivity:
    return LayerSensitivity(name=name, flops=flops, flushed=flushed, saturated=0.01,
                            snr_db=18.5, loss_delta=loss_delta)


def test_a_layer_whose_loss_probe_stands_out_ranks_last_despite_its_score():
    # the README gpt's shape: body probes ~1e-4 (noise), the head's 5.8e-3; the head's
    # flush is no worse than a body layer's, so by score alone it ranks in the middle
    layers = [_layer("a", 1.1e-4, 0.10), _layer("head", 5.8e-3, 0.11),
              _layer("b", -1.4e-4, 0.12), _layer("c", 1.3e-4, 0.13)]
    ranked = by_cost(layers)
    assert [s.name for s in ranked] == ["a", "b", "c", "head"]
    assert [s.loss_outlier for s in ranked] == [False, False, False, True]
    assert ranked[-1].to_json()["loss_outlier"] is True
    # without the outlier's probe the score decides: head second
    layers[1] = _layer("head", 1.2e-4, 0.11)
    assert [s.name for s in by_cost(layers)] == ["a", "head", "b", "c"]


def test_the_noise_is_the_median_of_the_finite_probes_and_a_drop_never_stands_out():
    layers = [_layer("a", 1e-4), _layer("b", -3e-3), _layer("c", 2e-4), _layer("d", None),
              _layer("e", float("inf"))]
    assert loss_noise(layers) == 2e-4   # |1e-4|, |-3e-3|, |2e-4|: inf and None left out
    ranked = by_cost(layers)
    # a loss that got 15x the noise *better* is no risk; a non-finite loss is the worst
    assert {s.name for s in ranked if s.loss_outlier} == {"e"}
    assert ranked[-1].name == "e"
    assert loss_noise([_layer("x", None)]) is None
    assert not any(s.loss_outlier for s in by_cost([_layer("x", None), _layer("y", None)]))


def test_two_layers_alike_in_the_probe_keep_the_order_by_score_per_flop():
    small = _layer("small", 1e-4, 0.1, flops=4096)
    big = _layer("big", 1.5e-4, 0.1, flops=16384)
    assert [s.name for s in by_cost([small, big])] == ["big", "small"]


def test_the_probe_measures_saturation_with_the_candidates_mx_scale():
    """``mid``'s weight blocks peak just below a power of two (:func:`peaked_model`): FLOOR
    saturates each block's maximum, RCEIL none. One step, so the probe sees the weight as
    set."""
    saturated = {}
    for mode in ("floor", "rceil"):
        ranking = rank_layers(config(mx_scale=mode), bundle(), peaked_model(), "mxfp4", 1)
        saturated[mode] = {s.name: s.saturated for s in ranking}["mid"]
    assert saturated["floor"] >= 1 / 32 and saturated["rceil"] == 0.0
