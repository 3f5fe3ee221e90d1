"""The options of text data, declared once beside it (``text:`` corpora,
:mod:`.corpus`; ``tokens:`` shards, :mod:`.tokens`): the block size, the tokenizer and
which files of a directory are read, with their checks and the data they apply to.
Torch-free: the command line's parser is built from it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..common.errors import UserError, flag
from ..common.options import option, require_positive
from .scope import DataScope

#: Tokens per block when --seq-len is not given (nor kept by the run being evaluated).
DEFAULT_SEQ_LEN = 128
#: The longest --seq-len: attention costs seq_len^2 per block, so a mistyped length (a
#: million, one long line of text) would run silently until killed.
MAX_SEQ_LEN = 16_384


def check_tokenizer(name: str | None) -> None:
    """Refuse a ``--tokenizer`` that is neither ``byte`` nor ``hf:DIR`` (None: not given)."""
    if name is not None and name != "byte" and not name.startswith("hf:"):
        raise UserError(f"{flag('tokenizer')} must be byte or hf:DIR (got {name!r})")


@dataclass
class TextOptions:
    """Text data's options, checked when built; ``tokenizer`` is turned into the data's
    :attr:`~amptrain.data.core.DataOptions.text_encoder` by the run (a model may bring
    its own), the others are read by the source."""

    #: text: reads all three; the shards of tokens: were tokenized by `amptrain prepare`,
    #: so only the block size is still open there.
    SCOPE: ClassVar[DataScope] = DataScope(
        "text: data (language modelling)", ("text:",),
        decided={"tokens:": (("seq_len",), "was fixed when the shards were prepared "
                                           "(`amptrain prepare`)")})

    seq_len: int | None = option(None, f"text: data: tokens per training block (default "
                                       f"{DEFAULT_SEQ_LEN}; at most the model's context)",
                                 kind=int, group="run")
    tokenizer: str | None = option(None, "text: data: byte (the default: UTF-8 bytes, "
                                         "vocabulary 256) or hf:DIR (a local Hugging Face "
                                         "tokenizer; an hf: model brings its own)", kind=str,
                                   group="run")
    text_glob: str | None = option(None, "text: data: which files of a directory are read "
                                         "(e.g. '*.py'; default: every text file)", kind=str,
                                   group="run")

    def __post_init__(self) -> None:
        require_positive(self, "seq_len", optional=True)
        if self.seq_len is not None and self.seq_len > MAX_SEQ_LEN:
            raise UserError(f"{flag('seq_len')} {self.seq_len} is over the limit of "
                            f"{MAX_SEQ_LEN} tokens (attention costs seq_len^2 per block)")
        check_tokenizer(self.tokenizer)
