"""amptrain/__init__.py: the documented library API, as examples/own_loop.py uses it."""
from __future__ import annotations

from amptrain.trainer import Trainer


def test_the_package_exports_the_documented_api_and_the_own_loop_example_trains(capsys):
    import runpy
    from pathlib import Path

    import amptrain

    assert amptrain.Trainer is Trainer and amptrain.Precision.__name__ == "Precision"
    example = runpy.run_path(str(Path(__file__).parents[1] / "examples" / "own_loop.py"))
    example["main"]("16-mixed")
    lines = capsys.readouterr().out.splitlines()
    losses = [float(line.split()[3]) for line in lines if line.startswith("epoch")]
    assert len(losses) == 3 and losses[-1] < 0.6  # chance level is ln(10) = 2.3
    assert "steps 84  skipped 0" in lines[2] and "'scale': 2048.0" in lines[3]


def test_library_modules_never_import_the_command_line():
    """compare, diagnose, env and the Trainer work without the CLI (docs/architecture.md)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys, amptrain.compare, amptrain.diagnose, amptrain.workflows.env, "
            "amptrain.workflows.runner, amptrain.trainer\n"
            "print([m for m in sys.modules if m == 'amptrain.cli' "
            "or m.startswith('amptrain.commands')])")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": str(root)}).stdout
    assert out.strip() == "[]"
