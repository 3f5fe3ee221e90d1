"""``amptrain env``: versions, hardware and which precisions it supports."""
from __future__ import annotations

import argparse
import json

from ..common.errors import UserError

HELP = "show versions, hardware and which precisions it supports"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``amptrain env``."""
    parser.add_argument("--json", action="store_true", help="print JSON (for machines)")
    parser.add_argument("--bench", action="store_true",
                        help="also measure fp32/bf16/fp16 matmul and conv throughput here, "
                             "each as a training run computes it (emulated where this "
                             "device has no hardware for the dtype); a few seconds")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="CPU threads for --bench (default: PyTorch's choice)")


def run(args: argparse.Namespace) -> int:
    """Print the report (or JSON)."""
    import torch

    # deferred: torch loads when the command runs, not for --help
    from ..workflows.env import format_env, run_bench
    from ..precision.hardware.probe import collect_env

    info = collect_env()
    if args.threads is not None:
        if args.threads < 1:
            raise UserError(f"--threads must be an integer >= 1 (got {args.threads})")
        torch.set_num_threads(args.threads)
    if args.bench:
        info["bench"] = run_bench()
    print(json.dumps(info, indent=2) if args.json else format_env(info))
    return 0
