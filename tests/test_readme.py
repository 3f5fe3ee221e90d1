"""README.md, the landing page: the code blocks a reader pastes run as pasted.

How blocks are marked and run: tests/snippets.py. The pages of docs/ are run by
tests/test_docs.py the same way.
"""
from __future__ import annotations

import re

import pytest

from tests.snippets import (ROOT, blocks, comments_after_continuations, run_group,
                            runnable_groups, sketches)

README = ROOT / "README.md"
GROUPS = runnable_groups(README.read_text())


def _cases():
    for name, (slow, _) in GROUPS.items():
        yield pytest.param(name, id=name, marks=[pytest.mark.slow] if slow else [])


def test_the_readme_has_runnable_groups():
    """The marker is found (a renamed marker must not silently run nothing)."""
    assert {"trainer"} <= set(GROUPS)


@pytest.mark.parametrize("group", _cases())
def test_runnable_blocks_run_as_pasted(group, tmp_path):
    run_group("README", group, GROUPS[group][1], tmp_path)


def test_sketches_name_files_that_exist():
    found = sketches(README.read_text())
    assert found
    for path in found:
        assert (ROOT / path).is_file(), f"<!-- sketch: {path} --> names a missing file"


def test_no_shell_block_has_a_comment_after_a_line_continuation():
    assert comments_after_continuations(README.read_text()) == []


def test_the_two_commands_are_the_ci_script():
    """The second command is what .ci/run runs, word for word."""
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1].replace(" -q ", " ")
    commands = [code for language, code, _, _ in blocks(README.read_text())
                if language == "bash" and "ruff check" in code]
    assert commands and ci in commands[0].splitlines()


def test_the_readme_is_a_landing_page():
    """The manual lives in docs/; the README stays short and links into it."""
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    for page in ("docs/install.md", "docs/tour.md", "docs/precisions.md", "docs/limits.md"):
        assert f"]({page})" in text


def test_every_relative_link_names_a_file():
    """The README is not part of the site (mkdocs checks the pages' links, not its own)."""
    targets = re.findall(r"\]\(([^)#\s]+)[^)]*\)", README.read_text())
    relative = [target for target in targets if "://" not in target]
    assert relative
    for target in relative:
        assert (ROOT / target).exists(), f"README links to {target}, which is not there"


def test_block_extraction_reads_markers_groups_and_files():
    """The parser on a small document: what is marked, grouped and saved."""
    text = ("intro\n\n<!-- runnable: g -->\n```python\n# mod.py\nX = 1\n```\n\n"
            "<!-- runnable: g, slow -->\n```bash\necho hi\n```\n\n```\n$ echo out\nout\n```\n"
            "<!-- sketch: examples/own_loop.py -->\n```python\nprec.step(opt)\n```\n"
            "```bash\ncmd \\  # note\n```\n")
    found = blocks(text)
    assert [(lang, kind, arg) for lang, _, kind, arg in found] == [
        ("python", "runnable", "g"), ("bash", "runnable", "g, slow"), ("", None, None),
        ("python", "sketch", "examples/own_loop.py"), ("bash", None, None)]
    assert runnable_groups(text) == {"g": (True, [("python", "# mod.py\nX = 1\n"),
                                                  ("bash", "echo hi\n")])}
    assert sketches(text) == ["examples/own_loop.py"]
    assert comments_after_continuations(text) == ["cmd \\  # note"]
