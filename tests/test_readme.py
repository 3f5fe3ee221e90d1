"""README.md: the code blocks a reader pastes run as pasted.

A block marked ``<!-- runnable: GROUP -->`` on the line before its fence (an HTML comment:
GitHub shows nothing of it) is run by this test, in a fresh temporary directory per GROUP
(its blocks in README order, so a later block reads what an earlier one wrote: the MLflow
reader reads the run trained just before it). ``bash`` blocks run under ``bash -e``;
``python`` blocks run with this interpreter, except a block whose first line is
``# NAME.py``, which is a file to save (``mydata.py``) and is written there instead.
``<!-- runnable: GROUP, slow -->`` marks a group as slow (a third-party trainer to import).
``<!-- sketch: FILE -->`` marks the lines that matter of a file that runs as a whole
(``examples/own_loop.py``): the test checks that the file is there.

Blocks left unmarked, and why they are not run here:

- the output transcripts (``$ amptrain ...`` followed by what it printed) are not code;
- the tour's long runs: the language model (1200 steps, minutes), compare studies (six
  training runs each), the GAN's train/eval/generate (the Fréchet distance trains a feature
  network), the Hugging Face fine-tune and its export (``tests/test_export.py`` trains and
  reloads the same ``hf/`` export), the Keras model's round trip (``tests/models/
  test_keras.py``), ``prepare`` of the whole standard library, and the install, lint and
  test commands of "Two commands" (CI runs exactly those);
- ``torchrun``/multi-node commands (several processes; tests/distributed/ runs them).

The groups are kept cheap (tens of steps of small models on sklearn's digits); the
amptrain commands they run are the real CLI (``amptrain`` on PATH, the installed entry
point) and the real library, offline.
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
README = ROOT / "README.md"

FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", re.S | re.M)
MARK = re.compile(r"<!--\s*(runnable|sketch):\s*([^>]*?)\s*-->\s*$")


def blocks(text: str) -> list[tuple[str, str, str | None, str | None]]:
    """Every fenced block of ``text``: (language, code, marker kind, marker argument)."""
    found = []
    for match in FENCE.finditer(text):
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = MARK.search(before)
        found.append((match.group(1), match.group(2), mark.group(1) if mark else None,
                      mark.group(2) if mark else None))
    return found


def runnable_groups(text: str) -> dict[str, tuple[bool, list[tuple[str, str]]]]:
    """{group: (slow, [(language, code), ...])} of the blocks marked runnable, in order."""
    groups: dict[str, tuple[bool, list[tuple[str, str]]]] = {}
    for language, code, kind, argument in blocks(text):
        if kind != "runnable":
            continue
        assert argument, "<!-- runnable: GROUP --> names its group"
        name, *flags = [part.strip() for part in argument.split(",")]
        slow, codes = groups.get(name, (False, []))
        groups[name] = (slow or "slow" in flags, codes + [(language, code)])
    return groups


GROUPS = runnable_groups(README.read_text())


def _cases():
    for name, (slow, _) in GROUPS.items():
        yield pytest.param(name, id=name, marks=[pytest.mark.slow] if slow else [])


def test_the_readme_has_runnable_groups():
    """The marker is found (a renamed marker must not silently run nothing)."""
    assert {"trainer", "mlflow", "imagefolder", "module-data", "stream", "training-step",
            "hf-callback", "lightning-callback"} <= set(GROUPS)


@pytest.mark.parametrize("group", _cases())
def test_runnable_blocks_run_as_pasted(group, tmp_path):
    _, codes = GROUPS[group]
    if group == "hf-callback":
        pytest.importorskip("transformers")
        pytest.importorskip("accelerate")
    if group == "lightning-callback":
        pytest.importorskip("lightning")
    if group == "mlflow":
        pytest.importorskip("mlflow")
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
        assert done.returncode == 0, (f"README block {index} of group {group} failed "
                                      f"(exit {done.returncode}):\n{code}\n--- output:\n"
                                      f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def test_sketches_name_files_that_exist():
    sketches = [argument for _, _, kind, argument in blocks(README.read_text())
                if kind == "sketch"]
    assert sketches
    for path in sketches:
        assert (ROOT / str(path)).is_file(), f"<!-- sketch: {path} --> names a missing file"


def test_no_shell_block_has_a_comment_after_a_line_continuation():
    """``cmd \\   # note`` escapes the spaces, not the newline: the shell runs two
    commands. Checked in every shell-like block, marked or not (transcripts included)."""
    for language, code, _, _ in blocks(README.read_text()):
        if language in ("bash", "sh", "shell", ""):
            for line in code.splitlines():
                assert not re.search(r"\\[ \t]+#", line), f"comment after a '\\': {line}"


def test_block_extraction_reads_markers_groups_and_files():
    """The parser on a small document: what is marked, grouped and saved."""
    text = ("intro\n\n<!-- runnable: g -->\n```python\n# mod.py\nX = 1\n```\n\n"
            "<!-- runnable: g, slow -->\n```bash\necho hi\n```\n\n```\n$ echo out\nout\n```\n"
            "<!-- sketch: examples/own_loop.py -->\n```python\nprec.step(opt)\n```\n")
    found = blocks(text)
    assert [(lang, kind, arg) for lang, _, kind, arg in found] == [
        ("python", "runnable", "g"), ("bash", "runnable", "g, slow"), ("", None, None),
        ("python", "sketch", "examples/own_loop.py")]
    assert runnable_groups(text) == {"g": (True, [("python", "# mod.py\nX = 1\n"),
                                                  ("bash", "echo hi\n")])}
