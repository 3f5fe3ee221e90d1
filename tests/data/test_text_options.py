"""data/text_options.py: text data's options, checked where they are declared."""
from __future__ import annotations

import pytest

from amptrain.common.errors import UserError
from amptrain.data.text_options import MAX_SEQ_LEN, TextOptions, check_tokenizer


@pytest.mark.parametrize("values, message", [
    ({"seq_len": 0}, "seq_len must be an integer >= 1 (got 0)"),
    ({"seq_len": MAX_SEQ_LEN + 1}, f"seq_len {MAX_SEQ_LEN + 1} is over the limit of "
                                   f"{MAX_SEQ_LEN} tokens (attention costs seq_len^2 per block)"),
    ({"tokenizer": "words"}, "tokenizer must be byte or hf:DIR (got 'words')"),
])
def test_each_option_is_checked_when_built(values, message):
    with pytest.raises(UserError) as caught:
        TextOptions(**values)
    assert str(caught.value) == message


def test_the_tokenizers_taken():
    assert TextOptions(seq_len=MAX_SEQ_LEN, tokenizer="hf:tok").tokenizer == "hf:tok"
    check_tokenizer(None)
    check_tokenizer("byte")
