"""Installed by ``amptrain audit -- COMMAND``: the folder holding this file is put first on
the PYTHONPATH of the audited command, so that every Python process it starts runs this at
start-up. It first runs the ``sitecustomize`` it shadows (if any), then starts the audit
when ``AMPTRAIN_AUDIT_DIR`` is set."""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys


def _chain() -> None:
    """Run the sitecustomize that this one shadows, as Python would have without it."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["_amptrain_shadowed_sitecustomize"] = module
    spec.loader.exec_module(module)


def _start() -> None:
    if not os.environ.get("AMPTRAIN_AUDIT_DIR"):
        return
    if importlib.util.find_spec("torch") is None:
        return  # a Python of the command without torch (a tool, another venv): nothing to watch
    from amptrain.audit.launch import start_in_child  # deferred: only in audited processes
    start_in_child()


_chain()
_start()
