"""The runs whose losses are recorded bitwise (issue 43: a redesign keeps behaviour).

Each run is trained in a fresh process with the CPU's kernels pinned (oneDNN and ATen at
AVX2, MKL's conditional numerical reproducibility at AVX2, one thread), so the numbers do
not depend on which x86 class runs the test. ``python tests/recorded_runs.py --record``
writes tests/data/recorded_losses.json; ``python tests/recorded_runs.py NAME`` prints one
run's record as JSON (what the test compares).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

RECORD = Path(__file__).parent / "data" / "recorded_losses.json"

#: Same text on every machine: the gpt's corpus is written by the run itself.
_TEXT = "".join(f"line {i}: the quick brown fox {i % 7} jumps over {i * 13 % 31} lazy dogs.\n"
                for i in range(400))

#: name -> RunConfig options (the tests/run() turn them into one training run).
RUNS: dict[str, dict[str, object]] = {
    "cnn-digits-32-true": dict(model="cnn", data="digits", precision="32-true", max_steps=12,
                               batch_size=32),
    "cnn-digits-16-mixed": dict(model="cnn", data="digits", precision="16-mixed", max_steps=12,
                                batch_size=32),
    "cnn-digits-bf16-mixed": dict(model="cnn", data="digits", precision="bf16-mixed",
                                  max_steps=12, batch_size=32),
    "gpt-text-bf16-mixed": dict(model="gpt", data="text:{dir}/corpus.txt", precision="bf16-mixed",
                                max_steps=8, batch_size=8, seq_len=32),
    "ppo-cartpole-32-true": dict(model=None, data="gym:CartPole-v1", precision="32-true",
                                 env_steps=1024, num_envs=2, rollout_steps=128),
}

#: The process's kernels pinned before torch is imported.
PINNED = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2",
          "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


def run(name: str, directory: Path) -> dict[str, list[str]]:
    """Train ``name`` in this process; every logged loss and validation value as float.hex."""
    import torch

    from amptrain.config import RunConfig
    from amptrain.workflows.runner import run_training

    torch.set_num_threads(1)
    (directory / "corpus.txt").write_text(_TEXT)
    options = {k: (v.format(dir=directory) if isinstance(v, str) else v)
               for k, v in RUNS[name].items() if v is not None}
    config = RunConfig.from_options(**options, seed=0, log_every=1, device="cpu",
                                    out=str(directory / "run"), no_progress=True)
    result = run_training(config)
    record: dict[str, list[str]] = {}
    for entry in result.history:
        for key, value in entry.items():
            if ("loss" in key or key.startswith("val_")) and isinstance(value, float):
                record.setdefault(key, []).append(value.hex())
    return record


def run_pinned(name: str) -> dict[str, list[str]]:
    """``run(name)`` in a fresh process with the kernels pinned (:data:`PINNED`)."""
    env = {**os.environ, **PINNED}
    done = subprocess.run([sys.executable, __file__, name], env=env, capture_output=True,
                          text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> None:
    import tempfile

    if argv == ["--record"]:
        RECORD.parent.mkdir(exist_ok=True)
        RECORD.write_text(json.dumps({n: run_pinned(n) for n in RUNS}, indent=1) + "\n")
        return
    with tempfile.TemporaryDirectory() as tmp:
        record = run(argv[0], Path(tmp))
    print(json.dumps(record))


if __name__ == "__main__":
    main(sys.argv[1:])
