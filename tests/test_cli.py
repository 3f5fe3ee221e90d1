"""The ``amptrain`` command line itself (cli.py), through its entry point ``cli.main``.

(a) bad invocations exit 2 with one line on stderr, no traceback and no file changed
(most rows in this process through ``cli.main(argv)``, the rows that need a fresh
interpreter as real ``python -m amptrain`` processes: SUBPROCESS_ROWS);
(b) ``--help``, and user errors of other torchrun ranks name their rank. Each command's
own end-to-end runs are in tests/commands/.
"""
from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from tests.commands.helpers import REPO, amptrain


# ------------------------------------------------------------------- (a) errors
def bad_inputs(root: Path) -> dict[str, Path]:
    """One malformed file (or folder) of each kind, written in its real format."""
    idx = root / "idx"
    idx.mkdir()
    (idx / "train-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x01" + b"\x00" * 20)  # label magic
    (idx / "train-labels-idx1-ubyte").write_bytes(b"\x00\x00\x08\x01\x00\x00\x00\x01\x07")
    cifar = root / "cifar"
    cifar.mkdir()
    (cifar / "data_batch_1").write_bytes(pickle.dumps(["not", "a", "dict"]))
    images = root / "images"
    for name in ("a", "b"):
        (images / name).mkdir(parents=True)
        (images / name / "x.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    csv = root / "nolabel.csv"
    csv.write_text("text,sentiment\ngood,pos\nbad,neg\n")
    npz = root / "bad.npz"
    np.savez(npz, x=np.zeros((4, 3)))
    bad_yaml = root / "bad.yaml"
    bad_yaml.write_text("epochs: [3,\n")
    checkpoint = root / "corrupt.pt"
    checkpoint.write_bytes(b"PK\x03\x04 truncated")
    existing = root / "existing"
    (existing / "checkpoints").mkdir(parents=True)
    (existing / "metrics.jsonl").write_text("{}\n")
    (existing / "checkpoints" / "last.pt").write_bytes(b"an earlier run's checkpoint")
    paths = {"idx": idx, "cifar": cifar, "images": images, "csv": csv, "npz": npz,
             "yaml": bad_yaml, "checkpoint": checkpoint, "existing": existing}
    paths.update(hostile_inputs(root))
    paths.update(reader_inputs(root))
    paths.update(reliab_inputs(root))
    return paths


def reliab_inputs(root: Path) -> dict[str, Path]:
    """Issue 48: a YAML base-60 number, a user's own file named like amptrain's lock."""
    base60 = root / "base60.yaml"
    base60.write_text("max_steps: 1:00\n")
    locked = root / "user_lock"
    locked.mkdir()
    (locked / ".amptrain.lock").write_text("the user's own notes\n")
    nul = {}
    for key, line in (("out", 'out: "runs/x\\0y"'), ("data", 'data: "npz:x\\0y.npz"'),
                      ("keep", 'keep_fp32: ["head\\0"]')):
        nul[f"reliab_nul_{key}"] = root / f"nul_{key}.yaml"
        nul[f"reliab_nul_{key}"].write_text(line + "\n")
    return {"reliab_base60": base60, "reliab_user_lock": locked, **nul}


def hostile_inputs(root: Path) -> dict[str, Path]:
    """Well-formed files with contents that cannot be trained on, and typed-wrong YAML."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 8)).astype(np.float32)
    y = rng.integers(0, 3, 60)
    arrays = {
        "nan_x": dict(x=np.where(x > 1.5, np.nan, x), y=y),
        "inf_x": dict(x=np.where(x > 1.5, np.inf, x), y=y),
        "nan_y": dict(x=x, y=np.where(np.arange(60) == 5, np.nan, y.astype(float))),
        "float_y": dict(x=x, y=rng.normal(size=60)),
        "short_y": dict(x=x, y=y[:50]),
        "empty": dict(x=np.zeros((0, 8), np.float32), y=np.zeros(0, np.int64)),
        "flat_x": dict(x=x[:, 0].copy(), y=y),
        "no_features": dict(x=np.zeros((60, 0), np.float32), y=y),
        "features": dict(x=x, y=y),
    }
    paths = {}
    for name, values in arrays.items():
        paths[name] = root / f"{name}.npz"
        np.savez(paths[name], **values)
    yamls = {"yaml_lr": b"lr: abc\n", "yaml_keep": b"keep_fp32: 5\n",
             "yaml_growth": b"growth_factor: big\n", "yaml_resume": b"resume: 7\n",
             "yaml_model": b"model: {name: mlp}\n", "yaml_empty": b"",
             "yaml_list": b"- lr\n- 3\n", "yaml_bytes": b"lr: \xff\xfe\x00\n",
             "yaml_bool": b"compile: maybe\n"}
    for name, text in yamls.items():
        paths[name] = root / f"{name}.yaml"
        paths[name].write_bytes(text)
    paths["a_file"] = root / "a_file"
    paths["a_file"].write_text("not a directory")
    paths["empty_dir"] = root / "empty_dir"
    paths["empty_dir"].mkdir()
    # Text corpora that cannot be trained on (language modelling).
    paths["binary_dir"] = root / "binary_dir"
    paths["binary_dir"].mkdir()
    (paths["binary_dir"] / "blob.bin").write_bytes(b"\x00\x01\x02" * 300)
    paths["latin1_txt"] = root / "latin1.txt"
    paths["latin1_txt"].write_bytes("café olé\n".encode("latin-1") * 100)
    paths["short_txt"] = root / "short.txt"
    paths["short_txt"].write_text("a few words only\n")
    paths["long_txt"] = root / "long.txt"
    paths["long_txt"].write_text("the quick brown fox jumps over the lazy dog\n" * 100)
    paths.update(round_two_inputs(root, x, rng))
    return paths


def round_two_inputs(root: Path, x: np.ndarray, rng: np.random.Generator) -> dict[str, Path]:
    """Issue 28's hostile round: entries where --out expects others, files of the user's a
    command must not replace, special files, checkpoints damaged inside, labels that are
    ids, targets beyond float32 (the checkpoints come from real runs, in-process)."""
    import os

    import torch

    from amptrain.config import RunConfig
    from amptrain.workflows.runner import run_training

    paths: dict[str, Path] = {}
    arrays = {
        "ids_y": dict(x=x, y=np.arange(60)),
        "huge_y": dict(x=x, y=np.where(np.arange(60) == 3, 1e300, rng.normal(size=60))),
        "val_shape": dict(x=x, y=rng.normal(size=60), x_val=rng.normal(size=(10, 5)),
                          y_val=rng.normal(size=10)),
    }
    for name, values in arrays.items():
        paths[name] = root / f"{name}.npz"
        np.savez(paths[name], **values)
    for name, entry, is_dir in (("out_ckpt_file", "checkpoints", False),
                                ("out_metrics_dir", "metrics.jsonl", True),
                                ("out_eval_file", "eval", False),
                                ("out_tb_used", "tb/events.out", False),
                                ("out_eval_used", "eval/report.json", False),
                                ("out_diagnose", "diagnose.json", False),
                                ("out_report", "report.md", False)):
        target = root / name / entry
        target.parent.mkdir(parents=True, exist_ok=True)
        target.mkdir() if is_dir else target.write_text("the user's own file\n")
        paths[name] = root / name
    paths["config_dir"] = root / "config_dir"
    paths["config_dir"].mkdir()
    (paths["config_dir"] / "config.yaml").write_text("model: mlp\nmax_steps: 1\n")
    paths["fifo"] = root / "fifo"
    os.mkfifo(paths["fifo"])
    paths["no_tokenizer"] = root / "no_tokenizer"
    paths["no_tokenizer"].mkdir()
    (paths["no_tokenizer"] / "vocab.txt").write_text("a\nb\n")
    # Real checkpoints: a classifier on features, a tiny language model on text.
    np.savez(root / "classes.npz", x=x, y=rng.integers(0, 3, 60))
    common = dict(max_steps=1, batch_size=16, no_progress=True, device="cpu")
    run_training(RunConfig.from_options(model="mlp", data=f"npz:{root / 'classes.npz'}",
                                        out=str(root / "cls_run"), **common))
    paths["cls_ckpt"] = root / "cls_run" / "checkpoints" / "last.pt"
    run_training(RunConfig.from_options(model="gpt:layers=1,heads=2,width=32",
                                        data=f"text:{paths.get('long_txt', root / 'long.txt')}",
                                        seq_len=16, out=str(root / "lm_run"), **common))
    paths["lm_ckpt"] = root / "lm_run" / "checkpoints" / "last.pt"
    state = torch.load(paths["lm_ckpt"], weights_only=True)

    def damaged(name: str, change) -> None:
        copy = {**state, "model": dict(state["model"]), "run": dict(state["run"])}
        change(copy)
        paths[name] = root / f"{name}.pt"
        torch.save(copy, paths[name])

    damaged("ckpt_no_model", lambda s: s.pop("model"))
    damaged("ckpt_step_text", lambda s: s.update(step="six"))
    damaged("ckpt_entry_not_tensor", lambda s: s["model"].update({"extra": [1, 2]}))
    damaged("ckpt_bad_inputs", lambda s: s["run"].update(inputs={"colour": "blue"}))
    damaged("ckpt_nan", lambda s: s["model"].update(
        {k: torch.full_like(v, float("nan")) for k, v in s["model"].items()
         if v.is_floating_point()}))
    return paths


class _Planted:
    """A pickled payload: unpickling it creates ``PWNED`` in the table's root, which
    test_no_bad_invocation_changed_a_file would see."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def __reduce__(self):
        return os.system, (f"touch {self.root}/PWNED",)


def reader_inputs(root: Path) -> dict[str, Path]:
    """Issue 36's files that must load without running code or trusting their headers: a
    run directory with a planted sharded checkpoint (a real DCP save, its .metadata
    carrying a payload)."""
    import torch
    from torch.distributed.checkpoint import FileSystemReader

    from amptrain import checkpoint
    from amptrain.checkpoint import sharded

    paths: dict[str, Path] = {}
    run = root / "planted_run"
    model = torch.nn.Linear(64, 10)
    writer = sharded.ShardedWriter()
    plain = {"format": checkpoint.FORMAT, "format_version": checkpoint.FORMAT_VERSION,
             "step": 99, "epoch": 0, "window_in_epoch": 99, "config": {}, "rng": {}}
    step = writer.submit(run / "checkpoints", 99, plain, model,
                         torch.optim.AdamW(model.parameters()), is_main=True, keep_last=1)
    writer.wait()
    metadata = FileSystemReader(str(step)).read_metadata()
    metadata.version = _Planted(root)
    (step / ".metadata").write_bytes(pickle.dumps(metadata))
    paths["planted_run"], paths["planted_step"] = run, step
    paths["reader_fifo"] = root / "reader_fifo"
    os.mkfifo(paths["reader_fifo"])
    # Token directories whose meta.json is edited (real shards from amptrain's writer).
    import json

    import numpy as np

    from amptrain.data.shards import ShardsMeta, ShardWriter

    for name, change in (("tok_vocab_2_40", {"vocab_size": 2 ** 40}),
                         ("tok_negative_val", {"val_tokens": -5}),
                         ("tok_count_text", {"tokens": "400"}),
                         ("tok_outside", {"shards": [{"file": "../../outside/shard_00000.bin",
                                                      "tokens": 400}]}),
                         ("tok_small_vocab", {"vocab_size": 100})):
        directory = root / name
        directory.mkdir()
        writer = ShardWriter(directory, np.dtype(np.uint16), "ab" * 32)
        writer.write(np.arange(400) % 250)
        ShardsMeta(tokenizer="byte", fingerprint="ab" * 32, vocab_size=256, dtype="uint16",
                   eot_id=None, shards=writer.close(), tokens=400, text_bytes=400,
                   val_tokens=40).write(directory)
        meta = json.loads((directory / "meta.json").read_text())
        (directory / "meta.json").write_text(json.dumps({**meta, **change}))
        paths[name] = directory
    # Checkpoints edited to hold values out of range.
    plain = {"format": checkpoint.FORMAT, "format_version": checkpoint.FORMAT_VERSION,
             "model": {}, "step": 1, "epoch": 0, "window_in_epoch": 1, "config": {}}
    for name, change in (("ckpt_step_negative", {"step": -5}),
                         ("ckpt_step_huge", {"step": 10 ** 18}),
                         ("ckpt_batch_negative", {"config": {"batch_size": -1}}),
                         ("ckpt_rng_text", {"rng": {"torch": "seed"}}),
                         ("ckpt_vocab_huge", {"run": {"model": "gpt", "inputs": {
                             "num_classes": 2 ** 40, "input_shape": [16], "kind": "tokens",
                             "vocab_size": 2 ** 40}}})):
        paths[name] = root / f"{name}.pt"
        checkpoint.atomic_save({**plain, **change}, paths[name])
    return paths


#: The user's own model factories (``--model module:factories.NAME``), written to the
#: working directory of the table's runs.
FACTORIES = """
import torch

def no_arguments():
    return torch.nn.Linear(64, 10)

def needs_classes(classes):
    return torch.nn.Linear(64, classes)

def three_outputs(num_classes, input_shape):
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 3))

def raises(num_classes, input_shape):
    raise RuntimeError("no weights for this size")

class NoObs(torch.nn.Module):  # an actor-critic whose forward takes no observations
    def __init__(self, num_classes, input_shape):
        super().__init__()
        self.linear = torch.nn.Linear(input_shape[0], num_classes + 1)

    def forward(self):
        return self.linear.weight

class TakesMask(NoObs):  # ... or needs more than them
    def forward(self, x, mask):
        out = self.linear(x * mask)
        return out[:, :-1], out[:, -1]
"""


# (id, arguments with {placeholders} for bad_inputs(), a fragment the message must contain)
ERROR_TABLE = [
    ("unknown-model", "train --model resnet101", "unknown --model 'resnet101'"),
    ("unknown-data", "train --data mnist", "unknown --data 'mnist'"),
    ("unknown-precision", "train --precision fp12", "unknown --precision 'fp12'"),
    ("missing-path", "train --data npz:{root}/missing.npz", "no such file"),
    ("bad-idx-magic", "train --data idx:{idx}", "magic number 0x00000801, expected 0x00000803"),
    ("cifar-not-a-dict", "train --data cifar10:{cifar}", "not the dict of a CIFAR batch"),
    ("undecodable-image", "train --data imagefolder:{images}", "cannot decode image"),
    ("csv-without-label", "train --data csv-text:{csv}", "columns text and label"),
    ("npz-without-y", "train --data npz:{npz}", "needs arrays named x and y"),
    ("accumulate-0", "train --accumulate 0", "--accumulate must be an integer >= 1"),
    ("micro-batch-word", "train --micro-batch-size big", "--micro-batch-size must be a positive"),
    ("micro-batch-indivisible", "train --batch-size 64 --micro-batch-size 10",
     "--micro-batch-size 10 does not divide"),
    ("unknown-flag", "train --warp-speed 9", "unrecognized arguments: --warp-speed"),
    ("bad-choice", "train --lr-scaling cube", "argument --lr-scaling: invalid choice"),
    ("optimizer-not-torchs", "train --optimizer adamz",
     "--optimizer adamz is not one of amptrain's (sgd, adamw, adamw8bit) nor a torch.optim "
     "class"),
    ("optimizer-args-bad-keyword", "train --optimizer Adadelta --optimizer-args {{\"rhoo\":1}}",
     "--optimizer-args: Adadelta takes no argument 'rhoo'; did you mean 'rho'?"),
    ("bad-number", "train --epochs three", "argument --epochs: invalid int value"),
    ("bad-yaml", "train --config {yaml}", "not valid YAML at line"),
    ("unknown-yaml-key", "train --config {root}/typo.yaml", "unknown option --epoch"),
    ("resume-auto-without-out", "train --resume auto", "--resume auto needs --out"),
    ("keep-fp32-matches-nothing", "train --keep-fp32 *.attention --out {root}/k",
     "--keep-fp32 '*.attention' matches no module"),
    ("model-data-mismatch", "train --model lstm --data digits", "needs token sequences"),
    ("transformer-bad-heads", "train --model transformer:heads=3 --data synthetic-seq:samples=8",
     "not divisible by heads 3"),
    ("lr-scaling-without-base", "train --lr-scaling linear", "needs --base-batch-size"),
    ("out-holds-a-run", "train --out {existing}", "already holds a run"),
    ("eval-missing-checkpoint", "eval --checkpoint {root}/none.pt --out {root}/e", "no such file"),
    ("eval-corrupt-checkpoint", "eval --checkpoint {checkpoint} --out {root}/e",
     "truncated (its end is missing"),
    ("eval-without-checkpoint", "eval --out {root}/e", "required: --checkpoint"),
    ("timm-not-installed", "train --model timm:resnet18", "pip install timm"),
    ("keras-not-a-model-file", "train --model keras:{yaml}", "is not a Keras model file"),
    ("unknown-logger", "train --logger tensorboard,wandb", "--logger wandb: choose from"),
    ("export-missing-checkpoint", "export --checkpoint {root}/none.pt --format safetensors",
     "no such file"),
    ("export-corrupt-checkpoint", "export --checkpoint {checkpoint} --format hf",
     "truncated (its end is missing"),
    ("export-unknown-format", "export --checkpoint {checkpoint} --format onnx",
     "argument --format: invalid choice"),
    # Hostile input (issue 14): each class fixed at its root, not for this one example.
    ("yaml-word-for-number", "train --config {yaml_lr}", "--lr must be a number (got 'abc')"),
    ("yaml-number-for-list", "train --config {yaml_keep}", "--keep-fp32 takes a pattern"),
    ("yaml-word-for-factor", "train --config {yaml_growth}", "--growth-factor must be a number"),
    ("yaml-number-for-path", "train --config {yaml_resume}", "--resume must be a string"),
    ("yaml-mapping-for-name", "train --config {yaml_model}", "--model must be a string"),
    ("yaml-word-for-switch", "train --config {yaml_bool}", "--compile is true or false"),
    ("yaml-empty-file", "train --config {yaml_empty}", "the file is empty"),
    ("yaml-list", "train --config {yaml_list}", "got a YAML list"),
    ("yaml-not-utf8", "train --config {yaml_bytes}", "not UTF-8 text"),
    ("yaml-directory", "train --config {root}", "is a directory"),
    ("out-is-a-file", "train --out {a_file}", "is a file, not a directory"),
    ("out-under-a-file", "train --out {a_file}/run", "is a file, so no directory can be made"),
    ("out-cannot-be-created", "train --out /proc/amptrain-run", "cannot create it"),
    ("seed-beyond-64-bits", "train --seed 99999999999999999999999", "--seed must be an integer "
                                                                     "from 0 to 4294967295"),
    ("seed-negative", "train --seed -3", "--seed must be >= 0"),
    ("master-port-range", "train --nproc-per-node 2 --master-port 70000",
     "--master-port must be a TCP port from 1 to 65535"),
    ("nproc-per-node-0", "train --nproc-per-node 0", "--nproc-per-node must be >= 1"),
    ("keep-last-negative", "train --keep-last -1", "--keep-last must be >= 0"),
    ("npz-nan-features", "train --model mlp --data npz:{nan_x}", "x contains NaN or infinite"),
    ("npz-inf-features", "train --model mlp --data npz:{inf_x}", "x contains NaN or infinite"),
    ("npz-nan-labels", "train --model mlp --data npz:{nan_y} --task classification",
     "label of row 5 is nan"),
    ("npz-float-labels", "train --model mlp --data npz:{float_y} --task classification",
     "labels are not whole numbers"),
    # Tasks: regression and language modelling.
    ("regression-nan-targets", "train --model mlp --data npz:{nan_y}",
     "y of row 5 is not a finite number"),
    ("task-regression-class-labels", "train --model mlp --data npz:{features} --task regression",
     "--task regression needs float targets"),
    ("task-lm-with-digits", "train --task lm", "--task lm does not fit --data digits"),
    ("task-unknown", "train --task ranking", "invalid choice: 'ranking'"),
    ("loss-for-a-classifier", "train --loss huber", "--loss huber applies to regression"),
    ("seq-len-without-text", "train --seq-len 64", "--seq-len applies to text: data"),
    ("tokenizer-not-a-spec", "train --model gpt --data text:{long_txt} --tokenizer words",
     "--tokenizer must be byte or hf:DIR"),
    ("text-empty-directory", "train --model gpt --data text:{empty_dir}",
     "the directory holds no files"),
    ("text-binary-only", "train --model gpt --data text:{binary_dir}",
     "no UTF-8 text found in 1 file(s) (1 binary)"),
    ("text-not-utf8", "train --model gpt --data text:{latin1_txt}",
     "no UTF-8 text found in 1 file(s) (1 not UTF-8)"),
    ("text-shorter-than-a-block", "train --model gpt --data text:{short_txt} --seq-len 64",
     "too few for a training and a validation block of --seq-len 64"),
    ("seq-len-over-the-context", "train --model gpt:context=32 --data text:{long_txt} "
                                 "--seq-len 64", "--seq-len 64 is longer than the model's "
                                                 "context 32"),
    ("gpt-on-images", "train --model gpt", "is a language model: it needs text"),
    ("mlp-on-text", "train --model mlp --data text:{long_txt}", "needs --model gpt"),
    ("cnn-on-text", "train --data text:{long_txt}", "try --model gpt"),
    ("text-for-a-classifier", "train --model mlp --data text:{long_txt} --task classification",
     "--task classification does not fit --data text:"),
    ("generate-corrupt-checkpoint", "generate --checkpoint {checkpoint}",
     "truncated (its end is missing"),
    ("generate-bad-temperature", "generate --checkpoint {checkpoint} --temperature -1",
     "--temperature must be >= 0"),
    ("npz-length-mismatch", "train --model mlp --data npz:{short_y}", "x has 60 rows but y has 50"),
    ("npz-empty", "train --model mlp --data npz:{empty}", "x needs at least 2 rows (got 0)"),
    ("npz-1d-x", "train --model mlp --data npz:{flat_x}", "x must have a row per sample"),
    ("npz-no-features", "train --model mlp --data npz:{no_features}", "x has no values per sample"),
    ("features-for-a-conv-net", "train --model cnn --data npz:{features}", "needs images"),
    ("batch-over-dataset", "train --model mlp --data npz:{features} --batch-size 5000",
     "--batch-size 5000 is larger than the training set (48 samples)"),
    ("micro-batch-over-batch", "train --batch-size 32 --micro-batch-size 64",
     "--micro-batch-size 64 is larger than --batch-size 32"),
    ("factory-with-an-argument-it-is-not-given", "train --model module:factories.needs_classes",
     "the factory is called with those of the keywords num_classes, input_shape, kind and "
     "vocab_size it names"),
    ("factory-named-by-its-file", "train --model module:factories.py:no_arguments",
     "give the module's import name, not its file: --model module:factories:no_arguments"),
    ("factory-too-few-outputs", "train --model module:factories.three_outputs",
     "returns 3 outputs per sample, but the data has 10 classes"),
    ("factory-raises", "train --model module:factories.raises",
     "the factory raised RuntimeError: no weights for this size"),
    ("eval-checkpoint-is-a-directory", "eval --checkpoint {empty_dir} --out {root}/e2",
     "is a directory with no checkpoint in it"),
    ("compare-unknown-precision", "compare --precisions 32-true,fp12", "fp12"),
    # Issue 28: a new hostile round; each class fixed at its root (see round_two_inputs).
    # 1. tracebacks: entries of the wrong kind in --out, damaged checkpoints, late checks
    ("out-checkpoints-is-a-file", "train --max-steps 1 --out {out_ckpt_file}",
     "checkpoints is a file, but amptrain writes a directory there"),
    ("out-metrics-is-a-directory", "train --max-steps 1 --out {out_metrics_dir}",
     "metrics.jsonl is a directory, but amptrain writes a file there"),
    ("eval-out-eval-is-a-file", "eval --checkpoint {cls_ckpt} --out {out_eval_file}",
     "eval is a file, but amptrain writes a directory there"),
    ("checkpoint-without-model", "eval --checkpoint {ckpt_no_model} --out {root}/e3",
     "its 'model' section is missing"),
    ("checkpoint-step-is-text", "generate --checkpoint {ckpt_step_text}",
     "its 'step' section is a str, not a int"),
    ("checkpoint-weight-not-a-tensor", "eval --checkpoint {ckpt_entry_not_tensor} --out {root}/e4",
     "model entry 'extra' is a list, not a tensor"),
    ("checkpoint-run-inputs-damaged", "generate --checkpoint {ckpt_bad_inputs}",
     "its 'run' section does not describe the model's inputs"),
    ("generate-nan-weights", "generate --checkpoint {ckpt_nan}", "holds non-finite weights"),
    ("generate-seed-negative", "generate --checkpoint {lm_ckpt} --seed -1",
     "--seed must be an integer from 0 to 4294967295"),
    ("generate-temperature-infinite", "generate --checkpoint {lm_ckpt} --temperature inf",
     "--temperature must be >= 0 and finite"),
    ("regression-val-inputs-differ", "train --model mlp --data npz:{val_shape}",
     "x_val rows have shape (5,), x rows (8,)"),
    # 2. garbage with exit 0
    ("eval-nan-weights", "eval --checkpoint {ckpt_nan} --out {root}/e5",
     "holds non-finite weights (17 of 17 tensors"),
    ("labels-all-distinct", "train --model mlp --data npz:{ids_y} --batch-size 16",
     "every one of the 48 training labels is distinct"),
    # 3. a user's files overwritten: one rule for every command
    ("train-config-inside-out", "train --config {config_dir}/config.yaml --out {config_dir}",
     "already holds config.yaml, which this command would replace"),
    ("train-out-with-tb-files", "train --max-steps 1 --out {out_tb_used}", "already holds tb/"),
    ("eval-into-earlier-reports", "eval --checkpoint {cls_ckpt} --out {out_eval_used}",
     "already holds eval/, which this command would replace"),
    ("eval-into-the-training-run", "eval --checkpoint {cls_ckpt} --out {root}/cls_run",
     "already holds eval/"),
    ("diagnose-replaces-its-report", "diagnose --steps 2 --out {out_diagnose}",
     "already holds diagnose.json"),
    ("compare-replaces-a-report", "compare --bench-steps 2 --out {out_report}",
     "already holds report.md"),
    # 5. errors that name the wrong thing
    ("tokenizer-no-such-directory", "train --model gpt --data text:{long_txt} "
                                    "--tokenizer hf:{root}/nothing",
     "--tokenizer hf:"),
    ("tokenizer-directory-without-one", "train --model gpt --data text:{long_txt} "
                                        "--tokenizer hf:{no_tokenizer}",
     "holds no Hugging Face tokenizer"),
    ("text-is-a-fifo", "train --model gpt --data text:{fifo}", "is a FIFO (named pipe)"),
    ("text-is-dev-zero", "train --model gpt --data text:/dev/zero", "is a character device"),
    ("config-is-a-fifo", "train --config {fifo}", "is a FIFO (named pipe), not a regular file"),
    ("config-is-dev-zero", "train --config /dev/zero", "is a character device"),
    ("npz-is-a-fifo", "train --data npz:{fifo}", "a FIFO (named pipe), not a file"),
    ("checkpoint-is-dev-zero", "eval --checkpoint /dev/zero --out {root}/e6",
     "is a character device, not a regular file"),
    ("regression-target-beyond-float32", "train --model mlp --data npz:{huge_y}",
     "is beyond float32's range"),
    ("resume-lm-with-another-seq-len", "train --model gpt:layers=1,heads=2,width=32 "
                                       "--data text:{long_txt} --seq-len 32 --max-steps 2 "
                                       "--resume {lm_ckpt} --out {root}/r1",
     "--seq-len 32 differs from checkpoint"),
    ("resume-classifier-on-regression-data", "train --model mlp --data npz:{float_y} "
                                             "--batch-size 16 --max-steps 2 --resume "
                                             "{cls_ckpt} --out {root}/r2",
     "holds regression targets (regression), but checkpoint"),
    # 7. unbounded work: bounded up front, naming the limit
    ("seq-len-over-the-limit", "train --model gpt --data text:{long_txt} --seq-len 1000000",
     "--seq-len 1000000 is over the limit of 16384"),
    ("generate-tokens-over-the-limit", "generate --checkpoint {lm_ckpt} --tokens 1000000000000",
     "--tokens 1000000000000 is over the limit of 10000"),
    ("compare-bench-steps-over-the-limit", "compare --bench-steps 1000000000000",
     "--bench-steps 1000000000000 is over the limit of 10000"),
    ("compare-seeds-over-the-limit", "compare --seeds 1000000", "--seeds 1000000 is over the "
                                                               "limit of 100"),
    ("diagnose-steps-over-the-limit", "diagnose --steps 1000000000",
     "--steps 1000000000 is over the limit of 10000"),
    # GANs (issue 25): a factory's one model, a model or data that is not a GAN's.
    ("gan-factory-returns-one-model",
     "train --model module:factories.three_outputs --task gan --data digits",
     "--task gan needs a model with .generator and .discriminator parts"),
    ("gan-builtin-model-without-parts", "train --task gan --model mlp --data digits",
     "--task gan needs a model with .generator and .discriminator parts"),
    ("gan-on-feature-data", "train --task gan --model mlp --data npz:{features}",
     "--task gan generates images: train_data must hold grey or RGB images"),
    ("gan-sequence-model-on-text",
     "train --task gan --model gpt:layers=1,heads=2,width=32 --data text:{long_txt}",
     "--task gan does not fit --data text:"),
    ("gan-sequence-model-on-images",
     "train --task gan --model gpt:layers=1,heads=2,width=32 --data digits",
     "is a language model: it needs text"),
    ("dcgan-on-feature-data", "train --model dcgan --data npz:{features}",
     "--model dcgan generates images: it needs grey or RGB image data"),
    ("dcgan-on-text", "train --model dcgan --data text:{long_txt}",
     "--model dcgan trains gan, which does not fit --data text:"),
    # --- reliability-readers ---
    # 0. no code runs from a file
    ("resume-planted-sharded-metadata", "train --max-steps 1 --resume {planted_step} "
                                        "--out {root}/rp1",
     "refers to posix.system, which a sharded checkpoint's metadata never holds"),
    ("resume-auto-planted-sharded-step", "train --max-steps 1 --resume auto --out {planted_run}",
     "(a damaged or planted file); amptrain does not load it"),
    # 1. headers and metadata checked before they are trusted
    ("export-checkpoint-dev-zero",
     "export --checkpoint /dev/zero --format safetensors --out {root}/x1",
     "--checkpoint /dev/zero is a character device, not a regular file"),
    ("export-checkpoint-fifo", "export --checkpoint {reader_fifo} --format safetensors "
                               "--out {root}/x2",
     "is a FIFO (named pipe), not a regular file"),
    ("tokens-vocab-2-40", "train --model gpt:layers=1,heads=2,width=32 "
                          "--data tokens:{tok_vocab_2_40}",
     "is damaged: 'vocab_size' is 1099511627776"),
    ("tokens-negative-val-count", "train --model gpt:layers=1,heads=2,width=32 "
                                  "--data tokens:{tok_negative_val}",
     "is damaged: 'val_tokens' is -5"),
    ("tokens-count-is-text", "train --model gpt:layers=1,heads=2,width=32 "
                             "--data tokens:{tok_count_text}",
     "is damaged: 'tokens' is '400', not a whole number"),
    ("tokens-shard-outside", "train --model gpt:layers=1,heads=2,width=32 "
                             "--data tokens:{tok_outside}",
     "not a file inside the directory"),
    ("tokens-ids-beyond-vocab", "train --model gpt:layers=1,heads=2,width=32 "
                                "--data tokens:{tok_small_vocab}",
     "holds token id 249, but meta.json says the vocabulary has 100 ids"),
    ("resume-step-negative", "train --max-steps 2 --resume {ckpt_step_negative} --out {root}/x3",
     "its 'step' is -5, outside 0..1000000000000 (a damaged or hand-edited file)"),
    ("resume-step-10-18", "train --max-steps 2 --resume {ckpt_step_huge} --out {root}/x4",
     "its 'step' is 1000000000000000000, outside"),
    ("resume-batch-size-negative", "train --resume {ckpt_batch_negative} --out {root}/x5",
     "its config holds batch_size: -1, not a positive whole number"),
    ("resume-rng-of-wrong-type", "train --resume {ckpt_rng_text} --out {root}/x6",
     "its RNG state 'torch' is a str"),
    ("generate-vocab-terabytes", "generate --checkpoint {ckpt_vocab_huge}",
     "its 'run' section does not describe the model's inputs"),
    # (end of reliability-readers)
    # --- reliability-data-writers ---
    # Issue 36, class 2: a module: Dataset's claimed length is checked before a sampler
    # allocates for it (later samples: tests/data/test_module.py, mid-run).
    ("data-module-claims-10-12-samples",
     "train --model mlp --data module:tests.data.hostile_datasets.huge_length",
     "train Dataset claims 1000000000000 samples, over the limit of 268435456"),
    ("data-module-val-claims-10-12-samples",
     "train --model mlp --data module:tests.data.hostile_datasets.val_huge_length",
     "val Dataset claims 1000000000000 samples"),
    ("data-module-len-raises",
     "train --model mlp --data module:tests.data.hostile_datasets.len_raises",
     "len() of the factory's train Dataset raised RuntimeError: the index file is gone"),
    # Class 3: a name the file system cannot hold, for every command's --out; generate's
    # --out onto a file (it was FileExistsError after the checkpoint was read).
    ("out-name-too-long", "train --out {root}/" + "x" * 300,
     "is 300 bytes, over the file system's"),
    ("out-path-too-long", "train --out {root}/" + "/".join(["y" * 200] * 25),
     "over the system's 4096 bytes"),
    ("eval-out-name-too-long", "eval --checkpoint {checkpoint} --out {root}/" + "x" * 300,
     "is 300 bytes, over the file system's"),
    ("diagnose-out-name-too-long", "diagnose --model mlp --out {root}/" + "x" * 300,
     "is 300 bytes, over the file system's"),
    ("generate-out-name-too-long",
     "generate --checkpoint {checkpoint} --samples 2 --out {root}/" + "x" * 300,
     "is 300 bytes, over the file system's"),
    ("generate-out-is-a-file",
     "generate --checkpoint {checkpoint} --samples 2 --out {a_file}",
     "is a file, not a directory"),
    # Class 7: garbage numbers that trained (then "lower --lr"), a split with nothing to train.
    ("weight-decay-nan", "train --weight-decay nan", "--weight-decay must be >= 0 (got nan)"),
    ("momentum-inf", "train --optimizer sgd --momentum inf", "--momentum must be >= 0 (got inf)"),
    ("prepare-val-fraction-leaves-nothing",
     "prepare --data text:{long_txt} --out {root}/prepared --val-fraction 0.999999",
     "--val-fraction 0.999999 leaves 0 of the"),
    # (end of reliability-data-writers)
    # --- newcomer-defaults ---
    ("command-misspelt", "trian --model mlp", "unknown command 'trian'; did you mean train?"),
    ("command-unknown", "xyzzy", "unknown command 'xyzzy'; the commands: train, eval,"),
    # (end of newcomer-defaults)
    # --- newcomer-readme ---
    # (end of newcomer-readme)
    # --- lowbit-formats ---
    ("lowbit-unknown-format", "train --precision mxfp6", "unknown --precision 'mxfp6'"),
    ("lowbit-unknown-alias", "train --precision nv-fp8", "unknown --precision 'nv-fp8'"),
    ("lowbit-keep-fp32-matches-nothing",
     "train --precision mxfp8 --keep-fp32 *.nothing --out {root}/lowbit-k",
     "--keep-fp32 '*.nothing' matches no module"),
    ("lowbit-device-without-the-format", "train --precision nvfp4 --device cuda",
     "--device cuda"),
    # (end of lowbit-formats)
    # --- ppo ---
    ("ppo-unknown-env", "train --data gym:NoSuchEnv-v0 --model actor-critic",
     "--data gym:NoSuchEnv-v0: making the environment NoSuchEnv-v0 failed: NameNotFound: "
     "Environment `NoSuchEnv` doesn't exist"),
    ("ppo-tuple-observations", "train --data gym:Blackjack-v1 --model actor-critic",
     "--data gym:Blackjack-v1: the observation space is Tuple"),
    ("ppo-env-steps-zero", "train --data gym:CartPole-v1 --model actor-critic --env-steps 0",
     "--env-steps must be"),
    ("ppo-gym-with-a-supervised-task",
     "train --data gym:CartPole-v1 --model actor-critic --task classification",
     "--task classification does not fit --data gym:CartPole-v1, which holds environment "
     "transitions"),
    ("ppo-task-on-a-dataset", "train --model mlp --task ppo",
     "--task ppo does not fit --data digits"),
    ("ppo-model-not-an-actor-critic", "train --data gym:CartPole-v1 --model mlp",
     "--task ppo needs an actor-critic"),
    ("ppo-module-not-an-actor-critic",
     "train --data gym:CartPole-v1 --model module:factories.three_outputs",
     "--task ppo needs an actor-critic"),
    ("ppo-rl-flag-on-a-dataset", "train --model mlp --num-envs 4",
     "--num-envs applies to reinforcement learning on gym: data"),
    ("ppo-max-steps", "train --data gym:CartPole-v1 --model actor-critic --max-steps 5",
     "--max-steps does not apply to --task ppo: --env-steps sets the run's length"),
    ("ppo-eval-episodes-zero", "eval --checkpoint {checkpoint} --out {root}/ppo-ev --episodes 0",
     "--episodes must be >= 1 (got 0)"),
    # (end of ppo)
    # --- rlstats ---
    # (end of rlstats)
    # --- precsplit ---
    # checked where it is declared (the precision section), before any later option
    ("precsplit-precision-checked-where-declared", "train --precision fp12 --epochs 0",
     "unknown --precision 'fp12'"),
    # (end of precsplit)
    # --- windows ---
    # (end of windows)
    # --- parts ---
    # (end of parts)
    # --- tasks ---
    ("tasks-generate-text-from-a-classifier", "generate --checkpoint {cls_ckpt} --prompt hi",
     "holds a classification model; generate needs a language model"),
    ("tasks-generate-images-from-an-lm",
     "generate --checkpoint {lm_ckpt} --samples 2 --out {root}/tasks-images",
     "--samples draws images from a GAN; --checkpoint"),
    ("tasks-eval-on-data-of-another-task",
     "eval --checkpoint {cls_ckpt} --data text:{long_txt} --out {root}/tasks-eval",
     "classes and inputs (128,), but the checkpoint's model expects"),
    # (end of tasks)
    # --- reliab ---
    # Issue 48: the user's environment fails (data/gym_guard.py wraps it once), waits and
    # sizes bounded before anything is made or allocated.
    ("reliab-env-reset-raises",
     "train --data gym:tests.data.hostile_envs:ResetRaises-v0 --out {root}/rl1",
     "raised in reset (seed 1000000): OSError: no such map file"),
    ("reliab-env-old-api",
     "train --data gym:tests.data.hostile_envs:OldApi-v0 --out {root}/rl2",
     "returned a 4-tuple from step at step 1 (the old Gym API)"),
    ("reliab-env-0d-observations",
     "train --data gym:tests.data.hostile_envs:ZeroD-v0 --out {root}/rl3",
     "observation space has shape (); amptrain's ppo needs at least one observed value"),
    ("reliab-env-needs-pygame",
     "train --data gym:tests.data.hostile_envs:NeedsPygame-v0 --out {root}/rl4",
     "failed: DependencyNotInstalled: pygame is not installed"),
    ("reliab-env-registration-fails",
     "train --data gym:tests.data.hostile_envs:Unimportable-v0 --out {root}/rl5",
     "failed: ModuleNotFoundError: No module named 'tests.data.no_such_module'"),
    ("reliab-env-module-import-error", "train --data gym:tests.no_such_module:X-v0",
     "making the environment tests.no_such_module:X-v0 failed: ModuleNotFoundError"),
    ("reliab-env-max-episode-steps-0", "train --data gym:CartPole-v1,max_episode_steps=0",
     "Expect the `max_episode_steps` to be positive, actually: 0"),
    ("reliab-rollout-steps-2e9",
     "train --data gym:CartPole-v1 --rollout-steps 2000000000 --out {root}/rl6",
     "--rollout-steps 2000000000 x --num-envs 4: the rollout would need about"),
    ("reliab-eval-episodes-10-6",
     "train --data gym:CartPole-v1 --eval-episodes 1000000 --out {root}/rl7",
     "--eval-episodes 1000000 is more than the 10000 evaluation episodes"),
    ("reliab-env-steps-below-a-rollout", "train --data gym:CartPole-v1 --env-steps 1",
     "--env-steps 1 is less than one rollout of 512 environment steps (--num-envs 4 x "
     "--rollout-steps 128)"),
    ("reliab-minibatch-of-one-transition",
     "train --data gym:CartPole-v1 --num-envs 1 --rollout-steps 4 --minibatches 4",
     "--minibatches 4 leaves minibatches of one transition"),
    ("reliab-ppo-micro-batch-auto", "train --data gym:CartPole-v1 --micro-batch-size auto",
     "--micro-batch-size auto does not apply to --task ppo"),
    ("reliab-ppo-max-steps-not-its-own",
     "train --data gym:CartPole-v1 --env-steps 2048 --max-steps 64000",
     "--max-steps does not apply to --task ppo"),
    ("reliab-yaml-base-60", "train --config {reliab_base60}",
     "--max-steps must be an integer (got '1:00')"),
    # A NUL byte in a path or value from a config file: one line, not os.stat's ValueError.
    ("reliab-nul-in-out", "train --config {reliab_nul_out}",
     "--out holds a NUL byte (got 'runs/x\\x00y')"),
    ("reliab-nul-in-data", "train --config {reliab_nul_data}", "--data holds a NUL byte"),
    ("reliab-nul-in-keep-fp32", "train --config {reliab_nul_keep}",
     "--keep-fp32 holds a NUL byte"),
    ("reliab-user-lock-file-train", "train --max-steps 1 --out {reliab_user_lock}",
     "holds .amptrain.lock, a file amptrain did not create"),
    ("reliab-user-lock-file-diagnose", "diagnose --steps 1 --out {reliab_user_lock}",
     "holds .amptrain.lock, a file amptrain did not create"),
    ("reliab-user-lock-file-eval", "eval --checkpoint {checkpoint} --out {reliab_user_lock}",
     "holds .amptrain.lock, a file amptrain did not create"),
    ("reliab-user-lock-file-prepare",
     "prepare --data text:{long_txt} --out {reliab_user_lock}",
     "holds .amptrain.lock, a file amptrain did not create"),
    ("reliab-user-lock-file-compare", "compare --bench-steps 1 --out {reliab_user_lock}",
     "holds .amptrain.lock, a file amptrain did not create"),
    # --eval-episodes bounded with the options: compare said its timing line first.
    ("reliab-compare-eval-episodes-10-6",
     "compare --data gym:CartPole-v1 --eval-episodes 1000000 --out {root}/rl10",
     "--eval-episodes 1000000 is more than the 10000 evaluation episodes"),
    ("reliab-eval-episodes-of-a-checkpoint-10-6",
     "eval --checkpoint {checkpoint} --episodes 1000000 --out {root}/rl11",
     "--episodes 1000000 is more than the 10000 evaluation episodes"),
    # A module: actor-critic whose forward cannot take observations: --model, at set-up.
    ("reliab-actor-critic-forward-takes-no-obs",
     "train --data gym:CartPole-v1 --model module:factories.NoObs --out {root}/rl8",
     "--model module:factories.NoObs: --task ppo needs an actor-critic whose forward takes "
     "one batch of observations, forward(obs) with obs of shape (N, 4)"),
    ("reliab-actor-critic-forward-needs-more",
     "train --data gym:CartPole-v1 --model module:factories.TakesMask --out {root}/rl9",
     "TakesMask.forward(x, mask) cannot be called as forward(obs): missing a required "
     "argument: 'mask'"),
    # (end of reliab)
    # --- owners ---
    # Issue 33: compare's YAML meets its flags where every command's do (merged_values).
    ("compare-unknown-yaml-key", "compare --config {root}/typo.yaml",
     "unknown option --epoch in --config"),
    # (end of owners)
]


#: Rows that must run as a real ``python -m amptrain`` process (the rest run in this
#: process through the same entry point, ``cli.main(argv)``: see :func:`run_in_process`).
#: Add a row's name here when it needs a fresh interpreter: import-time behaviour, a module
#: that is not installed, a signal, something that may hang or kill the process.
SUBPROCESS_ROWS = {"timm-not-installed", "out-cannot-be-created", "text-is-dev-zero",
                   "config-is-dev-zero", "checkpoint-is-dev-zero"}
#: ... and every row whose arguments contain one of these (user modules put the working
#: directory on sys.path; a FIFO could block a read forever; launches start processes).
SUBPROCESS_MARKS = ("module:", "{fifo}", "--nproc-per-node", "--master-port", "/dev/")


def needs_subprocess(name: str, args: str) -> bool:
    """Whether ERROR_TABLE's row ``name`` runs as a real process (see SUBPROCESS_ROWS)."""
    return name in SUBPROCESS_ROWS or any(mark in args for mark in SUBPROCESS_MARKS)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def run_in_process(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``amptrain ARGV`` through ``cli.main`` in this process, as a fresh interpreter would
    run it: its stdout, stderr and exit code (SystemExit's, main's, or 1 with the traceback
    on stderr for an uncaught exception), in ``cwd``, with Python's default warning filters
    (pytest's recorder would hide a stray warning a user sees), and everything a run may
    change put back afterwards: cwd, environment, signal handlers, torch's threads, default
    dtype, determinism flag and RNG. Output written by C code to the file descriptors
    directly is not seen here (the subprocess rows and tests/test_quiet.py cover it)."""
    import contextlib
    import io
    import signal
    import traceback

    import torch

    from amptrain import cli

    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    signals = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    threads, dtype = torch.get_num_threads(), torch.get_default_dtype()
    deterministic = torch.are_deterministic_algorithms_enabled()
    # cli.configure_logging gives amptrain's logger its own stderr handler and stops it
    # propagating: left so, later tests' caplog would see none of amptrain's records.
    logger = logging.getLogger("amptrain")
    saved_logger = (list(logger.handlers), logger.level, logger.propagate)
    code: int
    try:
        os.chdir(cwd)
        with torch.random.fork_rng(), warnings.catch_warnings(), \
                contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            warnings.resetwarnings()  # a fresh interpreter's filters
            for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning,
                             ResourceWarning):
                warnings.simplefilter("ignore", category)
            warnings.showwarning = _show_warning
            try:
                code = cli.main(argv)
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else 1
            except Exception:  # noqa: BLE001 - a subprocess would print it and exit 1
                traceback.print_exc()
                code = 1
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        for number, handler in signals.items():
            signal.signal(number, handler)
        torch.set_num_threads(threads)
        torch.set_default_dtype(dtype)
        torch.use_deterministic_algorithms(deterministic)
        logger.handlers[:], logger.propagate = saved_logger[0], saved_logger[2]
        logger.setLevel(saved_logger[1])
        logging.disable(logging.NOTSET)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def error_runs(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """Run the whole table: the subprocess rows concurrently (each is a Python start-up,
    mostly waiting) while the others run one by one in this process."""
    root = tmp_path_factory.mktemp("bad")
    paths = {k: str(v) for k, v in bad_inputs(root).items()}
    (root / "typo.yaml").write_text("epoch: 3\n")
    work = tmp_path_factory.mktemp("cwd")  # nothing may land in the repository's runs/
    (work / "factories.py").write_text(FACTORIES)
    before = _snapshot(root)

    def argv_of(case) -> list[str]:
        _, args, _ = case
        argv = [a.format(root=root, **paths) for a in args.split()]
        # diagnose, generate and export show no bar (and take no --no-progress)
        quiet = [] if argv[0] in ("diagnose", "generate", "export") else ["--no-progress"]
        return argv + quiet

    def run(case):
        return case[0], amptrain(*argv_of(case), cwd=work)

    apart = [case for case in ERROR_TABLE if needs_subprocess(case[0], case[1])]
    with ThreadPoolExecutor(max_workers=4) as pool:
        started = pool.map(run, apart)
        runs = {case[0]: run_in_process(argv_of(case), work) for case in ERROR_TABLE
                if case not in apart}
        runs.update(started)
    runs["files-unchanged"] = _snapshot(root) == before  # type: ignore[assignment]
    return runs


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


@pytest.mark.slow
@pytest.mark.timeout(1200)  # the whole table's processes start in this test's fixture
def test_no_bad_invocation_changed_a_file(error_runs):
    # The earlier run in {existing} and every input file are exactly as they were.
    assert error_runs["files-unchanged"] is True
    assert len(ERROR_TABLE) >= 115


@pytest.mark.slow
@pytest.mark.parametrize("name,args,fragment", ERROR_TABLE, ids=[c[0] for c in ERROR_TABLE])
def test_bad_invocation_is_one_line_exit_2(error_runs, name, args, fragment):
    if name == "timm-not-installed" and _importable("timm"):
        pytest.skip("timm is installed here")
    result = error_runs[name]
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr and lines[0].startswith("amptrain: error: ")
    assert fragment in lines[0]
    assert result.stdout == ""


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


# ------------------------------------------------------------ (b) help and ranks
def test_help():
    result = amptrain("--help")
    assert result.returncode == 0 and "train" in result.stdout and "eval" in result.stdout
    train = amptrain("train", "--help")
    assert train.returncode == 0
    for flag in ("--precision", "--model", "--data", "--config", "--keep-fp32", "--accumulate",
                 "--task", "--seq-len"):
        assert flag in train.stdout


def test_every_command_has_help():
    # argparse formats help text with %: an option's help with a bare % breaks --help.
    from amptrain.commands import COMMANDS

    for name in COMMANDS:
        result = amptrain(name, "--help")
        assert result.returncode == 0 and "usage: amptrain " + name in result.stdout, name


def test_user_errors_of_other_ranks_say_which_rank(monkeypatch, capsys):
    # Under torchrun every process reports its own error; one write per line keeps the
    # processes' lines whole, and the rank tells the copies apart.
    from amptrain import cli

    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert cli.main(["train", "--accumulate", "0", "--no-progress"]) == 2
    assert capsys.readouterr().err == ("amptrain[rank 3]: error: --accumulate must be an "
                                       "integer >= 1 (got 0)\n")
    monkeypatch.setenv("RANK", "0")
    assert cli.main(["train", "--accumulate", "0", "--no-progress"]) == 2
    assert capsys.readouterr().err.startswith("amptrain: error: --accumulate")


# ------------------------------------------------------------------ (c) start-up
# What `python -m amptrain ARGS` imported by the time it exited, from `-X importtime` (the
# interpreter's own record of every import, written to stderr).
@pytest.mark.parametrize("args", [["--help"], ["--version"], ["train", "--epoch", "3"],
                                  ["train", "--help"], ["trian"]],
                         ids=["help", "version", "mistyped-flag", "train-help", "mistyped-command"])
def test_help_version_and_flag_errors_do_not_import_torch(args):
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "amptrain", *args],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 2), done.stderr
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    assert "amptrain.cli" in imported  # the record is there
    heavy = sorted(name for name in imported if name.split(".")[0] in ("torch", "numpy"))
    assert heavy == [], f"amptrain {' '.join(args)} imported {heavy[:5]}"

# ------------------------------------------------- (c) near misses, warnings, aliases
@pytest.mark.parametrize("argv,hint", [
    (["train", "--epoch", "3"], "unrecognized arguments: --epoch 3 (did you mean --epochs?)"),
    (["compare", "--precision=bf16"], "(did you mean --precisions?)"),
    (["train", "--no-such-flag"], "unrecognized arguments: --no-such-flag (see"),
])
def test_an_unknown_flag_names_the_closest_one(capsys, argv, hint):
    from amptrain import cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and hint in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv,hint", [
    (["trian", "--model", "mlp"], "unknown command 'trian'; did you mean train?"),
    (["compaer"], "did you mean compare?"),
    (["xyzzy"], "unknown command 'xyzzy'; the commands: train, eval, compare,"),
])
def test_a_misspelt_command_names_the_closest_one(capsys, argv, hint):
    from amptrain import cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and hint in err and len(err.strip().splitlines()) == 1


def test_a_warning_is_printed_once_and_the_apex_name_beside_amptrains(monkeypatch, capsys,
                                                                      tmp_path):
    # On a CPU without fp16 units O1 (16-mixed) is emulated: the library's AmptrainWarning
    # reaches the terminal once, as amptrain's own line, not Python's warning format.
    from amptrain import cli
    from tests.cpu_classes import fake_cpu

    fake_cpu(monkeypatch, "avx512-bf16")
    assert cli.main(["train", "--model", "mlp", "--data", "digits", "--precision", "O1",
                     "--max-steps", "2", "--no-progress", "--out", str(tmp_path / "r")]) == 0
    out, err = capsys.readouterr()
    said = [line for line in err.splitlines() if "is emulated" in line]
    assert said == [said[0]] and said[0].startswith("amptrain: warning: 16-mixed is emulated")
    assert "--precision bf16-mixed (native here)" in said[0] and "AmptrainWarning" not in err
    assert "precision 16-mixed (O1)" in err and "(16-mixed (O1)," in out


@pytest.mark.parametrize("name", ["accumulate-0", "bad-choice", "eval-corrupt-checkpoint"])
def test_an_in_process_row_reads_exactly_as_the_real_process(tmp_path, name):
    # The table's in-process runs stand for `python -m amptrain`: the same exit code and
    # the same output, byte for byte, for a parser error, a config error and a late one.
    case = next(c for c in ERROR_TABLE if c[0] == name)
    assert not needs_subprocess(*case[:2])
    checkpoint = tmp_path / "corrupt.pt"
    checkpoint.write_bytes(b"PK\x03\x04 truncated")
    argv = case[1].format(checkpoint=checkpoint, root=tmp_path).split() + ["--no-progress"]
    inside, real = run_in_process(argv, tmp_path), amptrain(*argv, cwd=tmp_path)
    assert (inside.returncode, inside.stdout, inside.stderr) \
        == (real.returncode, real.stdout, real.stderr) and inside.returncode == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corrupt.pt"]
