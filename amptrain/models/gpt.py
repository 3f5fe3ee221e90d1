"""``gpt``: a decoder-only transformer language model in the nanoGPT mould.

Token + learned position embeddings, pre-norm blocks (LayerNorm, causal self-attention,
LayerNorm, GELU MLP 4x), a final LayerNorm and an output ``head`` tied to the token
embedding (Radford et al. 2019; Karpathy's nanoGPT). Inputs are batch x length token ids,
outputs batch x length x vocabulary logits.

Attention trains through ``F.scaled_dot_product_attention``, which fuses the scores and
their softmax: no module output ever holds them, yet they are where fp16 overflows first
in a transformer (q.k grows with the width and with large activations). So each attention
module also has an explicit path through two submodules, ``scores`` (q @ k^T / sqrt(d))
and ``softmax`` (causal mask + softmax), taken only while something is attached to them
-- forward hooks (``diagnose``'s range recorder, its non-finite watch) or a wrapped
forward (a ``--keep-fp32 '*.attn.scores'`` island) -- so ``blocks.0.attn.scores`` shows
up in diagnose's report and an fp32 island there really runs in fp32. Both paths compute
the same function (tests/models/test_gpt.py checks it).

The explicit path is also the faster one for half-precision inputs on a CPU: torch 2.13's
CPU flash-attention kernel has no fast bf16 backward without AMX (measured on an AVX512-BF16
EPYC, batch 32 x 4 heads x 128 tokens x 32: 37 ms per forward+backward in bf16 against 17 ms
in fp32), while two bf16 matmuls and a softmax take 14 ms. So ``attention=auto`` (the
default) takes it for bf16/fp16 inputs on a CPU and SDPA everywhere else; ``fused`` and
``explicit`` force one (benchmarks/gpt_speed.py, benchmarks/RESULTS.md).
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from ..common.errors import UserError
from .core import ModelInputs, parse_options, register, require_positive

#: The defaults: small enough to learn a byte-level text on a CPU in a minute or two.
#: The width is a multiple of 64 so bf16 matrix kernels run on full vector tiles.
DEFAULTS = {"layers": 4, "heads": 4, "width": 128, "context": 0, "dropout": 0.0,
            "attention": "auto"}
ATTENTION = ("auto", "fused", "explicit")
_HALF = (torch.bfloat16, torch.float16)


def _observed(module: nn.Module) -> bool:
    """True when hooks or a wrapped forward are attached to ``module`` (see the module doc)."""
    return bool(module._forward_hooks or module._forward_pre_hooks
                or "forward" in module.__dict__)


class AttentionScores(nn.Module):
    """q @ k^T / sqrt(head size): the attention logits, batch x heads x T x T."""

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        # Scaling q (T x head size) is cheaper than scaling the T x T product.
        return (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-2, -1)


class CausalSoftmax(nn.Module):
    """The causal mask and the softmax over keys.

    The mask lives here, not in :class:`AttentionScores`: masked scores are -inf, and an
    output holding inf would read as an overflow in every precision. It is added (0 or
    -inf) rather than filled in: an addition's backward is free, a masked fill's is not.
    """

    def __init__(self) -> None:
        super().__init__()
        # The last mask, kept for the next step (training repeats one shape; generation's
        # growing lengths must not pile up masks). Not a buffer: not in checkpoints.
        self._mask: tuple[tuple, torch.Tensor] | None = None

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        t, s = scores.shape[-2:]
        key = (t, s, scores.dtype, scores.device)
        if self._mask is None or self._mask[0] != key:
            future = torch.ones(t, s, dtype=torch.bool, device=scores.device).triu(s - t + 1)
            mask = torch.zeros(t, s, dtype=scores.dtype, device=scores.device)
            self._mask = (key, mask.masked_fill(future, float("-inf")))
        return (scores + self._mask[1]).softmax(dim=-1)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: ``qkv`` projection, attention, ``proj``."""

    def __init__(self, width: int, heads: int, dropout: float = 0.0,
                 attention: str = "auto") -> None:
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.attention = attention
        self.qkv = nn.Linear(width, 3 * width)
        self.scores = AttentionScores()
        self.softmax = CausalSoftmax()
        self.proj = nn.Linear(width, width)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (part.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for part in self.qkv(x).split(c, dim=2))
        p = self.dropout if self.training else 0.0
        if self._explicit(q) or _observed(self.scores) or _observed(self.softmax):
            att = F.dropout(self.softmax(self.scores(q, k)), p)
            y = att.to(v.dtype) @ v  # an fp32 island's probabilities meet autocast's v
        else:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.resid_dropout(self.proj(y.transpose(1, 2).reshape(b, t, c)))

    def _explicit(self, q: torch.Tensor) -> bool:
        """The ``attention`` option: is the explicit path the one to take for ``q``?"""
        if self.attention == "auto":
            return q.device.type == "cpu" and q.dtype in _HALF
        return self.attention == "explicit"


