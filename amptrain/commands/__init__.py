"""The ``amptrain`` commands: each module owns one command's flags, its YAML merging and
what it prints; the library modules it drives (``runner``, ``compare``, ``diagnose``,
``env``) never import this package.

A command is a module with ``HELP`` (one line), ``add_arguments(parser)`` and
``run(args) -> exit code``, registered below under the name users type.
"""
from __future__ import annotations

import importlib
from types import ModuleType

#: command name -> module in this package. A new command is one new module plus a line here.
COMMANDS: dict[str, str] = {
    "train": "train",
    "eval": "evaluate",
    "compare": "compare",
    "diagnose": "diagnose",
    "plan": "plan",
    "env": "env",
    "generate": "generate",
    "export": "export",
    "prepare": "prepare",
    "audit": "audit",
}


def load(name: str) -> ModuleType:
    """The module of command ``name``."""
    return importlib.import_module(f"{__name__}.{COMMANDS[name]}")
