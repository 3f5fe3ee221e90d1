"""``amptrain audit -- COMMAND``: run the user's command as a real subprocess under
observation, and gather what its processes found.

The parent puts ``site/`` (a ``sitecustomize.py``) first on the command's PYTHONPATH, with
``AMPTRAIN_AUDIT_DIR`` naming a fresh folder. Each Python process of the command (the
script, every torchrun rank) then installs the observer at start-up and, at exit, writes
``findings-<pid>.json`` there. ``AMPTRAIN_AUDIT_STEPS=N`` ends a process cleanly (exit 0)
after N optimizer steps.
"""
from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..common.errors import UserError
from .findings import AuditReport

SITE = Path(__file__).resolve().parent / "site"
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
DIR_ENV, STEPS_ENV = "AMPTRAIN_AUDIT_DIR", "AMPTRAIN_AUDIT_STEPS"


class _Stopped(SystemExit):
    """Ends an audited process after ``--steps`` optimizer steps (exit status 0)."""


def start_in_child() -> None:
    """Install the observer in this process; write its findings when the process ends."""
    from .library import make_observer  # deferred: torch, imported in the audited process only

    folder = Path(os.environ[DIR_ENV])
    steps = int(os.environ[STEPS_ENV]) if os.environ.get(STEPS_ENV) else None
    state = {"stopped": False}

    def stop() -> None:
        state["stopped"] = True
        raise _Stopped(0)

    watching = make_observer(steps=steps, on_limit=stop).install()

    def write() -> None:
        report = watching.close()
        data = {**report.to_json(), "stopped": state["stopped"], "pid": os.getpid()}
        (folder / f"findings-{os.getpid()}.json").write_text(json.dumps(data))

    atexit.register(write)


@dataclass
class Audited:
    """What one audited command did: the findings of all its processes, its exit status,
    and whether the audit ended it after ``--steps``."""

    report: AuditReport
    returncode: int
    stopped: bool


def run_audited(command: list[str], steps: int | None = None) -> Audited:
    """Run ``command`` (inheriting stdin/stdout/stderr) under observation."""
    if not command:
        raise UserError("amptrain audit needs a command after `--` (e.g. `amptrain audit -- "
                        "python train.py`) or a run directory")
    with tempfile.TemporaryDirectory(prefix="amptrain-audit-") as folder:
        paths = [str(SITE), os.environ.get("PYTHONPATH", ""), str(PACKAGE_ROOT)]
        env = {**os.environ, DIR_ENV: folder,
               "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
        if steps is not None:
            env[STEPS_ENV] = str(steps)
        else:
            env.pop(STEPS_ENV, None)
        try:
            done = subprocess.run(command, env=env, check=False)
        except FileNotFoundError:
            raise UserError(f"amptrain audit: no such command: {command[0]!r}") from None
        except PermissionError:
            raise UserError(f"amptrain audit: cannot run {command[0]!r} "
                            "(permission denied)") from None
        return gather(Path(folder), done.returncode)


def gather(folder: Path, returncode: int) -> Audited:
    """Merge the ``findings-*.json`` of ``folder``: every finding once; the steps of the
    process that stepped most (each rank counts its own)."""
    report, stopped = AuditReport(), False
    for path in sorted(folder.glob("findings-*.json")):
        data = json.loads(path.read_text())
        part = AuditReport.from_json(data)
        report.extend(part.findings)
        report.steps = max(report.steps, part.steps)
        stopped = stopped or bool(data.get("stopped"))
    return Audited(report, returncode, stopped)


def exit_status(returncode: int) -> int:
    """A subprocess's return code as a shell would pass it on (128 + N for signal N)."""
    return 128 - returncode if returncode < 0 else returncode


def describe_exit(returncode: int) -> str:
    """``exited with status 3`` / ``was killed by SIGKILL``."""
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


__all__ = ["Audited", "describe_exit", "exit_status", "gather", "run_audited", "start_in_child"]
