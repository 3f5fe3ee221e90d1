"""precision/misuse.py: a library caller's wrong arguments and calls out of order are
amptrain's own one-line error naming the argument (issue 36, class 6), or they work."""
from __future__ import annotations

import math

import pytest
import torch

from amptrain.common.errors import UserError
from amptrain.precision import Precision

# (id, Precision keywords, a fragment of the error)
ARGUMENTS = [
    # The settings are PrecisionConfig's, checked as their flags are (precision/options.py).
    ("min-scale-nan", dict(name="16-mixed", min_scale=math.nan),
     "min_scale must be a positive number"),
    ("min-scale-inf", dict(name="16-mixed", min_scale=math.inf),
     "min_scale must be a positive number"),
    ("min-scale-negative", dict(name="16-mixed", min_scale=-1.0),
     "min_scale must be a positive number"),
    ("min-scale-text", dict(name="16-mixed", min_scale="one"), "min_scale must be a number"),
    ("max-bad-steps-0", dict(max_bad_steps=0), "max_bad_steps must be an integer >= 1"),
    ("max-bad-steps-float", dict(max_bad_steps=2.5), "max_bad_steps must be an integer"),
    ("keep-fp32-numbers", dict(keep_fp32=[1, 2]), "keep_fp32 takes a pattern or a list"),
    ("keep-fp32-a-number", dict(keep_fp32=3), "keep_fp32 takes a pattern or a list"),
    ("device-unknown", dict(device="tpu9"), "device 'tpu9' is not a device"),
    ("device-a-number", dict(device=0.5), "device must be a name such as 'cpu'"),
    ("separate-scales-text", dict(separate_loss_scales="yes"),
     "separate_loss_scales is True or False"),
    ("fp8-skip-text", dict(fp8_skip_first_last="no"), "fp8_skip_first_last is True or False"),
]


@pytest.mark.parametrize("name,options,fragment", ARGUMENTS, ids=[c[0] for c in ARGUMENTS])
def test_a_wrong_argument_is_named(name, options, fragment):
    options = {"device": "cpu", **options}
    with pytest.raises(UserError, match=fragment.replace("(", r"\(")):
        Precision(**options)


def test_one_keep_fp32_string_is_one_pattern_not_its_characters():
    assert Precision("bf16-mixed", device="cpu", keep_fp32="head").keep_fp32 == ["head"]
    assert Precision("bf16-mixed", device="cpu", keep_fp32=("a", "b*")).keep_fp32 == ["a", "b*"]


def _pair(mode: str = "16-mixed", **options):
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    precision = Precision(mode, device="cpu", **options)
    precision.setup(model, optimizer)
    return precision, model, optimizer


@pytest.mark.parametrize("loss_id", ["d", -1, 1.5, True, None])
def test_a_loss_id_that_is_not_a_whole_number_is_named(loss_id):
    precision, model, _ = _pair(separate_loss_scales=True)
    loss = model(torch.randn(3, 4)).sum()
    with pytest.raises(UserError, match="loss_id must be an integer >= 0"):
        precision.backward(loss, loss_id=loss_id)


@pytest.mark.parametrize("state,fragment", [
    ([1, 2], "takes the dict of Precision.state_dict\\(\\) \\(got list\\)"),
    ("scaler", "got str"),
    ({"skipped_steps": "many"}, "state\\['skipped_steps'\\] is a str"),
    ({"scaler": [1]}, "state\\['scaler'\\] is a list"),
    ({"pairs": [1, 2]}, "state\\['pairs'\\] must hold one dict per pair"),
    # a checkpoint's precision section edited by hand (resume used to end in a traceback)
    ({"pairs": [{"skipped_steps": "many"}]}, "whole-number skip counts"),
    ({"pairs": [{"consecutive_skips": -3}]}, "whole-number skip counts"),
    ({"scaler": {"scale": "big"}}, "state\\['scaler'\\] is not a loss scaler's state"),
    ({"scaler": {"scale": float("nan"), "growth_factor": 2.0, "backoff_factor": 0.5,
                 "growth_interval": 2000, "_growth_tracker": 0}}, "is not a loss scaler's"),
    ({"loss_scalers": {"d": {}}}, "keyed by loss ids"),
    ({"loss_scalers": {"1": {"scale": 1.0}}}, "\\['loss_scalers'\\]\\['1'\\] is not a loss"),
])
def test_load_state_dict_of_something_else_is_named(state, fragment):
    precision, _, _ = _pair()
    with pytest.raises(UserError, match=fragment):
        precision.load_state_dict(state)


def test_a_state_dict_loads_back():
    precision, model, optimizer = _pair()
    other, _, _ = _pair()
    other.load_state_dict(precision.state_dict())  # the real thing still loads


def test_setup_of_a_meta_model_or_a_non_module_is_named():
    with torch.device("meta"):
        ghost = torch.nn.Linear(4, 2)
    precision = Precision("bf16-mixed", device="cpu")
    with pytest.raises(UserError, match="setup\\(\\): model has weights on the 'meta' device"):
        precision.setup(ghost, torch.optim.SGD(ghost.parameters(), lr=0.1))
    with pytest.raises(UserError, match="model must be a torch.nn.Module \\(got str\\)"):
        precision.setup("model")
    with pytest.raises(UserError, match="optimizer must be a torch.optim.Optimizer or None"):
        precision.setup(torch.nn.Linear(2, 2), "sgd")


def test_two_pairs_in_16_master_step_when_the_loss_depends_on_both():
    # A loss through both models: each optimizer finds its gradients in its fp32 masters.
    torch.manual_seed(0)
    first, second = torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)
    opt1 = torch.optim.SGD(first.parameters(), lr=0.1)
    opt2 = torch.optim.SGD(second.parameters(), lr=0.1)
    precision = Precision("16-master", device="cpu")
    precision.setup(first, opt1)
    precision.setup(second, opt2)
    before = [first.weight.detach().clone(), second.weight.detach().clone()]
    for _ in range(2):
        with precision.autocast():
            loss = second(first(torch.randn(8, 4))).float().pow(2).mean()
        precision.backward(loss)
        assert precision.step(opt1) and precision.step(opt2)
        precision.update()
    assert not torch.equal(before[0], first.weight) and not torch.equal(before[1], second.weight)
