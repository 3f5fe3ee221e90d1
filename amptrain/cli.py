"""The ``amptrain`` command: argument parsing, config merging, and exit codes.

Flags of ``train`` are generated from :class:`~amptrain.config.RunConfig`, so every
config field is a flag, a YAML key and a library keyword under the same name.
User errors print one line on stderr and exit 2; no traceback.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from . import __version__
from .config import RunConfig, build_config, cli_flag, load_yaml
from .errors import AmptrainError, Preempted, TrainingHalted, UserError, cli_spelling

log = logging.getLogger("amptrain")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit code 2), and flags are never
    abbreviated: ``compare --precision X`` would otherwise be taken for ``--precisions X``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # noqa: D102
        self.exit(2, f"amptrain: error: {message} (see `{self.prog} --help`)\n")


def add_config_flags(parser: argparse.ArgumentParser, cls: type = RunConfig,
                     only: Sequence[str] | None = None) -> None:
    """Add one flag per config field; defaults are suppressed so only given flags appear."""
    groups: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if only is not None and f.name not in only:
            continue
        meta = f.metadata
        group_name = meta.get("group", "training")
        group = groups.get(group_name) or groups.setdefault(
            group_name, parser.add_argument_group(f"{group_name} options"))
        default = f.default if f.default is not dataclasses.MISSING else None
        help_text = meta.get("help", "")
        if default not in (None, False, []) and not isinstance(default, list):
            help_text += f" (default: {default})"
        kwargs: dict[str, Any] = {"help": help_text, "default": argparse.SUPPRESS}
        if isinstance(default, bool):
            kwargs["action"] = "store_true"
        elif f.default is dataclasses.MISSING:  # list fields (default_factory)
            kwargs["action"] = "append"
            kwargs["metavar"] = "PATTERN"
        else:
            kwargs["type"] = meta.get("kind") or type(default)
            if meta.get("choices"):
                kwargs["choices"] = meta["choices"]
            kwargs["metavar"] = f.name.upper() if not meta.get("choices") else None
            if kwargs["metavar"] is None:
                del kwargs["metavar"]
        group.add_argument(cli_flag(f.name), dest=f.name, **kwargs)


def merged_values(args: argparse.Namespace, cls: type = RunConfig) -> dict[str, Any]:
    """YAML from --config, overridden by the flags that were given."""
    values: dict[str, Any] = load_yaml(args.config) if getattr(args, "config", None) else {}
    names = {f.name for f in dataclasses.fields(cls)}
    for name, value in vars(args).items():
        if name in names:
            values[name] = value
    return values


def default_out(config: RunConfig) -> str:
    """runs/<time>-<model>-<data>, with path characters made safe."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{config.model}-{config.data}").strip("_")[:60]
    return str(Path("runs") / f"{stamp}-{safe}")


# --------------------------------------------------------------------- train
def _add_train(parser: argparse.ArgumentParser) -> None:
    from .launch import add_launch_flags

    parser.add_argument("--config", help="YAML file of options (flags override it)")
    add_config_flags(parser, RunConfig)
    add_launch_flags(parser)


def _run_train(args: argparse.Namespace) -> int:
    from .distributed import is_main_process
    from .launch import launch, launch_requested
    from .runner import run_training

    config = build_config(RunConfig, merged_values(args), source="option")
    if config.resume == "auto" and not config.out:
        raise UserError("--resume auto needs --out (the run directory to continue)")
    if not config.out:
        config.out = default_out(config)
    if launch_requested(args):
        return launch(args, config)
    result = run_training(config)
    if not is_main_process():
        return 0
    bad = result.nonfinite_metrics()
    if bad:  # a run that learnt nothing usable must not look like a success
        raise TrainingHalted(
            f"training diverged: its final {' and '.join(bad)} "
            f"{'are' if len(bad) > 1 else 'is'} not finite after {result.steps} steps "
            f"({result.skipped_steps} skipped); lower --lr, set --clip-grad-norm or run "
            f"`amptrain diagnose` (outputs kept in {result.out}/)")
    acc = f"{result.val_acc:.4f}" if result.val_acc is not None else "n/a"
    speed = f", {result.samples_per_s:.0f} samples/s" if result.samples_per_s else ""
    print(f"done: val_acc {acc}  val_loss {_num(result.val_loss)}  after {result.steps} steps "
          f"({result.precision}{speed}, {result.skipped_steps} skipped)")
    print(f"outputs: {result.out}/ (config.yaml, metrics.jsonl, tb/, checkpoints/, eval/)")
    return 0


