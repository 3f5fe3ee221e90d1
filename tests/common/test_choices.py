"""The torch-free names table (choices.py): the implementations agree with it, and a name
added to one side only stops the import with a message naming both."""
from __future__ import annotations

import subprocess
import sys

import pytest

from amptrain.common import choices
from amptrain.precision import MODES, PRECISION_NAMES
from amptrain.precision.weight_update import WEIGHT_UPDATES
from amptrain.tasks import LOSSES, TASK_CHOICES, TASKS
from tests.commands.helpers import REPO


def test_the_implementations_use_these_names():
    assert tuple(MODES) == choices.MODE_NAMES and PRECISION_NAMES == choices.PRECISION_NAMES
    assert tuple(TASKS) == choices.TASK_NAMES and TASK_CHOICES == choices.TASK_CHOICES
    assert WEIGHT_UPDATES == choices.WEIGHT_UPDATES and LOSSES == choices.LOSSES


def test_a_table_that_disagrees_is_refused():
    with pytest.raises(RuntimeError, match=r"precision modes \('32-true',\) do not match"):
        choices.check_table("precision modes", {"32-true": None}, ("32-true", "tf32"))
    choices.check_table("tasks", ["a", "b"], ("a", "b"))


def test_importing_the_names_and_the_config_imports_no_torch():
    code = ("import sys, amptrain.common.choices, amptrain.config; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
