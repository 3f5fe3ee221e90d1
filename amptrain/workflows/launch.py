"""``amptrain train --nproc-per-node N``: start torchrun's elastic launcher from amptrain.

The launcher flags are not training options (they are no :class:`RunConfig` fields):
they become torchrun's own arguments, and every worker runs ``python -m amptrain train``
with the resolved training options, exactly as
``torchrun --nproc-per-node N -m amptrain train ...`` would. A worker that torchrun
restarts after a failure (``--max-restarts``) continues from the run's last checkpoint.
"""
from __future__ import annotations

import argparse
import logging
import os
import shlex
import signal
import sys

from ..config import RunConfig, cli_flag, replace_options, to_dict
from ..common.errors import UserError

log = logging.getLogger("amptrain")

#: (flag, type, metavar, help). Defaults are None so that "given" is visible.
LAUNCH_FLAGS = (
    ("--nproc-per-node", int, "N", "start N training processes on this machine (one per GPU) "
                               "through torchrun's launcher"),
    ("--nnodes", int, "K", "number of machines taking part (default: 1)"),
    ("--node-rank", int, "R", "this machine's rank among --nnodes (0 .. K-1; default: 0)"),
    ("--master-addr", str, "ADDR", "address of the machine with --node-rank 0 (needed with "
                                   "--nnodes > 1)"),
    ("--master-port", int, "PORT", "free TCP port on the --master-addr machine (default: a free "
                                   "port on one machine, 29500 on several)"),
    ("--max-restarts", int, "M", "restart all processes up to M times after a failure; they resume "
                            "from the last checkpoint (default: 0)"),
)


def add_launch_flags(parser: argparse.ArgumentParser) -> None:
    """The launcher options of ``amptrain train``."""
    group = parser.add_argument_group("launcher options (multi-process runs through torchrun)")
    for name, kind, metavar, help_text in LAUNCH_FLAGS:
        group.add_argument(name, type=kind, default=None, help=help_text, metavar=metavar)


def launch_requested(args: argparse.Namespace) -> bool:
    """True when the command line asks amptrain to start torchrun itself."""
    given = [name for name, _, _, _ in LAUNCH_FLAGS
             if getattr(args, _dest(name), None) is not None]
    if not given:
        return False
    # deferred: torch loads only when a launch is asked for (`train --help` stays instant)
    from ..distributed import LaunchEnv

    if LaunchEnv.from_environ() is not None:
        raise UserError(f"{given[0]} starts torchrun, but this process was already started by "
                        f"torchrun: drop the launcher flags ({', '.join(given)})")
    if getattr(args, "nproc_per_node", None) is None:
        raise UserError(f"{given[0]} needs --nproc-per-node N (processes per machine)")
    return True


def torchrun_args(args: argparse.Namespace, config: RunConfig) -> list[str]:
    """torchrun's argument list: launcher flags, then ``-m amptrain train`` and the config."""
    nproc = args.nproc_per_node
    nnodes = args.nnodes if args.nnodes is not None else 1
    node_rank = args.node_rank if args.node_rank is not None else 0
    if nproc < 1:
        raise UserError(f"--nproc-per-node must be >= 1 (got {nproc})")
    if nnodes < 1:
        raise UserError(f"--nnodes must be >= 1 (got {nnodes})")
    if not 0 <= node_rank < nnodes:
        raise UserError(f"--node-rank must be between 0 and --nnodes - 1 = {nnodes - 1} "
                        f"(got {node_rank})")
    if nnodes > 1 and not args.master_addr:
        raise UserError(f"--nnodes {nnodes} needs --master-addr (the address of the machine "
                        f"started with --node-rank 0)")
    if args.master_port is not None and not 1 <= args.master_port <= 65535:
        raise UserError(f"--master-port must be a TCP port from 1 to 65535 "
                        f"(got {args.master_port})")
    if args.max_restarts is not None and args.max_restarts < 0:
        raise UserError(f"--max-restarts must be >= 0 (got {args.max_restarts})")
    restarts = args.max_restarts or 0
    argv = ["--nproc-per-node", str(nproc), "--nnodes", str(nnodes),
            "--max-restarts", str(restarts)]
    fixed_port = nnodes > 1 or args.master_port is not None
    if restarts:
        # The static rendezvous keeps one store for all attempts, so restarted workers
        # would read their predecessors' (dead) addresses; c10d with a fresh store per
        # attempt (see launch()) restarts cleanly. Machines get their ranks as they join.
        endpoint = f"{args.master_addr or '127.0.0.1'}:{args.master_port or 29500}" \
            if fixed_port else "localhost:0"
        argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "amptrain"]
    elif fixed_port:  # classic torchrun: static rendezvous at master-addr:master-port
        argv += ["--node-rank", str(node_rank), "--master-addr", args.master_addr or "127.0.0.1",
                 "--master-port", str(args.master_port or 29500)]
    # else one machine: torchrun picks a free port itself (c10d on localhost:0).
    return argv + ["-m", "amptrain", "train", *config_args(config)]


def config_args(config: RunConfig) -> list[str]:
    """Flags that rebuild ``config`` (fields that differ from their defaults, --out, and
    every option the user gave: each process carries the same ``config.given``)."""
    argv: list[str] = []
    defaults = to_dict(type(config)())
    for name, value in to_dict(config).items():
        if value == defaults[name] and name != "out" and name not in config.given:
            continue
        if isinstance(value, bool):
            argv += [cli_flag(name)] if value else []
        elif isinstance(value, list):
            for item in value:
                argv.append(f"{cli_flag(name)}={item}")  # '=': a value may start with '-'
        elif value is not None:
            argv.append(f"{cli_flag(name)}={value}")
    return argv


def launch(args: argparse.Namespace, config: RunConfig) -> int:
    """Run torchrun's elastic launcher in this process; the workers' exit status is ours."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    argv = torchrun_args(args, config)
    if args.max_restarts:
        # torch 2.13 shares the rendezvous store with the workers and keeps it across
        # restarts: stale keys break the restarted process group (pytorch#135712).
        os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    log.info("launching: torchrun %s", shlex.join(argv))
    try:
        run(parse_args(argv))
    except ChildFailedError as failed:
        # The survivors of a failure are SIGTERMed by torchrun: report the one that failed.
        rank, failure = min(failed.failures.items(), key=lambda item: (
            item[1].exitcode == -signal.SIGTERM, item[1].timestamp, item[0]))
        code = failure.exitcode if failure.exitcode and failure.exitcode > 0 else 1
        how = f"exit code {failure.exitcode}" if failure.exitcode >= 0 \
            else f"signal {-failure.exitcode}"
        print(f"amptrain: error: training process rank {rank} failed ({how}); its message is "
              f"above", file=sys.stderr, flush=True)
        return code
    return 0


def resume_after_restart(config: RunConfig) -> RunConfig:
    """A worker that torchrun restarted continues from the last checkpoint in --out."""
    from ..distributed import LaunchEnv  # deferred: this module serves `train --help`

    env = LaunchEnv.from_environ()
    if env is None or env.restart_count == 0 or config.checkpointing.resume:
        return config
    log.info("restart %d: resuming from the last checkpoint in %s", env.restart_count, config.out)
    return replace_options(config, resume="auto")


def _dest(name: str) -> str:
    return name.lstrip("-").replace("-", "_")
