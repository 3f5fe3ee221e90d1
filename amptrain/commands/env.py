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
    parser.add_argument("--precision", default=None, metavar="plan:FILE",
                        help="also say which formats of this precision plan run natively "
                             "here and which are emulated")


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
    if args.precision is not None:
        info["precision_plan"] = plan_formats(args.precision)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    text = format_env(info)
    if args.precision is not None:
        text += "\n" + "\n".join(
            [f"precision plan {info['precision_plan']['plan']}:"]
            + [f"  {fmt}: {'native' if native else 'emulated'}"
               for fmt, native in info["precision_plan"]["formats"].items()])
    print(text)
    return 0


def plan_formats(name: str) -> dict[str, object]:
    """``{"plan": FILE, "formats": {format: native here}}`` of ``--precision plan:FILE``."""
    # deferred: torch loads when the command runs, not for --help
    from ..common.choices import PLAN_PREFIX
    from ..precision.precision_plan import native_formats
    from ..precision.resolve import resolve_precision

    if not str(name).startswith(PLAN_PREFIX):
        raise UserError(f"env --precision takes a precision plan, plan:FILE (got {name!r}); "
                        f"every mode's support is in the table already")
    resolved = resolve_precision(name)
    assert resolved.plan is not None  # a plan:FILE name resolves to its plan
    return {"plan": resolved.plan.source,
            "formats": native_formats(resolved.plan, resolved.device)}