class MLP(nn.Module):
    """``fc`` (width -> 4 width), GELU, ``proj`` (back to width), dropout."""

    def __init__(self, width: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.fc = nn.Linear(width, 4 * width)
        self.gelu = nn.GELU()
        self.proj = nn.Linear(4 * width, width)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(self.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, width: int, heads: int, dropout: float = 0.0,
                 attention: str = "auto") -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads, dropout, attention)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = MLP(width, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """A decoder-only transformer: token ids (batch x T) -> logits (batch x T x vocab).

    ``context`` is the longest sequence it takes (the position table's length);
    generation crops its input to it.
    """

    def __init__(self, vocab_size: int, context: int, layers: int = 4, heads: int = 4,
                 width: int = 128, dropout: float = 0.0, attention: str = "auto") -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.context = context
        self.token = nn.Embedding(vocab_size, width)
        self.position = nn.Embedding(context, width)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(width, heads, dropout, attention)
                                    for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size, bias=False)
        self.head.weight = self.token.weight  # tied (Press & Wolf 2017): fewer parameters
        self.apply(self._init_weights)
        # GPT-2's scaled init: each block adds two residual projections, so their std
        # shrinks with depth to keep the residual stream's variance from growing.
        for name, param in self.named_parameters():
            if name.endswith(("attn.proj.weight", "mlp.proj.weight")):
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        if t > self.context:
            raise UserError(f"a sequence of {t} tokens is longer than the model's context "
                            f"{self.context}")
        positions = torch.arange(t, device=tokens.device)
        x = self.dropout(self.token(tokens) + self.position(positions))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


@register("gpt")
def gpt(argument: str, inputs: ModelInputs) -> nn.Module:
    """``gpt[:layers=4,heads=4,width=128,context=0,dropout=0.0,attention=auto]`` on
    language-model data (context 0: the data's sequence length; attention: auto, fused
    or explicit, see the module doc)."""
    spec = f"gpt:{argument}" if argument else "gpt"
    o = parse_options(argument, dict(DEFAULTS), spec)
    if inputs.kind != "tokens" or len(inputs.input_shape) != 1:
        raise UserError(f"--model {spec} is a language model: it needs text (--data "
                        f"text:PATH); this data is {inputs.kind} of shape "
                        f"{tuple(inputs.input_shape)}")
    require_positive(o, spec, "layers", "heads", "width")
    if o["width"] % o["heads"]:
        raise UserError(f"--model {spec}: width {o['width']} is not divisible by "
                        f"heads {o['heads']}")
    if not 0.0 <= o["dropout"] < 1.0:
        raise UserError(f"--model {spec}: dropout must be in [0, 1) (got {o['dropout']})")
    if o["attention"] not in ATTENTION:
        raise UserError(f"--model {spec}: attention must be one of {', '.join(ATTENTION)} "
                        f"(got {o['attention']!r})")
    seq_len = inputs.input_shape[0]
    context = o["context"] or seq_len
    if seq_len > context:
        raise UserError(f"--seq-len {seq_len} is longer than the model's context {context} "
                        f"(--model {spec}): lower --seq-len or raise context")
    vocab = int(inputs.vocab_size or inputs.num_classes)
    return GPT(vocab, context, o["layers"], o["heads"], o["width"], o["dropout"],
               o["attention"])
