"""The house's figures (issue 43), measured from the code: how deep a plain ``amptrain
train`` step is, how big the Task protocol is, how many of amptrain's own imports hide in
functions.

    python benchmarks/house_figures.py

Counts, not timings: they are the same on every machine.
"""
from __future__ import annotations

import ast
import inspect
import sys
import tempfile
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing amptrain
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

PACKAGE = ROOT / "amptrain"


def frames_to_optimizer_step(argv: list[str]) -> list[str]:
    """amptrain's own frames from ``cli.main`` to the first ``optimizer.step`` of a run."""
    from amptrain import cli

    seen: list[list[str]] = []
    original = torch.optim.Optimizer.step if hasattr(torch.optim.Optimizer, "step") else None
    classes = {torch.optim.AdamW, torch.optim.SGD, torch.optim.Adam}
    saved = {cls: cls.step for cls in classes}

    def recording(step):
        def wrapped(self, *args, **kwargs):
            if not seen:
                seen.append([f"{Path(f.filename).relative_to(ROOT)}:{f.name}"
                             for f in traceback.extract_stack()[:-1]
                             if Path(f.filename).is_relative_to(PACKAGE)])
            return step(self, *args, **kwargs)
        return wrapped

    for cls in classes:
        cls.step = recording(saved[cls])
    try:
        with tempfile.TemporaryDirectory() as out:
            cli.main([*argv, "--out", f"{out}/run", "--no-progress"])
    finally:
        for cls in classes:
            cls.step = saved[cls]
    del original
    return seen[0]


def members(cls: type, leave_out: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """A class's own public methods and attributes (its annotated fields too)."""
    methods, attributes = [], []
    for name, value in vars(cls).items():
        if name.startswith("_") or name in leave_out:
            continue
        (methods if inspect.isfunction(value) or isinstance(value, (property, staticmethod,
                                                                      classmethod))
         else attributes).append(name)
    attributes += [n for n in getattr(cls, "__annotations__", {}) if not n.startswith("_")
                   and n not in attributes and n not in methods and n not in leave_out]
    return methods, attributes


def task_members() -> tuple[list[str], list[str]]:
    """The core Task protocol's public methods and attributes (tasks/base.py), without the
    optional parts it declares (:func:`part_members`)."""
    from amptrain.tasks.base import PARTS, Task

    return members(Task, leave_out=tuple(PARTS))


def part_members() -> dict[str, tuple[list[str], list[str]]]:
    """Each optional part's public methods and attributes, by the Task attribute naming it."""
    from amptrain.tasks.base import PARTS

    return {name: members(kind) for name, kind in PARTS.items()}


def in_function_imports() -> list[str]:
    """Imports of amptrain's own modules made inside a function body."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(func):
                if isinstance(node, ast.ImportFrom) and (node.level > 0 or (
                        node.module or "").startswith("amptrain")):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
                elif isinstance(node, ast.Import) and any(
                        a.name.startswith("amptrain") for a in node.names):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return sorted(set(found))


def main() -> None:
    frames = frames_to_optimizer_step(["train", "--model", "mlp", "--max-steps", "1",
                                       "--precision", "32-true"])
    print(f"frames from cli.main to optimizer.step (amptrain train, 32-true): {len(frames)}")
    for frame in frames:
        print(f"  {frame}")
    methods, attributes = task_members()
    print(f"Task (core protocol): {len(methods)} methods, {len(attributes)} attributes "
          f"({', '.join(attributes + methods)})")
    parts = part_members()
    print(f"Task parts: {len(parts)}")
    for name, (part_methods, part_attributes) in parts.items():
        print(f"  {name}: {len(part_methods)} methods, {len(part_attributes)} attributes "
              f"({', '.join(part_attributes + part_methods)})")
    imports = in_function_imports()
    print(f"in-function imports of amptrain's own modules: {len(imports)}")


if __name__ == "__main__":
    main()
