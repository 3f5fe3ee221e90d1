"""env.py: the bench and the table of ``amptrain env`` (the facts it shows:
tests/precision/hardware/test_probe.py; the command: tests/commands/test_env.py)."""
from __future__ import annotations

import pytest
import torch

from amptrain.workflows import env
from amptrain.precision.hardware.probe import collect_env

# -------------------------------------------------------------------- bench
def test_bench_measures_every_dtype_on_this_device():
    bench = env.run_bench(torch.device("cpu"), rounds=1, target_s=0.0)
    rows = {(r["op"], r["dtype"]): r for r in bench["results"]}
    assert set(rows) == {(op, d) for op in ("matmul", "conv2d") for d in ("fp32", "bf16", "fp16")}
    assert all(r["tflops"] > 0 and r["ms"] > 0 for r in rows.values())
    assert rows["matmul", "fp32"]["ratio_to_fp32"] == 1.0
    assert "TFLOP/s" in env.format_bench(bench)


@pytest.mark.parametrize("isa, switch, bf16_path", [
    ("AVX2", None, "emulated"),      # no bf16 hardware for oneDNN: a run emulates it
    ("AVX2", "off", "pytorch"),      # ... unless AMPTRAIN_EMULATION=off
    (None, None, None),              # this CPU as it is: native where it has the hardware
])
def test_bench_times_the_path_a_run_takes_here_and_labels_it(monkeypatch, isa, switch,
                                                             bf16_path):
    from amptrain.precision.hardware.support import cpu_has_native_bf16, device_features

    for name, value in (("ONEDNN_MAX_CPU_ISA", isa), ("AMPTRAIN_EMULATION", switch)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    cpu = torch.device("cpu")
    paths = env.kernel_paths(cpu)
    expected_bf16 = bf16_path or ("native" if cpu_has_native_bf16() else "emulated")
    expected_fp16 = "native" if device_features(cpu)["fp16"] else \
        ("pytorch" if switch == "off" else "emulated")
    assert paths == {"fp32": "native", "bf16": expected_bf16, "fp16": expected_fp16}
    timed = []
    original = env._timed

    def spy(case, inputs, device, reps, emulate=None):
        timed.append((case.op, inputs[0].dtype, emulate))
        return original(case, inputs, device, reps, emulate)

    monkeypatch.setattr(env, "_timed", spy)
    bench = env.run_bench(cpu, rounds=1, target_s=0.0)
    assert {r["dtype"]: r["path"] for r in bench["results"]} == paths
    for _op, dtype, emulate in timed:  # the emulation: fp32 inputs under its autocast
        half = {torch.bfloat16: "bf16", torch.float16: "fp16"}
        if emulate is not None:
            assert dtype == torch.float32 and paths[half[emulate]] == "emulated"
        elif dtype != torch.float32:
            assert paths[half[dtype]] in ("native", "pytorch")
    table = env.format_bench(bench)
    row = next(line for line in table.splitlines() if line.startswith("  matmul  bf16"))
    assert row.split()[2] == expected_bf16
    assert f"{expected_bf16} = {env.PATHS[expected_bf16]}" in table


@pytest.mark.parametrize("switch,label", [(None, "emulated (native numerics, fp32 speed)"),
                                          ("off", "emulated (slow)")])
def test_emulated_precisions_say_how_they_run(monkeypatch, switch, label):
    # ONEDNN_MAX_CPU_ISA=AVX2 makes every CPU an AVX2-only one for oneDNN: bf16 and fp16
    # are both emulated, at fp32 speed unless AMPTRAIN_EMULATION=off.
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    if switch is None:
        monkeypatch.delenv("AMPTRAIN_EMULATION", raising=False)
    else:
        monkeypatch.setenv("AMPTRAIN_EMULATION", switch)
    info = collect_env()
    if info["device"] != "cpu":
        pytest.skip("env describes the GPU here")
    assert info["emulated"]["bf16-mixed"] and info["emulated"]["16-mixed"]
    assert info["emulated_fast"]["bf16-mixed"] is (switch is None)
    rows = [line for line in env.format_env(info).splitlines() if line.startswith("  bf16-")]
    assert rows and all(label in row for row in rows)
    assert "emulated" not in next(line for line in env.format_env(info).splitlines()
                                  if line.startswith("  32-true"))
