"""Write a tiny, randomly initialised BERT, a tiny GPT-2 and a toy review CSV to try
``hf:PATH`` offline.

    python examples/tiny_hf_model.py DIR     # -> DIR/tiny-bert/, DIR/tiny-gpt2/, DIR/reviews.csv

``DIR/tiny-gpt2`` is a causal language model with a byte-level BPE tokenizer trained here:
``amptrain train --model hf:DIR/tiny-gpt2 --data text:FILE`` fine-tunes it with its own
tokenizer.

``DIR/tiny-bert`` is what ``save_pretrained`` writes for a real model (config.json,
model.safetensors, tokenizer.json), only small (hidden 32, 2 layers, 2 heads) and with a
WordPiece vocabulary of the CSV's words, built locally: nothing is downloaded. It is an
encoder without a classification head, like a pretrained checkpoint; ``amptrain train
--model hf:DIR/tiny-bert`` adds one. Needs ``transformers`` (``pip install 'amptrain[hf]'``).
"""
from __future__ import annotations

import csv
import random
import sys
from pathlib import Path

POSITIVE = ["good", "great", "excellent", "wonderful", "fun", "lovely", "brilliant", "superb"]
NEGATIVE = ["bad", "awful", "boring", "terrible", "dull", "poor", "horrible", "weak"]
FILLER = ["the", "a", "movie", "film", "plot", "acting", "was", "is", "really", "quite",
          "and", "story", "ending", "cast", "music", "very", "this", "it"]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def write_reviews_csv(path: str | Path, rows: int = 400, seed: int = 0) -> Path:
    """A CSV (text,label) of short reviews; the label is the sentiment word's polarity."""
    rng = random.Random(seed)
    path = Path(path)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        for _ in range(rows):
            label = rng.choice(["positive", "negative"])
            words = [rng.choice(FILLER) for _ in range(rng.randint(3, 12))]
            words.insert(rng.randrange(len(words) + 1),
                         rng.choice(POSITIVE if label == "positive" else NEGATIVE))
            writer.writerow([" ".join(words).capitalize() + rng.choice([".", "!", ""]), label])
    return path


def write_tiny_bert(directory: str | Path, *, hidden: int = 32, layers: int = 2, heads: int = 2,
                    seed: int = 0) -> Path:
    """A randomly initialised ``BertModel`` and its WordPiece tokenizer, saved locally."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    vocab = SPECIAL + [".", "!"] + sorted(set(POSITIVE + NEGATIVE + FILLER))
    tokenizer = Tokenizer(models.WordPiece({w: i for i, w in enumerate(vocab)},
                                           unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab.index("[CLS]")), ("[SEP]", vocab.index("[SEP]"))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]",
                                   pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
                                   mask_token="[MASK]", model_max_length=64)
    config = BertConfig(vocab_size=len(vocab), hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=4 * hidden,
                        max_position_embeddings=64, pad_token_id=0)
    torch.manual_seed(seed)
    directory = Path(directory)
    BertModel(config).save_pretrained(directory)
    fast.save_pretrained(directory)
    return directory


def write_tiny_gpt2(directory: str | Path, texts: list[str] | None = None, *, hidden: int = 32,
                    layers: int = 2, heads: int = 2, context: int = 64, vocab: int = 300,
                    seed: int = 0) -> Path:
    """A randomly initialised ``GPT2LMHeadModel`` (a causal LM for ``--data text:``) and a
    byte-level BPE tokenizer trained here on ``texts`` (the reviews' words by default)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    if texts is None:
        rng = random.Random(seed)
        texts = [" ".join(rng.choice(FILLER + POSITIVE + NEGATIVE) for _ in range(12))
                 for _ in range(200)]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>",
                                   model_max_length=context)
    config = GPT2Config(vocab_size=len(fast), n_embd=hidden, n_layer=layers, n_head=heads,
                        n_positions=context, eos_token_id=fast.eos_token_id,
                        bos_token_id=fast.eos_token_id)
    torch.manual_seed(seed)
    directory = Path(directory)
    GPT2LMHeadModel(config).save_pretrained(directory)
    fast.save_pretrained(directory)
    return directory


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no "Writing model shards" bar for a 100 KB model
    model = write_tiny_bert(out / "tiny-bert")
    data = write_reviews_csv(out / "reviews.csv")
    gpt2 = write_tiny_gpt2(out / "tiny-gpt2")
    print(f"wrote {model}/, {gpt2}/ and {data}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
