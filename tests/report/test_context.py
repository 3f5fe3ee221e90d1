"""amptrain.report.context: the title, device, configuration, method and environment lines."""
from __future__ import annotations

from amptrain.report.context import (
    _config_line,
    _device_line,
    _env_value,
    _method_lines,
    _title,
    env_rows,
)
from amptrain.report.load import load_study


def test_title_and_config_line(tiny_study):
    study = load_study(tiny_study)
    assert _title(study) == "amptrain compare — cnn on digits"
    # Only the keys that were set, in a fixed order (lr is None here).
    assert _config_line(study) == "model cnn, data digits, max_steps 8, batch_size 64"


def test_device_line_names_the_gpu_on_cuda_and_the_cpu_otherwise(tiny_study):
    study = load_study(tiny_study)
    assert _device_line(study) == "Test CPU, 2 cores (cpu)"
    study.details["device"] = "cuda:0"
    study.details["env"]["gpus"] = [{"name": "NVIDIA H100 80GB HBM3"}]
    assert _device_line(study) == "NVIDIA H100 80GB HBM3 (cuda:0)"
    study.details = {}
    assert _device_line(study) == "CPU (?)"


def test_env_rows_put_the_device_first_and_spell_values_out(tiny_study):
    rows = env_rows(load_study(tiny_study))
    assert rows[0] == ("device used", "cpu")
    assert dict(rows[1:]) == {"python": "3.11.7", "torch": "2.13.0+cpu", "cuda": "—",
                              "cpu": "Test CPU", "cpu_cores": "2", "gpus": "none"}
    assert _env_value("bf16", True) == "yes" and _env_value("fp8", False) == "no"
    assert _env_value("total_bytes", 1536) == "1.5 KiB"
    assert _env_value("flags", {"amx": False, "mem_bytes": 2048}) == "amx: no, mem_bytes: 2.0 KiB"
    assert _env_value("flags", {}) == "—"
    assert _env_value("gpus", [{"name": "A"}, {"name": "B"}]) == "name: A; name: B"


def test_method_lines_describe_timing_seeds_and_duration(tiny_study, speed_only_study):
    lines = _method_lines(load_study(tiny_study))
    assert lines[0].startswith("Speed: 1 warm-up + 3 timed optimizer steps per precision, "
                               "interleaved (round-robin, rotating order)")
    assert lines[1] == "Memory: hand-written numbers"
    assert "over seeds 0, 1; verdict ok when |Δ accuracy| ≤ 0.5 pp." in lines[2]
    assert lines[-1] == "Whole study: 12 s, started 2024-01-02 03:04:05."
    bench = load_study(speed_only_study)
    bench.details["options"]["interleave"] = False
    del bench.details["duration_s"]
    lines = _method_lines(bench)
    assert "2 timed optimizer steps" in lines[0] and "one precision after another" in lines[0]
    assert not lines[-1].startswith("Whole study")
    # A task that acts between updates (ppo) is timed in whole updates: the line says so.
    for figures in bench.details["speed"].values():
        figures["timed_unit_steps"] = 16
    lines = _method_lines(bench)
    assert "2 timed units of 16 optimizer steps (a whole update, the task's acting " \
           "included" in lines[0] and "synchronised around every unit" in lines[0]
