"""The examples under examples/ run and do what their docstrings say."""
from __future__ import annotations

import runpy
import warnings
from pathlib import Path

import pytest

from amptrain.common.errors import UserError

EXAMPLES = Path(__file__).parents[1] / "examples"


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["--precision", "16-mixed", "--separate-loss-scales"],
                                  ["--precision", "bf16-mixed"]])
def test_the_gan_loop_trains_both_models_and_reports_per_optimizer(argv, capsys):
    main = runpy.run_path(str(EXAMPLES / "gan_loop.py"))["main"]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # an emulated mode says so
            result = main([*argv, "--steps", "80", "--print-every", "40"])
    except UserError as error:
        pytest.skip(f"{argv[1]} on this machine: {error}")
    out = capsys.readouterr().out
    assert result["distance"] < 0.75 * result["first_distance"]   # G moved towards the ring
    lines = [line for line in out.splitlines() if line.startswith("step")]
    assert len(lines) == 2
    assert "skipped D 0 G 0" in lines[-1] and "d_loss" in lines[-1] and "g_loss" in lines[-1]
    scales = "loss scale 4096, 4096" if "--separate-loss-scales" in argv else "loss scale none"
    assert scales in lines[-1]
