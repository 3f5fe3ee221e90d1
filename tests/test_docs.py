"""The documentation site (docs/, mkdocs.yml): its snippets run and it builds strictly.

Every page's blocks marked ``<!-- runnable: GROUP -->`` run as pasted, one temporary
directory per page and group (tests/snippets.py says how blocks are marked and which are
not run). A group that a page shares with the README, block for block (the tour's Trainer
example), runs once, in tests/test_readme.py; here it is only held equal to the README's.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.snippets import (ROOT, blocks, comments_after_continuations, run_group, runnable_groups,
                            sketches)

DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
README_GROUPS = runnable_groups((ROOT / "README.md").read_text())


def _page(path):
    return path.relative_to(DOCS).as_posix()


GROUPS = {(_page(path), name): group for path in PAGES
          for name, group in runnable_groups(path.read_text()).items()}
SHARED = {key for key, group in GROUPS.items() if README_GROUPS.get(key[1]) == group}


def _cases():
    for (page, name), (slow, _) in GROUPS.items():
        if (page, name) not in SHARED:
            yield pytest.param(page, name, id=f"{page}:{name}",
                               marks=[pytest.mark.slow] if slow else [])


def test_the_pages_have_their_runnable_groups():
    """The markers are found (a renamed marker or a moved block must not run nothing)."""
    assert {("tour.md", "trainer"), ("export.md", "mlflow"), ("own-data.md", "imagefolder"),
            ("own-data.md", "module-data"), ("own-data.md", "stream"),
            ("own-data.md", "training-step"), ("migration.md", "hf-callback"),
            ("migration.md", "lightning-callback"), ("data-models.md", "module-model"),
            ("data-models.md", "idx")} <= set(GROUPS)


def test_a_group_shared_with_the_readme_is_the_same_code():
    """Run once (in test_readme.py), so the two copies must not drift apart."""
    assert ("tour.md", "trainer") in SHARED
    for page, name in GROUPS:
        if name in README_GROUPS:
            assert (page, name) in SHARED, f"{page}: group {name} differs from the README's"


@pytest.mark.parametrize("page, group", _cases())
def test_runnable_blocks_run_as_pasted(page, group, tmp_path):
    run_group(f"docs/{page}", group, GROUPS[(page, group)][1], tmp_path)


def test_sketches_name_files_that_exist():
    found = [path for page in PAGES for path in sketches(page.read_text())]
    assert len(found) >= 2          # the tour's own loop, the GAN's loop
    for path in found:
        assert (ROOT / path).is_file(), f"<!-- sketch: {path} --> names a missing file"


def test_no_shell_block_has_a_comment_after_a_line_continuation():
    for page in PAGES:
        assert comments_after_continuations(page.read_text()) == [], _page(page)


def test_the_install_page_gives_the_readmes_two_commands():
    """docs/install.md repeats the README's two commands word for word."""
    def commands(text):
        return [line for language, code, _, _ in blocks(text) if language == "bash"
                for line in code.splitlines() if line.startswith("python3 -m pip install")]
    readme = commands((ROOT / "README.md").read_text())
    assert len(readme) == 2 and commands((DOCS / "install.md").read_text())[:2] == readme


def test_every_page_is_in_the_nav():
    """mkdocs warns about a page left out of the nav; strict mode makes that an error."""
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in PAGES:
        assert f" {_page(page)}" in nav, f"docs/{_page(page)} is not in mkdocs.yml's nav"


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path):
    """Every link, anchor and API reference resolves (``mkdocs build --strict``)."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings_handlers.python")
    # Not -q: strict mode counts the warnings it logs, and -q would silence them.
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "-d", str(tmp_path / "site")], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "site" / "api" / "trainer" / "index.html").is_file()
