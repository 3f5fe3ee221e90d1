"""Token-sequence classifiers: ``lstm`` and ``transformer``.

Inputs are batch x length token ids with 0 as padding (at the end of each sequence, as
the built-in loaders write them). Both models pool over the non-padding positions
with a mask instead of packing sequences, so a step needs no lengths on the host
(no device-to-host synchronisation).
"""
from __future__ import annotations

import torch
from torch import nn

from ..common.errors import UserError
from .core import ModelInputs, parse_options, register, require_positive, sequence_vocab

#: The ``transformer`` defaults: BERT-tiny's size (Turc et al. 2019).
BERT_TINY = {"d_model": 128, "layers": 2, "heads": 2, "ff": 512, "dropout": 0.1}


def masked_mean(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Mean of batch x length x features ``values`` over positions where ``keep``."""
    weights = keep.unsqueeze(-1).to(values.dtype)
    return (values * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1)


class LSTMClassifier(nn.Module):
    """Embedding, a (stacked) LSTM, mean over the real tokens' outputs, ``head``.

    Unidirectional on purpose: with padding at the end, the outputs at real tokens
    never see padding, so the masked mean is exact without packing.
    """

    def __init__(self, vocab_size: int, num_classes: int, embed: int = 128, hidden: int = 128,
                 layers: int = 1, dropout: float = 0.1) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed, padding_idx=0)
        self.lstm = nn.LSTM(embed, hidden, num_layers=layers, batch_first=True,
                            dropout=dropout if layers > 1 else 0.0)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        outputs, _ = self.lstm(self.embedding(tokens))
        return self.head(self.dropout(masked_mean(outputs, tokens != 0)))


class TransformerClassifier(nn.Module):
    """Token embedding + learned positions, a pre-norm Transformer encoder, masked mean
    pooling, ``head`` (an encoder-only classifier in the style of BERT)."""

    def __init__(self, vocab_size: int, max_len: int, num_classes: int, d_model: int = 128,
                 layers: int = 2, heads: int = 2, ff: int = 512, dropout: float = 0.1) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=0)
        self.position = nn.Parameter(torch.empty(1, max_len, d_model))
        nn.init.normal_(self.position, std=0.02)
        self.dropout = nn.Dropout(dropout)
        layer = nn.TransformerEncoderLayer(d_model, heads, ff, dropout, activation="gelu",
                                           batch_first=True, norm_first=True)
        # Pre-norm stacks need a final norm; nested tensors do not support norm_first.
        self.encoder = nn.TransformerEncoder(layer, layers, norm=nn.LayerNorm(d_model),
                                             enable_nested_tensor=False)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        padding = tokens == 0
        # A sequence of padding only would mask every key (softmax of all -inf = NaN):
        # let such rows attend to everything instead; their output is ignored anyway.
        padding = padding & ~padding.all(dim=1, keepdim=True)
        h = self.dropout(self.embedding(tokens) + self.position[:, :tokens.shape[1]])
        h = self.encoder(h, src_key_padding_mask=padding)
        return self.head(masked_mean(h, ~padding))


@register("lstm")
def lstm(argument: str, inputs: ModelInputs) -> nn.Module:
    """``lstm[:embed=128,hidden=128,layers=1,dropout=0.1]`` on token sequences."""
    spec = f"lstm:{argument}" if argument else "lstm"
    o = parse_options(argument, {"embed": 128, "hidden": 128, "layers": 1, "dropout": 0.1}, spec)
    vocab = sequence_vocab(inputs, spec)
    require_positive(o, spec, "embed", "hidden", "layers")
    return LSTMClassifier(vocab, inputs.num_classes, o["embed"], o["hidden"], o["layers"],
                          _probability(o["dropout"], spec))


@register("transformer")
def transformer(argument: str, inputs: ModelInputs) -> nn.Module:
    """``transformer[:d_model=128,layers=2,heads=2,ff=512,dropout=0.1]`` (BERT-tiny size)."""
    spec = f"transformer:{argument}" if argument else "transformer"
    o = parse_options(argument, dict(BERT_TINY), spec)
    vocab = sequence_vocab(inputs, spec)
    require_positive(o, spec, "d_model", "layers", "heads", "ff")
    if o["d_model"] % o["heads"]:
        raise UserError(f"--model {spec}: d_model {o['d_model']} is not divisible by "
                        f"heads {o['heads']}")
    return TransformerClassifier(vocab, inputs.input_shape[0], inputs.num_classes, o["d_model"],
                                 o["layers"], o["heads"], o["ff"], _probability(o["dropout"], spec))


def _probability(value: float, spec: str) -> float:
    if not 0.0 <= value < 1.0:
        raise UserError(f"--model {spec}: dropout must be in [0, 1) (got {value})")
    return value
