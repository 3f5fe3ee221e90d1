"""The benchmark harness itself: fair comparisons, one loop at a time, clear failures.

Timings are never asserted here (they belong to benchmarks/RESULTS.md); what is tested is
what makes the timings mean something: the hand-written loop does exactly the Trainer's
maths, the relay never runs two loops at once, and the GPU script refuses a machine
without a GPU with one clear line.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import benchlib as bl  # noqa: E402

from tests.conftest import tiny_classification, tiny_mlp  # noqa: E402


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "16-mixed"])
def test_hand_written_loop_does_the_trainers_maths(precision):
    # Same initial weights, data order, optimizer, schedule and loss: after the same
    # steps the weights are bitwise equal, so timing the two compares only the loops.
    data = tiny_classification(n=96)
    model = tiny_mlp()
    common = dict(precision=precision, batch_size=16, total_steps=9,
                  device=torch.device("cpu"), log_every=4)
    trainer = bl.TrainerLoop(bl.fresh_copy(model), data, **common)
    raw = bl.RawLoop(bl.fresh_copy(model), data, **common)
    trainer.run()
    raw.run()
    assert trainer.trainer.step == raw.step == 9
    for a, b in zip(trainer.trainer.model.parameters(), raw.model.parameters()):
        assert torch.equal(a, b)


class _CountingLoop:
    """A stand-in loop that records which loop runs, and whether another one is running."""

    def __init__(self, name, steps, log, running):
        self.name, self.steps, self.log, self.running = name, steps, log, running

    def run(self, feed):
        for _ in feed(range(self.steps)):
            with self.running["lock"]:
                self.running["n"] += 1
                self.running["max"] = max(self.running["max"], self.running["n"])
            self.log.append(self.name)
            with self.running["lock"]:
                self.running["n"] -= 1


def test_relay_runs_loops_in_turns_one_at_a_time():
    log: list[str] = []
    running = {"n": 0, "max": 0, "lock": threading.Lock()}
    block, steps = 3, 3 * 6 + 1
    loops = {n: _CountingLoop(n, steps, log, running) for n in ("a", "b", "c")}
    times = bl.relay(loops, block, torch.device("cpu"))
    assert running["max"] == 1
    assert sorted(log) == sorted(["a", "b", "c"] * steps)
    runs = [log[i:i + block] for i in range(0, 6 * 3 * block, block)]
    assert all(len(set(r)) == 1 for r in runs)  # whole turns of one loop
    rounds = [[r[0] for r in runs[i:i + 3]] for i in range(0, len(runs), 3)]
    assert all(sorted(r) == ["a", "b", "c"] for r in rounds)  # each loop once per round
    assert all(runs[i][0] != runs[i + 1][0] for i in range(len(runs) - 1))
    assert {n: len(t) for n, t in times.items()} == {"a": 6, "b": 6, "c": 6}


def test_relay_reports_a_failing_loop():
    class Broken:
        def run(self, feed):
            for i in feed(range(10)):
                if i == 4:
                    raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        bl.relay({"ok": _CountingLoop("ok", 10, [], {"n": 0, "max": 0,
                                                     "lock": threading.Lock()}),
                  "broken": Broken()}, 2, torch.device("cpu"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_gpu_script_without_cuda_says_so_and_exits_2(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OUT": str(tmp_path)}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu.py")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2
    assert "needs a CUDA GPU" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_gpu_script_helpers_need_no_gpu():
    import gpu

    assert gpu.COMPUTE_DTYPE.keys() == set(gpu.PRECISIONS)
    assert all(set(p) == {"fp32", "tf32", "bf16", "fp16"} for p in gpu.PEAK_TFLOPS.values())
    assert gpu.peak_tflops("bf16-mixed", 123.0) == 123.0


def test_gpu_big_rows_keep_the_order_given():
    import gpu

    assert gpu.big_rows("gpt2-small:bf16-mixed,resnet50") == \
        [("gpt2-small", "bf16-mixed")] + [("resnet50", p) for p in gpu.PRECISIONS]
    assert len(gpu.big_rows(None)) == len(gpu.BIG_WORKLOADS) * len(gpu.PRECISIONS)
    with pytest.raises(SystemExit, match="--big-rows: 'resnet50:fp8'"):
        gpu.big_rows("resnet50:fp8")


@pytest.mark.slow
def test_compare_lane_prints_the_lane_against_the_training_loop(tmp_path):
    """benchmarks/compare_lane.py on the tiny BERT: one round, a row with every column."""
    pytest.importorskip("transformers")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "compare_lane.py"), "--rounds", "1",
         "--epochs", "1", "--threads", "1"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = next(line for line in proc.stdout.splitlines() if line.startswith("| 32-true |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert len(cells) == 6 and all(float(c) > 0 for c in cells[1:4])
    assert float(cells[4].strip("*")) > 0


def test_wide_mlp_overhead_measures_every_lane_without_timing_assertions(monkeypatch):
    import wide_mlp_overhead as wide

    from amptrain.data import DataOptions, build_data

    assert (wide.WIDTH, wide.BATCH) == (2048, 512)   # the benchmark's (4.3 M parameters)
    # Its lanes' wiring on a narrow copy: at width 2048 a step is seconds on one thread.
    monkeypatch.setattr(wide, "WIDTH", 128)
    monkeypatch.setattr(wide, "BATCH", 64)
    model = wide.wide_mlp(10, (1, 8, 8))
    assert sum(p.numel() for p in model.parameters()) == 64 * 128 + 128 + 128 * 128 \
        + 128 + 128 * 10 + 10  # three Linear layers of width WIDTH
    bundle = build_data("digits", DataOptions(seed=0))
    e2e = wide.end_to_end("32-true", bundle.train, bundle.val, rounds=1, warmup=0,
                          log_every=2, cli_lane=True)
    assert set(e2e) == {"trainer", "hand", "hand2", "cli"}
    assert all(len(v) == 1 and v[0] > 0 for v in e2e.values())
    steps = wide.step_only("bf16-mixed", bundle.train, rounds=1, warmup=0, log_every=1)
    ratio, _, control = wide.summary(steps, "trainer")
    assert ratio > 0 and control > 0


def test_emulation_speed_times_every_variant_without_timing_assertions(monkeypatch):
    import emulation_speed as es

    # As if on an AVX2-only CPU: bf16 and fp16 both emulated, each also on torch's kernels.
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.delenv("AMPTRAIN_EMULATION", raising=False)
    tiny = bl.Workload("mlp", "mlp:hidden=16", "synthetic-image:samples=64,size=8", 16)
    rows = es.measure(tiny, ["bf16-mixed", "16-mixed"], slow=True, rounds=1, warmup=0, block=1)
    assert [r["variant"] for r in rows] == [
        "32-true", "bf16-mixed emulated", "bf16-mixed torch kernels", "16-mixed emulated",
        "16-mixed torch kernels"]
    assert all(r["ms"] > 0 and r["ratio"] > 0 for r in rows)
    assert "AMPTRAIN_EMULATION" not in os.environ  # restored after each loop


# ------------------------------------------------- the reference PPO loop (issue 34)
@pytest.fixture
def ppo():
    """benchmarks/ppo_reference.py, on one thread (its 64-wide MLP gains nothing from two,
    and on a loaded machine idle threads spinning between tiny kernels cost 3x)."""
    import ppo_reference

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield ppo_reference
    torch.set_num_threads(threads)


@pytest.mark.parametrize("env_id, num_envs, rollout, total, precision", [
    ("CartPole-v1", 2, 16, 64, "32-true"),
    ("CartPole-v1", 2, 16, 64, "16-mixed"),
    ("Pendulum-v1", 1, 64, 64, "bf16-mixed"),   # continuous; no episode ends in 64 steps
])
def test_reference_ppo_returns_sane_figures(ppo, env_id, num_envs, rollout, total, precision):
    import dataclasses

    # The continuous recipe's 10 epochs of 32 minibatches, cut to 1 epoch for the test.
    recipe = dataclasses.replace(ppo.CONTINUOUS, epochs=1) if env_id == "Pendulum-v1" else None
    result = ppo.run(env_id, num_envs, rollout, total, seed=3, precision=precision,
                     recipe=recipe)
    assert result["updates"] == result["update"] == total // (num_envs * rollout)
    assert result["env_steps"] == total and result["env_steps_per_s"] > 0
    shares = [result["env_share"], result["act_share"], result["update_share"]]
    assert all(0 < s < 1 for s in shares) and sum(shares) == pytest.approx(1.0)
    assert result["env_time_s"] > 0 and result["update_time_s"] > 0
    returns = result["final_returns"]
    assert len(returns) <= ppo.LAST_EPISODES and result["episodes"] >= len(returns)
    if env_id == "CartPole-v1":  # +1 per step until the pole falls (500 at most)
        assert returns and all(r == int(r) and 1 <= r <= 500 for r in returns)
        assert result["final_return_mean"] == pytest.approx(sum(returns) / len(returns))
    else:  # Pendulum's episodes last 200 steps
        assert result["episodes"] == 0 and result["final_return_mean"] is None


def test_reference_ppo_yields_after_every_update_and_is_seeded(ppo):
    figures = list(ppo.iterate("CartPole-v1", 2, 16, 64, seed=5))
    assert [f["env_steps"] for f in figures] == [32, 64]  # loops can take turns per update
    again = ppo.run("CartPole-v1", 2, 16, 64, seed=5)
    assert again["final_returns"] == figures[-1]["final_returns"]


def test_reference_ppo_loops_take_turns_update_by_update(ppo):
    order = []

    def loop(name, updates):
        for i in range(updates):
            order.append(name)
            yield {"update": i + 1}

    last = ppo.take_turns({"a": loop("a", 3), "b": loop("b", 1)})
    assert order == ["a", "b", "a", "a"] and last == {"a": {"update": 3}, "b": {"update": 1}}


def test_reference_ppo_main_prints_every_precision(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "ppo_reference.py"), "--num-envs", "2",
         "--rollout-steps", "16", "--env-steps", "32", "--precision", "32-true,bf16-mixed"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if "env steps/s" in line]
    assert [line.split(":")[0] for line in lines] == ["CartPole-v1 32-true",
                                                       "CartPole-v1 bf16-mixed"]
    assert all("32 env steps in 1 updates" in line for line in lines)


def test_reference_ppo_refuses_a_run_without_an_update(ppo):
    with pytest.raises(ValueError, match="updates"):
        ppo.run("CartPole-v1", 2, 16, 16, seed=0)
    with pytest.raises(ValueError, match="precision"):
        ppo.run("CartPole-v1", 2, 16, 64, seed=0, precision="fp8")


def test_reference_gae_against_a_hand_computation(ppo):
    # One environment, three steps; the episode ends after step 1 (step 2's observation
    # begins a new one), then the rollout is cut and bootstrapped with V = 4.
    rewards = torch.tensor([[1.0], [2.0], [3.0]])
    values = torch.tensor([[0.5], [1.0], [1.5]])
    dones = torch.tensor([[0.0], [0.0], [1.0]])
    g, lam = 0.9, 0.8
    d2 = 3 + g * 4 - 1.5
    d1 = 2 + 0 - 1.0                     # no bootstrap across the episode's end
    d0 = 1 + g * 1.0 - 0.5
    a2, a1 = d2, d1
    a0 = d0 + g * lam * a1
    adv, ret = ppo.gae(rewards, values, dones, torch.tensor([4.0]), torch.tensor([0.0]), g, lam)
    assert adv.flatten().tolist() == pytest.approx([a0, a1, a2])
    assert ret.flatten().tolist() == pytest.approx([a0 + 0.5, a1 + 1.0, a2 + 1.5])


def test_reference_ppo_evaluates_at_amptrains_cadence_with_deterministic_episodes(ppo):
    # 2 x 16 transitions an update, 4 updates, 2 evaluations: after updates 2 and 4.
    figures = list(ppo.iterate("CartPole-v1", 2, 16, 128, seed=5, evaluations=2,
                               eval_episodes=3))
    # The last evaluation's returns are carried on: none before update 2.
    assert [bool(f["eval_returns"]) for f in figures] == [False, True, True, True]
    assert len(figures[-1]["eval_returns"]) == 3
    # Deterministic: the same policy plays the same episodes from the fixed seeds.
    torch.manual_seed(0)
    model = ppo.ActorCritic(4, __import__("gymnasium").spaces.Discrete(2))
    first = ppo.evaluate(model, "CartPole-v1", 3, None)
    assert first == ppo.evaluate(model, "CartPole-v1", 3, None)
    assert all(r == int(r) and 1 <= r <= 500 for r in first)


def test_ppo_end_to_end_runs_the_same_work_in_both_lanes(tmp_path):
    import ppo_end_to_end

    lanes = ppo_end_to_end.commands("CartPole-v1", 4096, 10, 1, tmp_path / "run")
    amptrain, plain = lanes["amptrain"], lanes["plain"]
    assert lanes["plain #2"] == plain  # the A/A control runs the same command
    for flag_, value in (("--env-steps", "4096"), ("--eval-episodes", "10"), ("--seed", "1")):
        assert amptrain[amptrain.index(flag_) + 1] == plain[plain.index(flag_) + 1] == value
    assert plain[plain.index("--evaluations") + 1] == "20"  # amptrain's ppo default


# ------------------------------------- amptrain's PPO against the reference (issue 34)
def test_ppo_speed_steps_amptrain_one_update_at_a_time(ppo):
    import ppo_speed

    # 2 environments x 16 steps; CleanRL's 4 minibatches x 4 epochs: 16 steps an update.
    lane = ppo_speed.AmptrainPpo("CartPole-v1", 2, 16, updates=3, precision="32-true", seed=0)
    assert lane.unit == 16 and lane.transitions == 32
    seen = []
    for _ in range(3):
        lane.update()
        seen.append((lane.trainer.step, lane.clock["env"], lane.clock["rollout"]))
    # Every update collects its own rollout: the environments' clock moves each time.
    assert [s for s, _, _ in seen] == [16, 32, 48]
    assert 0 < seen[0][1] < seen[1][1] < seen[2][1]
    assert all(env < rollout for _, env, rollout in seen)


def test_ppo_speed_measures_every_lane_without_timing_assertions(ppo):
    import ppo_speed

    m = ppo_speed.measure("CartPole-v1", 2, 16, "32-true", rounds=2, warmup=1)
    assert m["amptrain_sps"] > 0 and m["reference_sps"] > 0
    assert m["ratio"] > 0 and m["control"] > 0
    for shares in (m["amptrain_shares"], m["reference_shares"]):
        assert set(shares) == {"env", "act", "update"} and all(v > 0 for v in shares.values())
        assert sum(shares.values()) == pytest.approx(1.0)
