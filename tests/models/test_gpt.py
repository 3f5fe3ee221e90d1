"""amptrain/models/gpt.py: the ``gpt`` language model."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from amptrain.data import TensorData
from amptrain.common.errors import UserError
from amptrain.models import GPT, ModelInputs, build_model
from amptrain.models.gpt import AttentionScores
from amptrain.trainer import Trainer
from tests.models.conftest import IMAGES, SEQUENCES

LM = ModelInputs(num_classes=256, input_shape=(16,), kind="lm", vocab_size=256)
SMALL = "gpt:layers=2,heads=2,width=32"


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, -2), targets.flatten())


def tokens(n: int, t: int = 16, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (n, t), generator=torch.Generator().manual_seed(seed))


def test_shapes_tied_head_and_defaults():
    torch.manual_seed(0)
    model = build_model("gpt", LM)
    assert isinstance(model, GPT) and model.context == 16
    assert len(model.blocks) == 4 and model.blocks[0].attn.heads == 4
    assert model.token.weight.shape == (256, 128)
    assert model.head.weight is model.token.weight  # tied
    x = tokens(3)
    logits = model(x)
    assert logits.shape == (3, 16, 256) and logits.dtype == torch.float32
    lm_loss(logits, x).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    # A fresh model predicts close to uniformly: its loss on unrelated targets is near
    # ln(vocab). (Not on x itself: the tied head favours the input token from the start.)
    assert abs(lm_loss(logits, tokens(3, seed=1)).item() - math.log(256)) < 0.1
    assert model(x[:, :5]).shape == (3, 5, 256)  # shorter than the context is fine


def test_options_apply():
    model = build_model("gpt:layers=3,heads=2,width=64,context=32,dropout=0.1", LM)
    assert len(model.blocks) == 3 and model.blocks[0].attn.heads == 2
    assert model.token.weight.shape == (256, 64) and model.context == 32
    assert model.position.weight.shape == (32, 64)
    assert model.blocks[0].mlp.fc.out_features == 256 and model.dropout.p == 0.1
    # GPT-2's scaled init of the residual projections.
    std = model.blocks[0].mlp.proj.weight.std().item()
    assert abs(std - 0.02 / math.sqrt(6)) < 0.002
    vocab = build_model(SMALL, ModelInputs(100, (8,), "lm", vocab_size=100))
    assert vocab.head.out_features == 100


@pytest.mark.parametrize("spec,inputs,match", [
    ("gpt", IMAGES, "language model.*--data text:PATH"),
    ("gpt", SEQUENCES, "language model.*--data text:PATH"),
    ("gpt:context=8", LM, "--seq-len 16 is longer than the model's context 8"),
    ("gpt:heads=3", LM, "width 128 is not divisible by heads 3"),
    ("gpt:depth=2", LM, "unknown option 'depth=2'"),
    ("gpt:layers=0", LM, "layers must be >= 1"),
    ("gpt:width=big", LM, "width must be an integer"),
    ("gpt:dropout=1", LM, r"dropout must be in \[0, 1\)"),
    ("gpt:attention=flash", LM, "attention must be one of auto, fused, explicit"),
])
def test_mismatches_and_bad_options_are_user_errors(spec, inputs, match):
    with pytest.raises(UserError, match=match):
        build_model(spec, inputs)


def test_a_sequence_longer_than_the_context_is_refused():
    model = build_model("gpt:layers=1,heads=2,width=32,context=8", ModelInputs(256, (8,), "lm"))
    with pytest.raises(UserError, match="longer than the model's context 8"):
        model(tokens(1, 9))


def test_causal_changing_a_token_leaves_earlier_logits_alone():
    torch.manual_seed(0)
    model = build_model(SMALL, LM).eval()
    x = tokens(2)
    changed = x.clone()
    changed[:, 9] = (changed[:, 9] + 1) % 256
    with torch.no_grad():
        a, b = model(x), model(changed)
    assert torch.equal(a[:, :9], b[:, :9])
    assert not torch.allclose(a[:, 9:], b[:, 9:])


def test_hooks_switch_to_the_explicit_path_which_equals_sdpa():
    torch.manual_seed(0)
    model = build_model(SMALL, LM).eval()
    x = tokens(2)
    with torch.no_grad():
        fused = model(x)
    seen: list[str] = []
    handles = [m.register_forward_hook(lambda mod, args, out, name=name: seen.append(name))
               for name, m in model.named_modules() if name.endswith((".scores", ".softmax"))]
    with torch.no_grad():
        explicit = model(x)
    for h in handles:
        h.remove()
    assert seen[:2] == ["blocks.0.attn.scores", "blocks.0.attn.softmax"] and len(seen) == 4
    torch.testing.assert_close(explicit, fused, rtol=1e-5, atol=1e-5)
    # The probabilities are causal rows that sum to one.
    probs = model.blocks[0].attn.softmax(model.blocks[0].attn.scores(
        torch.randn(1, 2, 5, 16), torch.randn(1, 2, 5, 16)))
    assert torch.allclose(probs.sum(-1), torch.ones(1, 2, 5))
    assert torch.equal(probs[0, 0].triu(1), torch.zeros(5, 5))


def test_explicit_path_gradients_equal_sdpa():
    torch.manual_seed(0)
    model = build_model(SMALL, LM)
    x = tokens(2)

    def grads() -> list[torch.Tensor]:
        model.zero_grad()
        lm_loss(model(x), x).backward()
        return [p.grad.clone() for p in model.parameters()]

    fused = grads()
    handle = model.blocks[1].attn.softmax.register_forward_hook(lambda *_: None)
    explicit = grads()
    handle.remove()
    for a, b in zip(fused, explicit):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_an_fp32_island_on_the_scores_takes_the_explicit_path(monkeypatch):
    # Recorded inside the scores' own forward, so no hook is what switches the path.
    seen: list[tuple[torch.dtype, bool]] = []
    original = AttentionScores.forward

    def forward(self, q, k):
        seen.append((q.dtype, torch.is_autocast_enabled("cpu")))
        return original(self, q, k)

    monkeypatch.setattr(AttentionScores, "forward", forward)
    torch.manual_seed(0)
    model = build_model(SMALL, LM)
    x = tokens(8)
    trainer = Trainer(precision="bf16-mixed", device="cpu", batch_size=4, max_steps=1,
                      no_progress=True, keep_fp32=["*.attn.scores"])
    trainer.fit(model, TensorData(x, x.roll(-1, dims=1)), loss_fn=lm_loss)
    assert seen and set(seen) == {(torch.float32, False)}
    seen.clear()
    Trainer(precision="bf16-mixed", device="cpu", batch_size=4, max_steps=1,
            no_progress=True).fit(build_model(SMALL + ",attention=fused", LM),
                                  TensorData(x, x), loss_fn=lm_loss)
    assert not seen  # no island, no hooks: fused attention


def test_fused_and_explicit_attention_agree_under_bf16_autocast():
    torch.manual_seed(0)
    fused = build_model(SMALL + ",attention=fused", LM)
    explicit = build_model(SMALL + ",attention=explicit", LM)
    explicit.load_state_dict(fused.state_dict())
    x = tokens(2)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        a, b = fused(x).float(), explicit(x).float()
    torch.testing.assert_close(a, b, rtol=0.02, atol=0.02)


@pytest.mark.parametrize("attention,dtype,explicit", [
    ("auto", torch.float32, False), ("auto", torch.bfloat16, True),
    ("fused", torch.bfloat16, False), ("explicit", torch.float32, True)])
def test_the_attention_option_picks_the_path(monkeypatch, attention, dtype, explicit):
    # auto: the explicit path for half inputs on a CPU, where it is the faster one.
    calls: list[int] = []
    original = AttentionScores.forward
    monkeypatch.setattr(AttentionScores, "forward",
                        lambda self, q, k: calls.append(1) or original(self, q, k))
    model = build_model(f"{SMALL},attention={attention}", LM)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16,
                                         enabled=dtype == torch.bfloat16):
        model(tokens(2))
    assert bool(calls) == explicit


def test_learns_a_repeated_text():
    torch.manual_seed(0)
    text = torch.tensor(list(b"the quick brown fox jumps over the lazy dog. " * 40))
    t = 32
    starts = torch.arange(0, len(text) - t - 1)
    x = torch.stack([text[s:s + t] for s in starts])
    y = torch.stack([text[s + 1:s + t + 1] for s in starts])
    model = build_model("gpt:layers=2,heads=2,width=64", ModelInputs(256, (t,), "lm", 256))
    trainer = Trainer(precision="bf16-mixed", device="cpu", batch_size=32, max_steps=100,
                      lr=3e-3, no_progress=True, log_every=10)
    result = trainer.fit(model, TensorData(x, y), loss_fn=lm_loss)
    assert result.skipped_steps == 0
    model.eval()
    with torch.no_grad():
        loss = lm_loss(model(x[:64]), y[:64]).item()
    assert loss < 0.2 * math.log(256), loss  # perplexity far below the vocabulary size


def test_embeddings_are_not_needed_in_a_module_list():
    # The tied head is one parameter: optimisers and state dicts see it once.
    model = build_model(SMALL, LM)
    names = [n for n, _ in model.named_parameters()]
    assert "token.weight" in names and "head.weight" not in names
    assert isinstance(model.head, nn.Linear)
