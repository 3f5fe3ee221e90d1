"""The YAML files of options: reading a ``--config`` file (bounded, safe, typed as the flags
are) and writing a run's resolved config.yaml (whole or not at all)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from .errors import UserError
from .pathkind import not_regular_reason, write_failure

#: Keys that ``Trainer.resolved_config()`` writes to config.yaml but that are not options.
RESOLVED_ONLY_KEYS = frozenset({"world_size", "lr_schedule", "micro_batch_search", "oom_events"})


def load_yaml(path: str | Path, *, keep_resolved: bool = False) -> dict[str, Any]:
    """Read a --config YAML file into a dict with underscore keys (``keep_resolved``: with
    the :data:`RESOLVED_ONLY_KEYS` of a run's config.yaml, which are not options)."""
    path = Path(path)
    special = not_regular_reason(path)
    if special:  # reading a FIFO blocks, /dev/zero never ends
        raise UserError(f"--config {special}; give the YAML file")
    if path.is_dir():
        raise UserError(f"--config {path} is a directory; give the YAML file")
    if not path.is_file():
        raise UserError(f"--config {path}: no such file")
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise UserError(f"--config {path} is {size} bytes, over the limit of "
                        f"{MAX_CONFIG_BYTES} for a file of option: value lines")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"--config {path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise UserError(f"--config {path}: cannot read it ({exc.strerror})") from None
    try:
        raw = _bounded_yaml(text, path)
    except RecursionError:
        raise UserError(f"--config {path}: nested too deeply to be a config; write "
                        f"option: value lines") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise UserError(f"--config {path}: not valid YAML{where}") from None
    if raw is None:
        raise UserError(f"--config {path}: the file is empty; write one option: value per line")
    if not isinstance(raw, dict):
        raise UserError(f"--config {path}: expected a mapping of option: value "
                        f"(got a YAML {type(raw).__name__})")
    values = {str(k).replace("-", "_"): v for k, v in raw.items()}
    # A run's resolved config.yaml also records facts that are not options; reading it
    # back as --config must work, so those are dropped here.
    return values if keep_resolved else \
        {k: v for k, v in values.items() if k not in RESOLVED_ONLY_KEYS}


#: A --config file is a few option lines: larger files and YAML whose aliases expand to
#: more values than this (a "billion laughs" file of 341 bytes expands to 10^9) are
#: refused before anything is built from them.
MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_VALUES = 10_000


_INT_TAG, _FLOAT_TAG, _STR_TAG = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float",
                                  "tag:yaml.org,2002:str")


def _scalars(node: yaml.Node) -> list[yaml.ScalarNode]:
    """Every scalar node under ``node`` (each once; aliases are the same node)."""
    seen: set[int] = set()
    found: list[yaml.ScalarNode] = []
    stack = [node]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if isinstance(n, yaml.ScalarNode):
            found.append(n)
        elif isinstance(n, yaml.SequenceNode):
            stack.extend(n.value)
        elif isinstance(n, yaml.MappingNode):
            stack.extend(c for pair in n.value for c in pair)
    return found


def _bounded_yaml(text: str, path: Path) -> Any:
    """``yaml.safe_load(text)``, refusing a document whose aliases expand past
    :data:`MAX_CONFIG_VALUES` values (counted on the composed nodes, before any is built)."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        sizes: dict[int, int] = {}

        def expanded(n: yaml.Node) -> int:  # an alias is the same node object again
            if id(n) not in sizes:
                sizes[id(n)] = 1  # a recursive alias counts once, not forever
                children = n.value if isinstance(n, yaml.SequenceNode) else \
                    [c for pair in n.value for c in pair] \
                    if isinstance(n, yaml.MappingNode) else []
                total = 1
                for child in children:
                    total += expanded(child)
                    if total > MAX_CONFIG_VALUES:
                        break
                sizes[id(n)] = total
            return sizes[id(n)]

        if expanded(node) > MAX_CONFIG_VALUES:
            raise UserError(f"--config {path}: its YAML aliases expand to more than "
                            f"{MAX_CONFIG_VALUES} values; write the options out as "
                            f"option: value lines")
        for n in _scalars(node):
            # YAML 1.1 reads 1:00 as 60 (base 60); a flag never does: the text goes to
            # the option's own coercion, which refuses it as the flag would.
            if n.tag in (_INT_TAG, _FLOAT_TAG) and ":" in str(n.value):
                n.tag = _STR_TAG
        return loader.construct_document(node)
    finally:
        loader.dispose()


def write_yaml(data: dict[str, Any], path: str | Path) -> None:
    """Write a resolved config as YAML, keys in field order: whole or not at all (a full
    disk is one line naming the file and the disk, and leaves no empty file behind)."""

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(yaml.safe_dump(data, sort_keys=False))
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise UserError(f"{write_failure(path, exc)}; free space there (or choose another "
                        f"directory) and run the command again") from None
