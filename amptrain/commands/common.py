"""What several commands share: config flags generated from the config dataclasses,
``--config`` YAML merged under the flags, and default output directories."""
from __future__ import annotations

import argparse
import dataclasses
import re
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..config import (RESOLVED_ONLY_KEYS, RunConfig, build_config, cli_flag, config_fields,
                      load_yaml)
from ..common.options import is_default


def add_config_flags(parser: argparse.ArgumentParser, cls: type = RunConfig,
                     only: Sequence[str] | None = None) -> None:
    """Add one flag per config field; defaults are suppressed so only given flags appear."""
    groups: dict[str, Any] = {}
    for name, f in config_fields(cls).items():
        if only is not None and name not in only:
            continue
        meta = f.metadata
        group_name = meta.get("group", "training")
        group = groups.get(group_name) or groups.setdefault(
            group_name, parser.add_argument_group(f"{group_name} options"))
        default = f.default if f.default is not dataclasses.MISSING else None
        help_text = meta.get("help", "")
        if meta.get("choices") and meta.get("open_choices"):  # aliases are taken too
            help_text += f" (one of: {', '.join(meta['choices'])})"
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
            if meta.get("choices") and not meta.get("open_choices"):
                kwargs["choices"] = meta["choices"]
            else:
                kwargs["metavar"] = name.upper()
        group.add_argument(cli_flag(name), dest=name, **kwargs)


def merged_values(args: argparse.Namespace, *classes: type) -> dict[str, Any]:
    """YAML from --config, overridden by the flags that were given: the one place where
    the two meet. ``classes`` (default :class:`RunConfig`) say which flags are options.

    The keys of the result are exactly the options the user gave (flags are parsed with
    their defaults suppressed): :func:`~amptrain.common.options.build_config` carries
    them on the config as ``config.given``. A YAML key no class knows is kept for the
    caller to refuse by name.

    A run's own config.yaml read back (it holds the :data:`RESOLVED_ONLY_KEYS`) names
    every option, as amptrain wrote it: its options at their defaults are left out, so
    they build the same config without counting as given."""
    classes = classes or (RunConfig,)
    values: dict[str, Any] = load_yaml(args.config, keep_resolved=True) \
        if getattr(args, "config", None) else {}
    if RESOLVED_ONLY_KEYS & set(values):
        values = {k: v for k, v in values.items() if k not in RESOLVED_ONLY_KEYS
                  and not any(is_default(cls, k, v) for cls in classes)}
    names = {name for cls in classes for name in config_fields(cls)}
    for name, value in vars(args).items():
        if name in names:
            values[name] = value
    return values


def config_from_args(args: argparse.Namespace, cls: type = RunConfig) -> Any:
    """The validated config of a command's --config YAML and flags."""
    return build_config(cls, merged_values(args, cls), source="option")


def default_out(config: RunConfig, prefix: str = "") -> str:
    """runs/<prefix><time>-<model>-<data>, with path characters made safe."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{config.model}-{config.data}").strip("_")[:60]
    return str(Path("runs") / f"{prefix}{stamp}-{safe}")


def with_out(config: RunConfig, prefix: str = "") -> RunConfig:
    """``config`` with its output directory decided: --out, else :func:`default_out`
    (decided here, once, before a launch: every torchrun process gets the same)."""
    return config if config.out else config.with_options(out=default_out(config, prefix))


def command_line() -> str | None:
    """The command as the user typed it (for reports), when run as ``amptrain``."""
    if Path(sys.argv[0]).name not in ("amptrain", "__main__.py"):
        return None
    return "amptrain " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def number(value: float | None) -> str:
    """A metric for a summary line: 4 decimals, or n/a."""
    return f"{value:.4f}" if value is not None else "n/a"
