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
