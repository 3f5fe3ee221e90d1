"""``amptrain export``: an existing run's model in safetensors, Hugging Face or Keras form."""
from __future__ import annotations

import argparse

HELP = "write a checkpoint's model as safetensors, a Hugging Face directory or a .keras file"

FORMATS = ("safetensors", "hf", "keras")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The checkpoint, the format, where it goes and in which dtype."""
    parser.add_argument("--checkpoint", required=True,
                        help="checkpoint file (e.g. RUN/checkpoints/step-40.pt) or a run "
                             "directory (its last checkpoint)")
    parser.add_argument("--format", required=True, choices=FORMATS,
                        help="safetensors (every model: model.safetensors + model.json), hf "
                             "(hf: models: save_pretrained directory OUT/hf/) or keras "
                             "(keras: models: OUT/model.keras)")
    parser.add_argument("--out", help="output directory (default: RUN/export-<checkpoint>)")
    parser.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"),
                        help="weight dtype of the export (default: fp32, also for runs that "
                             "trained half weights)")


def run(args: argparse.Namespace) -> int:
    """Export and print what was written."""
    # deferred: torch loads when the command runs, not for --help
    from ..workflows.export import export_checkpoint

    out_dir, written = export_checkpoint(args.checkpoint, args.format, args.out, args.dtype)
    print(f"exported {args.format} ({args.dtype}) to {out_dir}/: "
          + ", ".join(p.name + ("/" if p.is_dir() else "") for p in written))
    return 0
