"""amptrain/models/sequence.py: ``lstm`` and ``transformer`` on padded token ids."""
from __future__ import annotations

import pytest
import torch

from amptrain.common.errors import UserError
from amptrain.models import (
    LSTMClassifier,
    ModelInputs,
    TransformerClassifier,
    build_model,
)
from amptrain.models.sequence import masked_mean
from tests.models.conftest import (
    FEATURES,
    IMAGES,
    SEQUENCES,
)

@pytest.mark.parametrize("spec,inputs,match", [
    ("lstm", IMAGES, "needs token sequences.*try --model cnn or resnet18"),
    ("transformer", FEATURES, "needs token sequences"),
    ("transformer:heads=3", SEQUENCES, "d_model 128 is not divisible by heads 3"),
    ("transformer:depth=2", SEQUENCES, "unknown option 'depth=2'"),
    ("lstm:hidden=big", SEQUENCES, "hidden must be an integer"),
    ("lstm:dropout=1.5", SEQUENCES, r"dropout must be in \[0, 1\)"),
])
def test_mismatches_and_bad_options_are_user_errors(spec, inputs, match):
    with pytest.raises(UserError, match=match) as caught:
        build_model(spec, inputs)
    assert "--model" in str(caught.value)


def test_transformer_defaults_are_bert_tiny_and_options_apply():
    model = build_model("transformer", SEQUENCES)
    layers = model.encoder.layers
    assert len(layers) == 2 and layers[0].self_attn.num_heads == 2
    assert layers[0].self_attn.embed_dim == 128 and layers[0].linear1.out_features == 512
    assert layers[0].norm_first and model.position.shape == (1, 12, 128)
    custom = build_model("transformer:d_model=64,layers=3,heads=4,ff=128", SEQUENCES)
    assert len(custom.encoder.layers) == 3 and custom.encoder.layers[0].self_attn.num_heads == 4


@pytest.mark.parametrize("spec", ["lstm:embed=16,hidden=16", "transformer:d_model=32,layers=1"])
def test_sequence_models_ignore_padding(spec):
    torch.manual_seed(0)
    model = build_model(spec, ModelInputs(3, (10,), "sequence", vocab_size=20)).eval()
    short = torch.tensor([[4, 5, 6, 0, 0, 0]])
    long = torch.tensor([[4, 5, 6, 0, 0, 0, 0, 0, 0, 0]])
    with torch.no_grad():
        assert torch.allclose(model(short), model(long), atol=1e-5)
        empty = model(torch.zeros(2, 10, dtype=torch.long))  # a text with no tokens
    assert torch.isfinite(empty).all()


# ------------------------------------------------------------------ new
def test_masked_mean_averages_only_the_kept_positions():
    values = torch.tensor([[[1.0], [3.0], [100.0]], [[5.0], [7.0], [9.0]], [[4.0], [4.0], [4.0]]])
    keep = torch.tensor([[True, True, False], [True, True, True], [False, False, False]])
    out = masked_mean(values, keep)
    assert torch.equal(out, torch.tensor([[2.0], [7.0], [0.0]]))  # nothing kept: 0, not NaN


def test_lstm_options_apply_and_padding_embeds_to_zero():
    model = build_model("lstm:embed=8,hidden=6,layers=2,dropout=0.25", SEQUENCES)
    assert isinstance(model, LSTMClassifier)
    assert model.embedding.num_embeddings == 50 and model.embedding.embedding_dim == 8
    assert model.lstm.hidden_size == 6 and model.lstm.num_layers == 2
    assert model.lstm.dropout == 0.25 and model.dropout.p == 0.25
    assert model.head.in_features == 6 and model.head.out_features == 3
    assert torch.count_nonzero(model.embedding.weight[0]) == 0  # token 0 is padding
    single = build_model("lstm:layers=1,dropout=0.5", SEQUENCES)
    assert single.lstm.dropout == 0.0  # nn.LSTM's dropout needs two layers or more
    model.eval()
    with torch.no_grad():  # a real token changes the prediction
        a = model(torch.tensor([[4, 5, 0, 0]]))
        b = model(torch.tensor([[4, 6, 0, 0]]))
    assert not torch.allclose(a, b)


def test_transformer_sees_token_order_through_its_positions():
    torch.manual_seed(0)
    model = build_model("transformer:d_model=16,layers=1,heads=2,ff=32,dropout=0", SEQUENCES)
    assert isinstance(model, TransformerClassifier) and model.position.shape == (1, 12, 16)
    model.eval()
    with torch.no_grad():
        a = model(torch.tensor([[7, 8, 9, 0]]))
        b = model(torch.tensor([[9, 8, 7, 0]]))
        model.position.zero_()
        c = model(torch.tensor([[7, 8, 9, 0]]))
        d = model(torch.tensor([[9, 8, 7, 0]]))
    assert not torch.allclose(a, b, atol=1e-4)  # learned positions: order matters
    assert torch.allclose(c, d, atol=1e-5)  # without them, mean pooling is order-free
