"""precision/modes.py: the table of precision modes (one ModeSpec row each) and the names
and aliases users may type."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from amptrain import Precision
from amptrain.common.errors import UserError, cli_spelling
from amptrain.precision import MODES, PRECISION_ALIASES, PRECISION_NAMES, ModeSpec, canonical_name

HALF = (torch.float16, torch.bfloat16)


def test_names_aliases_and_unknown():
    assert canonical_name("bf16") == "bf16-mixed" and canonical_name("16") == "16-mixed"
    # Keras's mixed-precision policy names
    assert [canonical_name(n) for n in ("float32", "mixed_float16", "mixed_bfloat16")] == \
        ["32-true", "16-mixed", "bf16-mixed"]
    with cli_spelling(), pytest.raises(UserError, match="unknown --precision 'fp12'"):
        canonical_name("fp12")
    with pytest.raises(UserError, match="unknown precision 'fp12'"):
        canonical_name("fp12")
    assert Precision("auto", device="cpu").name in MODES


def test_every_alias_and_name_resolves_to_a_mode():
    assert PRECISION_NAMES == (*MODES, "auto")
    assert all(canonical_name(name) == name for name in PRECISION_NAMES)  # already canonical
    assert all(canonical_name(alias) in MODES for alias in PRECISION_ALIASES)
    assert not set(PRECISION_ALIASES) & set(PRECISION_NAMES)  # an alias never shadows a mode
    assert canonical_name("32") == canonical_name("fp32") == "32-true"
    assert canonical_name("16-mixed-master") == "16-master"


def test_an_unknown_name_lists_what_to_type_instead():
    with pytest.raises(UserError) as error:
        canonical_name("fp17")
    message = str(error.value)
    assert all(name in message for name in PRECISION_NAMES)
    assert all(alias in message for alias in PRECISION_ALIASES)
    with cli_spelling(), pytest.raises(UserError, match="^unknown --precision 'fp17'; choose"):
        canonical_name("fp17")


def test_a_mode_row_is_keyword_only_and_frozen():
    spec = MODES["bf16-mixed"]
    values = [getattr(spec, f.name) for f in dataclasses.fields(ModeSpec)]
    with pytest.raises(TypeError):
        ModeSpec(*values)
    assert ModeSpec(**dataclasses.asdict(spec)) == spec
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.loss_scaling = True  # type: ignore[misc]


@pytest.mark.parametrize("name", list(MODES))
def test_every_row_is_consistent(name):
    spec = MODES[name]
    assert spec.name == name and spec.summary
    assert spec.param_dtype in (torch.float32, *HALF)
    assert spec.compute_dtype in (None, *HALF)
    assert spec.half_weights == (spec.param_dtype != torch.float32)
    if spec.master_weights:  # an fp32 copy of weights that are not fp32 already
        assert spec.half_weights
    # Loss scaling protects fp16's narrow range, and only fp16's.
    assert spec.loss_scaling == (torch.float16 in (spec.param_dtype, spec.compute_dtype))
    if spec.compute_dtype is None:  # no autocast: fp32 maths on fp32 weights
        assert spec.param_dtype == torch.float32
    if spec.half_weights:  # half weights are computed in their own dtype
        assert spec.compute_dtype == spec.param_dtype
    if spec.tf32:
        assert spec.param_dtype == torch.float32 and spec.compute_dtype is None
    if spec.min_adam_eps is not None:  # the optimizer state itself is fp16
        assert spec.param_dtype == torch.float16 and not spec.master_weights


def test_the_users_spelling_is_shown_beside_amptrains_name():
    from amptrain.precision import as_given, label

    assert as_given(["float32", " mixed_bfloat16", "16-mixed", "auto"]) == {
        "32-true": "float32", "bf16-mixed": "mixed_bfloat16"}
    assert label("16-mixed", "mixed_float16") == "16-mixed (mixed_float16)"
    assert label("16-mixed", "16-mixed") == label("16-mixed") == "16-mixed"
    assert label("32-true", {"32-true": "float32"}) == "32-true (float32)"
    assert Precision("mixed_float16", device="cpu").given == "mixed_float16"


@pytest.mark.parametrize("level,mode,master,half_weights,scaling", [
    ("O0", "32-true", False, False, False),
    ("O1", "16-mixed", False, False, True),   # fp16 autocast, fp32 weights, dynamic scale
    ("O2", "16-master", True, True, True),    # fp16 model, fp32 masters, BN kept fp32
    ("O3", "16-true", False, True, True),     # pure fp16
])
def test_apex_opt_levels_are_aliases(level, mode, master, half_weights, scaling):
    import warnings

    from amptrain.precision import as_given, label

    assert canonical_name(level) == mode and PRECISION_ALIASES[level] == mode
    spec = MODES[mode]
    assert (spec.master_weights, spec.half_weights, spec.loss_scaling) == \
        (master, half_weights, scaling)
    assert label(mode, level) == f"{mode} ({level})"
    assert as_given([level]) == ({} if level == mode else {mode: level})
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fp16 is emulated on some CPUs: said, not tested here
        precision = Precision(level, device="cpu")
        precision.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert precision.name == mode and precision.given == level
    # Apex's keep_batchnorm_fp32: BatchNorm stays fp32 in the half-weight modes
    assert model[1].weight.dtype == torch.float32
    assert model[0].weight.dtype == (torch.float16 if half_weights else torch.float32)
