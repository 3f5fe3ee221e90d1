"""``hf:PATH``: fine-tune a Hugging Face sequence classifier saved in a local directory.

``--model hf:PATH`` loads ``AutoModelForSequenceClassification`` from ``PATH`` (a
directory written by ``save_pretrained``) with as many labels as the data has classes.
Nothing is downloaded: ``HF_HUB_OFFLINE=1`` and ``local_files_only=True``. A checkpoint
without a classification head (a bare encoder such as ``BertModel``), or with a head for
another number of classes, gets a new head, and the run says so.

With ``--data csv-text:FILE`` the texts are tokenised by the tokenizer saved in the same
directory (:class:`HFTextEncoder`, handed to the data through
``DataOptions.text_encoder``); batches are then dicts of ``input_ids``,
``attention_mask`` and ``labels``, padded to the longest sequence of each micro-batch,
and the model computes its own loss. Token data from other loaders (``synthetic-seq``)
works too when its ids fit the model's vocabulary.

Requires ``transformers`` (``pip install 'amptrain[hf]'``). The registry entries
``MODELS["hf"]`` and ``TEXT_ENCODERS["hf"]`` (in :mod:`amptrain.models.external`) import
this module on each use after checking that transformers imports, so amptrain runs
without transformers and the registry never depends on what was imported before.
"""
from __future__ import annotations

import contextlib
import copy
import logging
import os
import pickle
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator, Sequence

# Before transformers / huggingface_hub read it (when this module is imported directly;
# amptrain.models.external sets it too): never reach for the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from torch import nn  # noqa: E402

from ..common.errors import UserError
from .core import ModelInputs, set_exporter  # noqa: E402
from ..common.quiet import quiet_torchao

log = logging.getLogger("amptrain")

#: Every ``from_pretrained``: offline, and no Python file of the directory is imported
#: (``auto_map`` remote code); models also pass ``weights_only=True`` (a pickled
#: ``pytorch_model.bin`` is read as tensors only; ``model.safetensors`` is preferred).
SAFE_LOADING: dict[str, Any] = {"local_files_only": True, "trust_remote_code": False}
#: What ``from_pretrained`` raises for a directory it cannot load (a refused pickle too).
UNLOADABLE = (OSError, ValueError, KeyError, pickle.UnpicklingError, RuntimeError)

#: Tokenizers report this sentinel (1e30) when they know no length limit.
_NO_LIMIT = 10 ** 6


def model_dir(argument: str) -> Path:
    """The local model directory named by ``hf:PATH``, or a UserError saying what is wrong."""
    spec = f"hf:{argument}"
    if not argument:
        raise UserError("--model hf:PATH needs a directory written by save_pretrained(), "
                        "e.g. --model hf:models/bert-tiny")
    path = Path(argument).expanduser()
    if not path.exists():
        raise UserError(f"--model {spec}: no such directory {argument!r} (amptrain loads Hugging "
                        f"Face models from local directories only; save one with "
                        f"model.save_pretrained(PATH) and tokenizer.save_pretrained(PATH))")
    if not path.is_dir() or not (path / "config.json").is_file():
        raise UserError(f"--model {spec}: {argument!r} is not a Hugging Face model directory "
                        f"(no config.json); write one with model.save_pretrained(PATH)")
    return path


def tokenizer_dir(argument: str, option: str = "model") -> Path:
    """A local directory holding a Hugging Face tokenizer (with or without its model);
    errors name ``--option hf:ARGUMENT``."""
    path = Path(argument).expanduser()
    names = ("config.json", "tokenizer_config.json", "tokenizer.json")
    if path.is_dir() and any((path / name).is_file() for name in names):
        return path
    if option == "model":
        return model_dir(argument)  # its errors say what is missing
    where = f"--{option} hf:{argument}"
    if not argument or not path.exists():
        raise UserError(f"{where}: no such directory {argument!r} (a tokenizer directory "
                        f"written by tokenizer.save_pretrained(PATH); or --{option} byte)")
    raise UserError(f"{where}: {argument!r} holds no Hugging Face tokenizer (no "
                    f"tokenizer.json or tokenizer_config.json); write one with "
                    f"tokenizer.save_pretrained(PATH), or use --{option} byte")


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """transformers' load reports and progress bars off; amptrain says what matters.

    ``from_pretrained`` also imports torchao when it is installed (the fp8 extra), whose
    import warns about every CUDA kernel library it cannot load on this machine and trips
    torch's pytree deprecation warnings: noise for a model load, so errors only.
    """
    hf_logging = transformers.utils.logging
    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with quiet_torchao():
            yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


