"""The house's tiers, kept by a test (issue 43): the package's folders in one order, each
importing only from the folders below it, and amptrain's own modules imported inside a
function only where that defers a slow or optional import, said in a comment.

:data:`TIERS` is the one declaration of the order; docs/architecture.md draws it.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "amptrain"

#: The package's folders (and root modules), top first: each imports only what is below it.
TIERS: tuple[tuple[str, ...], ...] = (
    ("__main__.py",),
    ("cli.py", "__init__.py"),    # the command line; the library's lazy face
    ("commands",),                # one module per command: flags -> a workflow
    ("integrations",),            # Hugging Face and Lightning callbacks
    ("compare",),                 # the A/B study
    ("diagnose",),                # where fp16 overflows and flushes
    ("report",),                  # compare's report files
    ("workflows",),               # what a command does, as library calls
    ("trainer",),                 # the Trainer
    ("numerics",),                # sampled per-layer telemetry, the first non-finite traced
    ("distributed",),             # strategies: none, DDP, FSDP2, DP
    ("checkpoint",),              # files, sections, resume
    ("config",),                  # the run's config, composed of its owners' sections
    ("tasks",),                   # losses, steps, metrics, verdicts
    ("data",),                    # data sources
    ("models",),                  # built-in and external models
    ("audit",),                   # the audit of a loop for precision traps
    ("precision",),               # the precision layer and hardware knowledge
    ("loggers",),                 # experiment trackers
    ("common", "version.py"),     # the ground floor
)
RANK = {name: rank for rank, names in enumerate(TIERS) for name in names}
#: What an in-function import's comment says to be allowed (see the module docstring).
DEFERRED = "defer"


def _unit(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0]


def _targets(path: Path, node: ast.AST) -> list[str]:
    """The amptrain folders (or root modules) ``node`` imports from."""
    parts: list[list[str]] = []
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = list(path.relative_to(PACKAGE).parts[:-1])
            base = base[:len(base) - (node.level - 1)]
            module = base + (node.module.split(".") if node.module else [])
            parts = [module] if module else [[alias.name] for alias in node.names]
        elif (node.module or "").split(".")[0] == "amptrain":
            module = node.module.split(".")[1:]
            parts = [module] if module else [[alias.name] for alias in node.names]
    elif isinstance(node, ast.Import):
        parts = [alias.name.split(".")[1:] for alias in node.names
                 if alias.name.split(".")[0] == "amptrain"]
    found = []
    for module in parts:
        if module:
            found.append(module[0] if (PACKAGE / module[0]).is_dir() else module[0] + ".py")
    return found


def _imports() -> list[tuple[Path, ast.stmt, bool]]:
    """Every import statement of the package: (file, node, inside a function)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        inner = {id(n) for f in ast.walk(tree)
                 if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for n in ast.walk(f)}
        found += [(path, node, id(node) in inner) for node in ast.walk(tree)
                  if isinstance(node, (ast.Import, ast.ImportFrom))]
    return found


IMPORTS = _imports()


def test_every_folder_and_root_module_has_a_tier():
    units = {_unit(p) for p in PACKAGE.rglob("*.py")}
    assert units - set(RANK) == set(), "add the new folder to TIERS"
    assert set(RANK) - units == set(), "a tier names a folder that is gone"


def test_no_module_imports_from_a_tier_above_or_beside_its_own():
    wrong = []
    for path, node, _ in IMPORTS:
        source = _unit(path)
        for target in _targets(path, node):
            if target != source and RANK[target] <= RANK[source]:
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} imports "
                             f"{target} ({RANK[target]}) from {source} ({RANK[source]})")
    assert wrong == []


def test_own_modules_are_imported_in_a_function_only_to_defer_a_slow_import():
    lines = {path: path.read_text().splitlines() for path, _, inner in IMPORTS if inner}
    unexplained = []
    for path, node, inner in IMPORTS:
        if not inner or not _targets(path, node):
            continue
        text = lines[path]
        # The comment: on the import's lines, or above the run of imports it starts.
        first = node.lineno - 1
        while first > 0 and text[first - 1].strip().startswith(("from ", "import ")):
            first -= 1
        said = " ".join(text[max(first - 1, 0):node.end_lineno or node.lineno])
        if DEFERRED not in said:
            unexplained.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert unexplained == []


def test_the_checks_see_a_planted_violation(tmp_path):
    """The walker is no test that cannot fail: an upward import is seen as one."""
    fake = PACKAGE / "common" / "x.py"
    node = ast.parse("from ..trainer import Trainer").body[0]
    assert _targets(fake, node) == ["trainer"]
    assert RANK["trainer"] < RANK["common"]
    node = ast.parse("from amptrain.precision.core import Precision").body[0]
    assert _targets(fake, node) == ["precision"]


@pytest.mark.parametrize("tier", [t for names in TIERS for t in names])
def test_docs_architecture_names_every_tier(tier):
    text = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    assert tier.removesuffix(".py") in text
