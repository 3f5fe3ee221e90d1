"""The runnable code blocks of a Markdown page: how they are marked, found and run.

Shared by tests/test_readme.py (README.md) and tests/test_docs.py (every page of docs/).

A block marked ``<!-- runnable: GROUP -->`` on the line before its fence (an HTML comment:
GitHub and the site show nothing of it) is run, in a fresh temporary directory per page
and GROUP (its blocks in page order, so a later block reads what an earlier one wrote: the
MLflow reader reads the run trained just before it). ``bash`` blocks run under ``bash -e``;
``python`` blocks run with this interpreter, except a block whose first line is
``# NAME.py``, which is a file to save (``mydata.py``) and is written there instead.
``<!-- runnable: GROUP, slow -->`` marks a group as slow (a third-party trainer to import).
``<!-- sketch: FILE -->`` marks the lines that matter of a file that runs as a whole
(``examples/own_loop.py``): the tests check that the file is there.

Blocks left unmarked, and why they are not run:

- the output transcripts (``$ amptrain ...`` followed by what it printed) are not code;
- the long runs: the language model (1200 steps, minutes), compare studies (six training
  runs each), the GAN's train/eval/generate (the Fréchet distance trains a feature
  network), PPO runs, the Hugging Face fine-tune and its export (``tests/workflows/
  test_export.py`` trains and reloads the same ``hf/`` export), the Keras model's round
  trip (``tests/models/test_keras.py``), ``prepare`` of the whole standard library, and
  the install, lint and test commands of "Two commands" (CI runs exactly those);
- ``torchrun``/multi-node commands (several processes; tests/distributed/ runs them).

The groups are kept cheap (tens of steps of small models on sklearn's digits); the amptrain
commands they run are the real CLI (``amptrain`` on PATH, the installed entry point) and
the real library, offline.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]

FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", re.S | re.M)
MARK = re.compile(r"<!--\s*(runnable|sketch):\s*([^>]*?)\s*-->\s*$")

#: What a group imports besides amptrain's own dependencies (skipped without it).
REQUIRES = {"hf-callback": ("transformers", "accelerate"), "lightning-callback": ("lightning",),
            "mlflow": ("mlflow",)}

Groups = dict[str, tuple[bool, list[tuple[str, str]]]]


def blocks(text: str) -> list[tuple[str, str, str | None, str | None]]:
    """Every fenced block of ``text``: (language, code, marker kind, marker argument)."""
    found = []
    for match in FENCE.finditer(text):
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = MARK.search(before)
        found.append((match.group(1), match.group(2), mark.group(1) if mark else None,
                      mark.group(2) if mark else None))
    return found


def runnable_groups(text: str) -> Groups:
    """{group: (slow, [(language, code), ...])} of the blocks marked runnable, in order."""
    groups: Groups = {}
    for language, code, kind, argument in blocks(text):
        if kind != "runnable":
            continue
        assert argument, "<!-- runnable: GROUP --> names its group"
        name, *flags = [part.strip() for part in argument.split(",")]
        slow, codes = groups.get(name, (False, []))
        groups[name] = (slow or "slow" in flags, codes + [(language, code)])
    return groups


def sketches(text: str) -> list[str]:
    """The files named by ``<!-- sketch: FILE -->`` markers."""
    return [str(argument) for _, _, kind, argument in blocks(text) if kind == "sketch"]


def comments_after_continuations(text: str) -> list[str]:
    """``cmd \\   # note`` escapes the spaces, not the newline: the shell runs two commands.
    The offending lines of every shell-like block, marked or not (transcripts included)."""
    return [line for language, code, _, _ in blocks(text)
            if language in ("bash", "sh", "shell", "")
            for line in code.splitlines() if re.search(r"\\[ \t]+#", line)]


def run_group(where: str, group: str, codes: list[tuple[str, str]], tmp_path: Path) -> None:
    """Run one group's blocks in order in ``tmp_path``, as a reader pastes them."""
    for module in REQUIRES.get(group, ()):
        pytest.importorskip(module)
    amptrain = shutil.which("amptrain")
    assert amptrain is not None, "the amptrain command is installed (pip install -e .)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    # A reader's shell does not have it set: the snippet must set what it needs.
    env.pop("MLFLOW_ALLOW_FILE_STORE", None)
    for index, (language, code) in enumerate(codes):
        assert language in ("bash", "python"), f"{group}: a runnable block is bash or python"
        assert not re.search(r"^\s*\.\.\.\s*$", code, re.M), f"{group}: a '...' placeholder"
        first = code.splitlines()[0].strip()
        if language == "python" and re.fullmatch(r"# [\w.]+\.py", first):
            (tmp_path / first[2:]).write_text(code)     # a file the next block uses
            continue
        if language == "python":
            script = tmp_path / f"block_{index}.py"
            script.write_text(code)
            command = [sys.executable, str(script)]
        else:
            command = ["bash", "-e", "-c", code]
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, (f"{where} block {index} of group {group} failed "
                                      f"(exit {done.returncode}):\n{code}\n--- output:\n"
                                      f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
