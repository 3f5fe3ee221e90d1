"""What every built-in model does (issue 43 item 8): one suite over the registry instead of
a copy of the same tests per model file.

Every name registered in :data:`amptrain.models.MODELS` is either a conformance case here
(built from a small spec for the data it takes: forward and backward give finite gradients
on every parameter, a few bf16-mixed Trainer steps change its weights, data of another
kind is refused in one line naming ``--model``) or listed in :data:`ELSEWHERE` with the
file that tests it and why it is no case here.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from amptrain.common.errors import UserError
from amptrain.data import TensorData
from amptrain.models import MODELS, ModelInputs, build_model
from amptrain.trainer import Trainer
from tests.models.conftest import FEATURES, IMAGES, SEQUENCES, batch_for

LM = ModelInputs(num_classes=256, input_shape=(16,), kind="lm", vocab_size=256)
LANGUAGE = LM.kind  # ModelInputs names it "tokens"

#: name -> (a small spec, the data it takes, data of a kind it refuses, the refusal's text).
CASES: dict[str, tuple[str, ModelInputs, ModelInputs, str]] = {
    "mlp": ("mlp:32", FEATURES, SEQUENCES, "lstm or transformer"),
    "cnn": ("cnn:8", IMAGES, SEQUENCES, "needs images.*try --model lstm or transformer"),
    "resnet18": ("resnet18:8", IMAGES, FEATURES, "needs images.*try --model mlp"),
    "resnet50": ("resnet50:4", IMAGES, SEQUENCES, "needs images"),
    "lstm": ("lstm:embed=16,hidden=16", SEQUENCES, IMAGES,
             "needs token sequences.*try --model cnn or resnet18"),
    "transformer": ("transformer:d_model=32,layers=1,heads=2,ff=64", SEQUENCES, FEATURES,
                    "needs token sequences"),
    "gpt": ("gpt:layers=2,heads=2,width=32", LM, IMAGES,
            "is a language model: it needs text"),
}
#: Registered names that are no case here: where they are tested, and why.
ELSEWHERE = {
    "dcgan": "tests/models/test_dcgan.py: two parts (generator, discriminator), a GAN task",
    "actor-critic": "tests/models/test_actor_critic.py: a policy and a value, the ppo task",
    "demo-overflow": "tests/models/test_range_demos.py: built to overflow on purpose",
    "demo-underflow": "tests/models/test_range_demos.py: built to underflow on purpose",
    "module": "tests/models/test_external.py: the user's own factory",
    "timm": "tests/models/test_external.py: a timm model (an optional package)",
    "hf": "tests/models/test_hf.py: a Hugging Face directory (an optional package)",
    "keras": "tests/models/test_keras.py: a .keras file (an optional package)",
}


def _batch(inputs: ModelInputs, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    if inputs.kind == LANGUAGE:  # token targets (which ones does not matter here)
        g = torch.Generator().manual_seed(seed)
        x = torch.randint(0, inputs.vocab_size or 256, (n, *inputs.input_shape), generator=g)
        return x, x
    return batch_for(inputs, n=n, seed=seed)


def _loss(inputs: ModelInputs, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if inputs.kind == LANGUAGE:
        return F.cross_entropy(logits.flatten(0, -2), y.flatten())
    return F.cross_entropy(logits, y)


def test_every_registered_model_is_a_case_or_said_elsewhere():
    assert set(CASES) | set(ELSEWHERE) == set(MODELS)
    assert not set(CASES) & set(ELSEWHERE)


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_and_backward_reach_every_parameter(name):
    spec, inputs, _, _ = CASES[name]
    torch.manual_seed(0)
    model = build_model(spec, inputs)
    x, y = _batch(inputs, n=6, seed=0)
    logits = model(x)
    expected = (len(y), *inputs.input_shape, inputs.num_classes) if inputs.kind == LANGUAGE \
        else (len(y), inputs.num_classes)
    assert logits.shape == expected and logits.dtype == torch.float32
    _loss(inputs, logits, y).backward()
    for parameter_name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), parameter_name
    assert isinstance(model.head, nn.Linear) and model.head.out_features == inputs.num_classes


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_few_bf16_mixed_steps_change_the_weights(name):
    spec, inputs, _, _ = CASES[name]
    torch.manual_seed(0)
    model = build_model(spec, inputs)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = _batch(inputs, n=32, seed=1)
    trainer = Trainer(precision="bf16-mixed", device="cpu", batch_size=8, max_steps=3,
                      log_every=1, no_progress=True, keep_fp32=["head"])
    result = trainer.fit(model, TensorData(x[:24], y[:24]), TensorData(x[24:], y[24:]),
                         loss_fn=(lambda out, y: _loss(inputs, out, y))
                         if inputs.kind == LANGUAGE else None)
    assert result.steps == 3 and result.skipped_steps == 0
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in result.history if "loss" in r)
    assert result.val_loss is not None and torch.isfinite(torch.tensor(result.val_loss))
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize("name", sorted(CASES))
def test_data_of_another_kind_is_refused_in_one_line(name):
    spec, _, wrong, match = CASES[name]
    with pytest.raises(UserError, match=match) as caught:
        build_model(spec, wrong)
    assert "--model" in str(caught.value) and "\n" not in str(caught.value)