# ---------------------------------------------------------------------- eval
def _add_eval(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="checkpoint file (e.g. DIR/checkpoints/last.pt)")
    parser.add_argument("--data", help="dataset to evaluate on (default: the training data)")
    parser.add_argument("--precision", default="auto", help="precision for evaluation (default: auto)")
    parser.add_argument("--out", required=True, help="directory for eval/ reports")
    parser.add_argument("--batch-size", type=int, default=256, help="evaluation batch size")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _run_eval(args: argparse.Namespace) -> int:
    from .runner import run_evaluation

    result, trained_with = run_evaluation(
        checkpoint_path=args.checkpoint, data=args.data, precision=args.precision, out=args.out,
        batch_size=args.batch_size, device=args.device, progress=not args.no_progress)
    print(f"accuracy {result.accuracy:.4f}  loss {result.loss:.4f} on {result.samples} samples "
          f"(checkpoint trained with {trained_with})")
    print(f"reports: {Path(args.out) / 'eval'}/ (classification_report.txt, report.json)")
    return 0


def _num(value: float | None) -> str:
    return f"{value:.4f}" if value is not None else "n/a"


# ------------------------------------------------------------------- compare
def _lazy(module: str, name: str) -> Callable:
    """``amptrain.<module>.<name>``, imported only when the command runs (those modules
    import this one, and a plain ``amptrain train`` should not pay for them)."""
    def call(*args: Any) -> Any:
        import importlib

        return getattr(importlib.import_module(f"amptrain.{module}"), name)(*args)
    return call


#: name -> (help, add_arguments, run). Other commands register here.
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None],
                          Callable[[argparse.Namespace], int]]] = {
    "train": ("train a model in one precision", _add_train, _run_train),
    "eval": ("evaluate a checkpoint", _add_eval, _run_eval),
    "compare": ("A/B study: train in several precisions, compare speed, memory and accuracy",
                _lazy("compare", "add_arguments"), _lazy("compare", "run_command")),
    "diagnose": ("find which modules overflow or underflow in fp16 and what to do about it",
                 _lazy("diagnose", "add_diagnose_args"), _lazy("diagnose", "run_diagnose")),
    "env": ("show versions, hardware and which precisions it supports",
            _lazy("env", "add_env_args"), _lazy("env", "run_env")),
}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="amptrain", description="Fast, safe and measurable mixed-precision "
                                                  "training for PyTorch.")
    parser.add_argument("--version", action="version", version=f"amptrain {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (help_text, add, run) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        add(command)
        command.set_defaults(handler=run)
    return parser


class _CurrentStderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at emit time, not the stream of the first call.

    ``main()`` may run many times in one process (tests, notebooks) with stderr swapped in
    between; a handler bound to the first stream would write to a closed file.
    """

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def configure_logging() -> None:
    """amptrain's notices go to stderr as ``amptrain: message``."""
    logger = logging.getLogger("amptrain")
    if not logger.handlers:
        handler = _CurrentStderrHandler()
        handler.setFormatter(logging.Formatter("amptrain: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def _say(text: str) -> None:
    """One line on stderr, written in one call so that the lines of several torchrun
    processes cannot interleave; ranks other than 0 say who they are."""
    rank = os.environ.get("RANK", "0") if "LOCAL_RANK" in os.environ else "0"
    who = "amptrain" if rank == "0" else f"amptrain[rank {rank}]"
    sys.stderr.write(f"{who}: {text}\n")
    sys.stderr.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``amptrain`` console script and ``python -m amptrain``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help(sys.stderr)
        return 2
    configure_logging()
    try:
        with cli_spelling():
            return args.handler(args)
    except Preempted as exc:  # not an error: the run stopped on request, with a checkpoint
        _say(f"{exc}")
        return exc.exit_code
    except AmptrainError as exc:
        _say(f"error: {exc}")
        return exc.exit_code
    except KeyboardInterrupt:
        print("amptrain: interrupted", file=sys.stderr)
        return 130