class HFTextEncoder:
    """The tokenizer saved with an ``hf:PATH`` model, as a :class:`~amptrain.data.TextEncoder`.

    The tokenizer is loaded on first use, so ``hf:`` models on token data that needs no
    tokenizer (``synthetic-seq``) work from directories that hold none.
    """

    def __init__(self, argument: str, option: str = "model") -> None:
        # Absolute: a token directory or a run stores this name, and generate or a later
        # train may run from another directory (the tokenizer itself loads on first use).
        self.path = tokenizer_dir(argument, option).absolute()
        self.name = f"hf:{self.path}"
        self.option = option
        self._tokenizer: Any = None

    @property
    def tokenizer(self) -> Any:
        """The ``transformers`` tokenizer (loaded from the model directory)."""
        if self._tokenizer is None:
            try:
                with _quiet():
                    self._tokenizer = transformers.AutoTokenizer.from_pretrained(
                        str(self.path), **SAFE_LOADING)
            except (OSError, ValueError, TypeError, KeyError) as exc:
                instead = "train the built-in --model transformer on this text" \
                    if self.option == "model" else f"use --{self.option} byte"
                raise UserError(
                    f"--{self.option} {self.name}: cannot load a tokenizer from {self.path} "
                    f"({_first_line(exc)}); save it there with tokenizer.save_pretrained(PATH), "
                    f"or {instead}") from None
            if _pad_id(self._tokenizer) is None:
                raise UserError(f"--{self.option} {self.name}: the tokenizer has no padding or "
                                f"end-of-sequence token to pad batches with")
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    @property
    def pad_id(self) -> int:
        pad_id = _pad_id(self.tokenizer)
        assert pad_id is not None  # `tokenizer` refuses a tokenizer without one
        return pad_id

    @property
    def max_len(self) -> int | None:
        """The longest sequence the tokenizer (and so its model) takes, when it knows."""
        limit = getattr(self.tokenizer, "model_max_length", None)
        return int(limit) if limit and limit < _NO_LIMIT else None

    @property
    def fingerprint(self) -> str:
        """The vocabulary's identity (sha256 of its sorted entries and special tokens):
        token shards record it, so shards of another tokenizer are refused."""
        import hashlib
        import json

        tok = self.tokenizer
        blob = json.dumps([type(tok).__name__, sorted(tok.get_vocab().items()),
                           tok.eos_token_id], default=str)
        return hashlib.sha256(blob.encode()).hexdigest()

    @property
    def eot_id(self) -> int | None:
        """The end-of-text id that separates documents in token shards, when there is one."""
        eos = self.tokenizer.eos_token_id
        return int(eos) if eos is not None else None

    def encode_stream(self, text: str) -> list[int]:
        """The ids of a whole running text (``text:`` data): no special tokens, no limit
        (the text is cut into blocks afterwards, so the model's length limit is moot)."""
        with _quiet():
            return list(self.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        """Text from ids (``amptrain generate``)."""
        return str(self.tokenizer.decode(ids))

    def encode(self, texts: Sequence[str], max_len: int) -> list[list[int]]:
        """Ids with the model's special tokens, truncated to ``max_len``; no padding."""
        encoded = self.tokenizer(list(texts), truncation=True, max_length=max_len,
                                 padding=False)
        return [list(ids) for ids in encoded["input_ids"]]


class CausalLMLogits(nn.Module):
    """A Hugging Face causal LM as amptrain's language models are: token ids in, logits
    ``[batch, seq_len, vocab]`` out; the LM task computes the shifted loss, so HF's own
    loss (and its KV cache) stay off."""

    def __init__(self, model: nn.Module, context: int | None) -> None:
        super().__init__()
        self.model = model
        #: The longest sequence the model takes (``amptrain generate`` crops to it).
        self.context = context

    def forward(self, input_ids: Any) -> Any:
        return self.model(input_ids=input_ids, use_cache=False).logits


def causal_lm(argument: str, inputs: ModelInputs) -> nn.Module:
    """``hf:PATH`` on ``text:`` data: ``AutoModelForCausalLM`` from PATH, fine-tuned in fp32
    weights with its own tokenizer."""
    spec = f"hf:{argument}"
    path = model_dir(argument)
    try:
        with _quiet():
            model = transformers.AutoModelForCausalLM.from_pretrained(
                str(path), **SAFE_LOADING, weights_only=True)
    except UNLOADABLE as exc:
        raise UserError(f"--model {spec}: cannot load a causal language model from {path} "
                        f"({_first_line(exc)}); language modelling needs a decoder such as "
                        f"GPT-2 or Llama") from None
    model.float()
    vocab = getattr(model.config, "vocab_size", None)
    if inputs.vocab_size and vocab and inputs.vocab_size > vocab:
        raise UserError(f"--model {spec}: the tokenizer has {inputs.vocab_size} tokens but the "
                        f"model's vocabulary only {vocab}; use the model's own tokenizer "
                        f"(drop --tokenizer)")
    positions = getattr(model.config, "max_position_embeddings", None) \
        or getattr(model.config, "n_positions", None)
    if positions and inputs.input_shape and inputs.input_shape[0] > positions:
        raise UserError(f"--model {spec}: --seq-len {inputs.input_shape[0]} is longer than the "
                        f"model's context of {positions} tokens; use --seq-len {positions} or "
                        f"less")
    wrapped = CausalLMLogits(model, int(positions) if positions else None)
    config = copy.deepcopy(model.config)
    set_exporter(wrapped, "hf", lambda out_dir, state, info: export_pretrained(
        transformers.AutoModelForCausalLM, config, path, out_dir,
        {k.removeprefix("model."): v for k, v in state.items()}, info))
    return wrapped


def hf_model(argument: str, inputs: ModelInputs) -> nn.Module:
    """``hf:PATH``: ``AutoModelForSequenceClassification`` from PATH with a head for the
    data's classes, in fp32 (the precision layer decides what runs in half); on ``text:``
    data (a language-model task) ``AutoModelForCausalLM`` (:func:`causal_lm`)."""
    spec = f"hf:{argument}"
    if inputs.kind == "tokens":
        return causal_lm(argument, inputs)
    path = model_dir(argument)
    if inputs.kind != "sequence":
        raise UserError(f"--model {spec} classifies token sequences (--data csv-text:FILE or "
                        f"synthetic-seq); this data is {inputs.kind} of shape "
                        f"{tuple(inputs.input_shape)}")
    try:
        with _quiet():
            model, info = transformers.AutoModelForSequenceClassification.from_pretrained(
                str(path), num_labels=inputs.num_classes, **SAFE_LOADING, weights_only=True,
                ignore_mismatched_sizes=True, output_loading_info=True)
    except UNLOADABLE as exc:
        raise UserError(f"--model {spec}: cannot load a sequence-classification model from "
                        f"{path} ({_first_line(exc)})") from None
    model.float()  # a checkpoint saved in bf16/fp16 still trains from fp32 weights
    new = sorted(set(info.get("missing_keys", ())) |
                 {key if isinstance(key, str) else key[0]
                  for key in info.get("mismatched_keys", ())})
    if new:
        log.info("%s: %s newly initialised for %d classes (the saved model has no head for "
                 "this task)", spec, _names(new), inputs.num_classes)
    vocab = getattr(model.config, "vocab_size", None)
    if inputs.vocab_size and vocab and inputs.vocab_size > vocab:
        raise UserError(f"--model {spec}: the data has token ids up to {inputs.vocab_size - 1} "
                        f"but the model's vocabulary has {vocab} entries; use --data "
                        f"csv-text:FILE (the model's own tokenizer) or a smaller vocab")
    positions = getattr(model.config, "max_position_embeddings", None)
    if positions and inputs.input_shape and inputs.input_shape[0] > positions:
        raise UserError(f"--model {spec}: sequences of {inputs.input_shape[0]} tokens are longer "
                        f"than the model's {positions} positions; shorten them in --data "
                        f"(max_len= or length=)")
    if getattr(model.config, "pad_token_id", 0) is None:
        # Decoder-style classifiers find each sequence's last token by its padding id.
        model.config.pad_token_id = getattr(model.config, "eos_token_id", None)
    config = copy.deepcopy(model.config)
    set_exporter(model, "hf", lambda out_dir, state, info: export_pretrained(
        transformers.AutoModelForSequenceClassification, config, path, out_dir, state, info))
    return model


#: Where the ``save_pretrained`` export goes under the run directory.
EXPORT_DIR = "hf"


def export_pretrained(auto_class: Any, config: Any, source: Path, out_dir: Path,
                      state: dict[str, torch.Tensor], info: dict[str, Any]) -> Path:
    """``out_dir/hf/``: the trained model by ``save_pretrained`` (config with the run's
    class names as id2label/label2id, safetensors weights in the dtype of ``state``) and
    its tokenizer, so ``auto_class.from_pretrained(out_dir/hf)`` loads it offline."""
    config = copy.deepcopy(config)
    names = info.get("class_names")
    if names and info.get("task", "classification") == "classification":
        config.id2label = {i: str(name) for i, name in enumerate(names)}
        config.label2id = {str(name): i for i, name in enumerate(names)}
    dtype = next((t.dtype for t in state.values() if t.is_floating_point()), torch.float32)
    with _quiet():
        fresh = auto_class.from_config(config)
    fresh.to(dtype)
    fresh.load_state_dict(state)
    fresh.eval()
    target = Path(out_dir) / EXPORT_DIR
    tokenizer = _export_tokenizer(info, source)
    # Written beside, then renamed: a failed save leaves no half-written hf/ behind.
    with tempfile.TemporaryDirectory(dir=out_dir) as scratch:
        partial = Path(scratch) / EXPORT_DIR
        with _quiet():
            fresh.save_pretrained(str(partial))
            if tokenizer is not None:
                tokenizer.save_pretrained(str(partial))
        if target.exists():  # written by this run's own earlier export, never the user's
            shutil.rmtree(target)
        os.replace(partial, target)
    log.info("wrote %s/ (save_pretrained: %s%s; %s.from_pretrained reads it)", target,
             type(fresh).__name__, " and its tokenizer" if tokenizer is not None else
             ", no tokenizer", auto_class.__name__)
    return target


def _export_tokenizer(info: dict[str, Any], source: Path) -> Any:
    """The tokenizer the run used (``--tokenizer hf:DIR`` or the model's own), or None when
    the model directory has none (token data needs no tokenizer)."""
    fitted = (info.get("data_fitted") or {}).get("tokenizer") or ""
    directory = fitted.removeprefix("hf:") if fitted.startswith("hf:") else str(source)
    try:
        with _quiet():
            return transformers.AutoTokenizer.from_pretrained(directory, **SAFE_LOADING)
    except (OSError, ValueError, TypeError, KeyError):
        log.info("no tokenizer in %s: the exported model has none beside it", directory)
        return None


def _pad_id(tokenizer: Any) -> int | None:
    """The padding id, or the end-of-sequence id for tokenizers without one (GPT-2)."""
    if tokenizer.pad_token_id is not None:
        return tokenizer.pad_token_id
    return tokenizer.eos_token_id


def _names(names: list[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    if "Weights only load failed" in text:  # torch's refusal of a pickled payload
        return ("a weights file holds pickled Python objects, not only tensors; amptrain "
                "does not run them: save the model with safetensors")
    return text.splitlines()[0] if text else type(exc).__name__

