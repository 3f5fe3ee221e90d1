"""Distributed training: DDP/FSDP2 in real processes (gloo on CPU), DataParallel, the launcher.

The multi-process scenarios run once per session under torchrun
(tests/distributed_worker.py) and are compared here with single-process runs.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Subset

from amptrain import checkpoint
from amptrain.batches import GlobalBatchPlan
from amptrain.cli import build_parser, merged_values
from amptrain.config import RunConfig, build_config
from amptrain.distributed import (DataParallelStrategy, Strategy, _shard_units, build_strategy,
                                  process_device)
from amptrain.errors import UserError
from amptrain.launch import launch_requested, resume_after_restart, torchrun_args
from amptrain.precision import Precision
from amptrain.trainer import Trainer
from tests import distributed_worker as worker
from tests.conftest import tiny_classification, tiny_mlp

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 420  # a hang must fail the test, not block CI


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(**extra: str) -> dict[str, str]:
    """This environment minus any torchrun variables, running this checkout's amptrain."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "TORCHELASTIC_RESTART_COUNT")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def _descendants(pid: int) -> list[int]:
    """All processes below ``pid`` (torchrun starts its workers in sessions of their own,
    so killing the launcher's process group would leave them running)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def run(cmd: list[str], env: dict[str, str], timeout: int = TIMEOUT_S,
        cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Run a process tree; on timeout dump the workers' stacks, kill the tree, and fail."""
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        workers = _descendants(proc.pid)
        _signal_all(workers, signal.SIGUSR1)  # distributed_worker.py dumps its stacks
        try:
            proc.communicate(timeout=3)
        except subprocess.TimeoutExpired:
            pass
        _signal_all([proc.pid, *workers], signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
        pytest.fail(f"{' '.join(cmd[:6])}... hung for {timeout}s\n{err[-6000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def torchrun(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                "--nnodes", "1", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                *args], env or child_env())


# --------------------------------------------------------- worker scenarios
@pytest.fixture(scope="module")
def scenarios(tmp_path_factory):
    """Run every worker scenario once on 2 processes; returns load(name, rank)."""
    out = tmp_path_factory.mktemp("ddp")
    result = torchrun(str(ROOT / "tests" / "distributed_worker.py"), str(out))
    if result.returncode != 0:
        pytest.fail(f"distributed worker failed ({result.returncode}):\n{result.stderr[-6000:]}")

    def load(name: str, rank: int):
        return torch.load(out / f"{name}-rank{rank}.pt", weights_only=False)
    return load


def _reference(**options) -> Trainer:
    """The same run in one process (no strategy: a single device)."""
    return worker.fit(None, **options)


def _assert_params_close(actual, expected, rtol, atol, *, moved_by=None):
    for name, value in expected.items():
        torch.testing.assert_close(actual[name], value, rtol=rtol, atol=atol, msg=name)
    if moved_by is not None:  # the comparison means something: training moved the weights
        init = tiny_mlp().state_dict()
        moved = max((expected[k] - init[k]).abs().max().item() for k in init)
        assert moved > moved_by, moved


@pytest.mark.slow
@pytest.mark.parametrize("precision,accumulate,optimizer", worker.EQUAL_RUNS)
def test_two_process_ddp_equals_one_process_with_the_same_global_batch(
        scenarios, precision, accumulate, optimizer):
    name = worker.equal_name(precision, accumulate, optimizer)
    ranks = [scenarios("equal", r)[name] for r in (0, 1)]
    assert (ranks[0]["micro"], ranks[0]["accumulate"]) == (16 // accumulate, accumulate)
    for key, value in ranks[0]["params"].items():  # replicas stay bitwise identical
        assert torch.equal(value, ranks[1]["params"][key]), key
    val = tiny_classification(n=61, seed=1) if "val_acc" in ranks[0] else None
    reference = _reference(val=val, precision=precision, accumulate=accumulate,
                           optimizer=optimizer)
    ref_params = worker.params(reference)
    if precision == "32-true":
        _assert_params_close(ranks[0]["params"], ref_params, 1e-5, 1e-6, moved_by=1e-2)
    else:  # bf16 rounds per-rank partial sums differently; still far tighter than training moves
        _assert_params_close(ranks[0]["params"], ref_params, 1e-2, 2e-3, moved_by=5e-2)
    if val is not None:  # predictions gathered from both ranks: the whole validation set
        assert ranks[0]["val_samples"] == ranks[1]["val_samples"] == 61
        assert ranks[0]["val_acc"] == pytest.approx(reference.last_eval.accuracy)
        assert ranks[0]["val_loss"] == pytest.approx(reference.last_eval.loss, rel=1e-5)


@pytest.mark.slow
def test_user_dataloader_is_sharded_with_a_distributed_sampler(scenarios):
    ranks = [scenarios("loader", r) for r in (0, 1)]
    assert ranks[0]["sampler"] == "DistributedSampler"
    # DistributedSampler deals a seeded permutation round-robin: the two ranks' k-th
    # batches of 16 together are the permutation's k-th 32 samples.
    data = tiny_classification(n=worker.SAMPLES)
    perm = torch.randperm(len(data), generator=torch.Generator().manual_seed(0)).tolist()
    one_process = DataLoader(Subset(data, perm), batch_size=32, shuffle=False)
    val = DataLoader(tiny_classification(n=61, seed=1), batch_size=16)
    reference = _reference(data=one_process, val=val, precision="32-true")
    _assert_params_close(ranks[0]["params"], worker.params(reference), 1e-5, 1e-6, moved_by=1e-2)
    # Evaluation counts every validation sample once: no DistributedSampler padding.
    for rank in ranks:
        assert rank["val"]["samples"] == 61
        assert rank["val"]["acc"] == pytest.approx(reference.last_eval.accuracy)
        assert rank["val"]["loss"] == pytest.approx(reference.last_eval.loss, rel=1e-5)
    single = reference.evaluate(data=DataLoader(tiny_classification(n=1, seed=2)))
    assert [r["single"]["samples"] for r in ranks] == [1, 1]
    assert ranks[0]["single"]["loss"] == pytest.approx(single.loss, rel=1e-5)


@pytest.mark.slow
def test_no_sync_between_accumulation_boundaries(scenarios):
    snaps = [scenarios("no_sync", r) for r in (0, 1)]
    no_sync = list(zip(snaps[0]["no_sync"], snaps[1]["no_sync"]))
    assert [(s[0][0], s[0][1]) for s in no_sync] == [(0, False), (0, True), (1, False), (1, True)]
    for (step, boundary, grads0), (_, _, grads1) in no_sync:
        same = all(torch.allclose(a, b, rtol=1e-6, atol=1e-8) for a, b in zip(grads0, grads1))
        # Off-boundary: each rank holds its own micro-batch's gradient (no all-reduce ran);
        # at the boundary: the all-reduced gradient, identical on both ranks.
        assert same == boundary, (step, boundary)
    # The boundary gradient is the mean gradient of the whole global batch of step 0.
    plan = GlobalBatchPlan(worker.SAMPLES, 32, 32, seed=0)
    indices = next(plan.epoch(0)).micro_indices[0]
    x, y = tiny_classification(n=worker.SAMPLES).tensors
    model = tiny_mlp()
    F.cross_entropy(model(x[indices]), y[indices]).backward()
    for got, want in zip(no_sync[1][0][2], [p.grad for p in model.parameters()]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    # Control: syncing every micro-batch makes the off-boundary gradients identical too,
    # so the inequality above is no_sync's doing.
    for (_, boundary, grads0), (_, _, grads1) in zip(snaps[0]["always_sync"],
                                                     snaps[1]["always_sync"]):
        assert all(torch.allclose(a, b) for a, b in zip(grads0, grads1))


@pytest.mark.slow
@pytest.mark.parametrize("run", ["agree-16-mixed", "agree-bf16-mixed", "fsdp-16-mixed"])
def test_inf_on_one_rank_after_all_reduce_is_skipped_by_every_rank(scenarios, run):
    ranks = [scenarios("found_inf", r)[run] for r in (0, 1)]
    for rank in ranks:
        assert rank["steps"] == 4 and rank["skipped_steps"] == 1
        assert all(torch.isfinite(torch.tensor(rank["losses"])))
    if "bf16" not in run:  # fp16: the scale backed off once, identically on both ranks
        assert ranks[0]["scales"] == ranks[1]["scales"] == [1024.0, 512.0, 512.0, 512.0]
    if run.startswith("agree"):
        for key, value in ranks[0]["params"].items():
            assert torch.equal(value, ranks[1]["params"][key]), key
    else:  # FSDP gathers full weights on rank 0 only
        assert all(torch.isfinite(v).all() for v in ranks[0]["params"].values())


@pytest.mark.slow
def test_without_agreement_the_ranks_diverge(scenarios):
    """The control for the test above: what found-inf agreement prevents."""
    ranks = [scenarios("found_inf", r)["disagree-16-mixed"] for r in (0, 1)]
    assert [r["skipped_steps"] for r in ranks] == [0, 1]
    assert [r["loss_scale"] for r in ranks] == [1024.0, 512.0]
    assert not torch.equal(ranks[0]["params"]["body.0.weight"], ranks[1]["params"]["body.0.weight"])


@pytest.mark.slow
def test_fsdp_trains_and_its_checkpoint_loads_on_one_device(scenarios):
    result = scenarios("fsdp", 0)
    for precision, keep in (("32-true", []), ("bf16-mixed", ["head"])):
        run = result[precision]
        state = checkpoint.load(run["checkpoint"])
        assert all(v.dtype == torch.float32 for v in state["model"].values())
        model = tiny_mlp()
        model.load_state_dict(state["model"])  # strict: plain names, full shapes
        reference = _reference(precision=precision, optimizer="adamw", lr=0.01, keep_fp32=keep)
        losses, ref_losses = run["losses"], [r["loss"] for r in reference.history if "loss" in r]
        assert losses[-1] < losses[0]
        if precision == "32-true":  # same maths as one process: reduce-scatter averages
            _assert_params_close(model.state_dict(), worker.params(reference), 1e-5, 1e-6,
                                 moved_by=1e-2)
            assert losses == pytest.approx(ref_losses, rel=1e-5)
        else:
            assert losses == pytest.approx(ref_losses, rel=2e-2)
    resumed = result["resume"]
    _assert_params_close(resumed["resumed"], resumed["straight"], 1e-6, 1e-7)


# ----------------------------------------------------- end-to-end commands
FAULTS = ROOT / "tests" / "faults"


@pytest.mark.slow
def test_killed_rank_restarts_and_resumes_from_the_checkpoint(tmp_path):
    out = tmp_path / "run"
    args = ["--model", "mlp", "--data", "digits", "--precision", "32-true", "--optimizer", "sgd",
            "--lr", "0.05", "--scheduler", "none", "--batch-size", "64", "--max-steps", "10",
            "--save-every", "4", "--log-every", "1", "--no-progress"]
    env = child_env(AMPTRAIN_TEST_KILL_RANK="1", AMPTRAIN_TEST_KILL_STEP="6")
    env["PYTHONPATH"] = os.pathsep.join([str(FAULTS), str(ROOT)])  # loads faults/sitecustomize
    result = run([sys.executable, "-m", "amptrain", "train", *args, "--out", str(out),
                  "--nproc-per-node", "2", "--master-port", str(free_port()),
                  "--max-restarts", "1"], env)
    assert result.returncode == 0, result.stderr[-6000:]
    assert "killed rank 1 at step 6" in result.stderr
    assert "restart 1: resuming from the last checkpoint" in result.stderr
    assert re.search(r"resum\w* from \S+last\.pt at step 4", result.stderr)
    steps = [r["step"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
             if "loss" in r]
    assert steps[-1] == 10 and set(steps) == set(range(1, 11))
    state = checkpoint.load(out / "checkpoints" / "last.pt")
    assert state["step"] == 10
    # The interrupted 2-process run ends where an uninterrupted 1-process run ends.
    from amptrain.runner import run_training

    config = build_config(RunConfig, {**_flags_to_values(args), "out": str(tmp_path / "one")})
    run_training(config, strategy=Strategy(torch.device("cpu")))
    expected = checkpoint.load(tmp_path / "one" / "checkpoints" / "last.pt")["model"]
    _assert_params_close(state["model"], expected, 1e-5, 1e-6)


@pytest.mark.slow
def test_plain_torchrun_runs_amptrain_train(tmp_path):
    out = tmp_path / "run"
    result = torchrun("-m", "amptrain", "train", "--model", "mlp", "--data", "digits",
                      "--precision", "bf16-mixed", "--batch-size", "64", "--max-steps", "6",
                      "--log-every", "2", "--no-progress", "--out", str(out))
    assert result.returncode == 0, result.stderr[-6000:]
    assert result.stdout.count("done: val_acc") == 1  # rank 0 reports, rank 1 is quiet
    assert result.stderr.count("amptrain: precision bf16-mixed") == 1
    config = (out / "config.yaml").read_text()
    assert "world_size: 2" in config and "strategy: auto" in config
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()
             if "loss" in json.loads(line)]
    assert steps == [2, 4, 6]  # one writer: no duplicated records
    state = checkpoint.load(out / "checkpoints" / "last.pt")
    assert not any(k.startswith("module.") for k in state["model"])  # the unwrapped module
    assert state["step"] == 6 and state["config"]["world_size"] == 2


def _flags_to_values(args: list[str]) -> dict:
    parser = build_parser()
    return merged_values(parser.parse_args(["train", *args]))


# ------------------------------------------------------------- unit checks
def test_auto_is_single_device_without_torchrun(monkeypatch):
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    strategy = build_strategy("auto", "cpu")
    assert type(strategy) is Strategy and strategy.world_size == 1
    assert Trainer(device="cpu").strategy.world_size == 1


@pytest.mark.parametrize("name", ["ddp", "fsdp"])
def test_ddp_and_fsdp_without_torchrun_name_the_flag(monkeypatch, name):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(UserError, match="--nproc-per-node"):
        build_strategy(name, "cpu")


def test_dp_under_torchrun_is_refused(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(UserError, match="--strategy dp"):
        build_strategy("dp", "cpu")


def test_each_process_takes_its_local_gpu_or_the_cpu():
    assert process_device("cpu", 3) == torch.device("cpu")
    if not torch.cuda.is_available():
        assert process_device("auto", 1) == torch.device("cpu")
    else:
        assert process_device("auto", 0) == torch.device("cuda", 0)
        with pytest.raises(UserError, match="--device cuda"):
            process_device("cuda:0", 0)


def _train_args(*argv: str) -> tuple[argparse.Namespace, RunConfig]:
    args = build_parser().parse_args(["train", *argv])
    return args, build_config(RunConfig, merged_values(args))


def test_launcher_flags_become_torchrun_arguments_not_config():
    args, config = _train_args("--model", "mlp", "--precision", "bf16-mixed", "--keep-fp32", "head",
                               "--lr", "0.003", "--no-progress", "--out", "runs/x",
                               "--nproc-per-node", "4", "--max-restarts", "2")
    assert launch_requested(args)
    argv = torchrun_args(args, config)
    assert argv[:6] == ["--nproc-per-node", "4", "--nnodes", "1", "--max-restarts", "2"]
    assert "--master-port" not in argv  # one machine: torchrun picks a free port itself
    child = argv[argv.index("-m"):]
    assert child[:3] == ["-m", "amptrain", "train"]
    assert not {"--nproc-per-node", "--max-restarts"} & set(child)
    # The workers rebuild exactly the config the launcher resolved.
    _, rebuilt = _train_args(*child[3:])
    assert rebuilt == config


def test_multi_node_launch_needs_the_master_address():
    args, config = _train_args("--nproc-per-node", "8", "--nnodes", "2", "--node-rank", "1")
    with pytest.raises(UserError, match="--master-addr"):
        torchrun_args(args, config)
    machine = ("--nproc-per-node", "8", "--nnodes", "2", "--node-rank", "1",
               "--master-addr", "10.0.0.1", "--master-port", "29400")
    argv = torchrun_args(*_train_args(*machine))
    assert argv[argv.index("--node-rank") + 1] == "1"
    assert argv[argv.index("--master-addr") + 1] == "10.0.0.1"
    assert argv[argv.index("--master-port") + 1] == "29400"
    # Restartable jobs rendezvous through c10d (a fresh store per attempt).
    argv = torchrun_args(*_train_args(*machine, "--max-restarts", "3"))
    assert argv[argv.index("--rdzv-backend") + 1] == "c10d"
    assert argv[argv.index("--rdzv-endpoint") + 1] == "10.0.0.1:29400"


def test_launcher_flags_inside_torchrun_are_refused(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    args, _ = _train_args("--nproc-per-node", "2")
    with pytest.raises(UserError, match="already started by torchrun"):
        launch_requested(args)


def test_cli_ddp_without_launcher_exits_2_with_one_line(tmp_path):
    env = child_env()
    env.pop("WORLD_SIZE", None)
    result = run([sys.executable, "-m", "amptrain", "train", "--strategy", "ddp", "--model", "mlp",
                  "--out", str(tmp_path / "r")], env, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "--nproc-per-node" in result.stderr


def test_restarted_worker_resumes_automatically(monkeypatch):
    config = build_config(RunConfig, {"out": "runs/x"})
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    resume_after_restart(config)
    assert config.resume is None
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    resume_after_restart(config)
    assert config.resume == "auto"


@pytest.mark.parametrize("name,param,reduce", [
    ("32-true", None, torch.float32), ("16-mixed", torch.float16, torch.float32),
    ("bf16-mixed", torch.bfloat16, torch.float32), ("16-master", torch.float16, torch.float32),
    ("bf16-master", torch.bfloat16, torch.float32)])
def test_fsdp_policy_follows_the_precision(name, param, reduce):
    precision = Precision(name, device="cpu")
    policy = precision.fsdp_policy()
    assert (policy.param_dtype, policy.reduce_dtype) == (param, reduce)
    assert precision.fsdp_policy(fp32=True).param_dtype is None


@pytest.mark.parametrize("name", ["16-true", "bf16-true"])
def test_fsdp_refuses_modes_without_fp32_weights(name):
    with pytest.raises(UserError, match="-mixed with --strategy fsdp"):
        Precision(name, device="cpu").fsdp_policy()


def test_fsdp_groups_blocks_and_keeps_fp32_modules_apart():
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    assert _shard_units(model) == [model[0], model[1], model[3]]
    fp32 = Precision("bf16-mixed", device="cpu", keep_fp32=["3"]).fsdp_fp32_modules(model)
    assert fp32 == [model[3], model[1]]
    assert Precision("32-true", device="cpu").fsdp_fp32_modules(model) == []


# ------------------------------------------------------------ DataParallel
class _AutocastProbe(nn.Module):
    """Records the autocast state its forward runs under."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 3)
        self.seen: list[tuple[bool, torch.dtype]] = []

    def forward(self, x):
        self.seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return self.linear(x)


def test_dp_applies_autocast_inside_the_replica_forward(caplog):
    probe = _AutocastProbe()
    with caplog.at_level("WARNING", logger="amptrain"):
        strategy = DataParallelStrategy(torch.device("cpu"))
    assert "DDP is faster" in caplog.text
    precision = Precision("bf16-mixed", device="cpu")
    strategy.prepare_model(probe, precision)
    wrapped = strategy.wrap(probe)
    assert isinstance(wrapped, nn.DataParallel)
    # DataParallel calls replicas from worker threads, where autocast state is not
    # inherited: run the wrapped module the same way, outside any autocast.
    outputs = []
    thread = threading.Thread(target=lambda: outputs.append(wrapped(torch.randn(4, 8))))
    thread.start()
    thread.join()
    assert probe.seen == [(True, torch.bfloat16)]
    assert outputs[0].dtype == torch.bfloat16
    # Control: an outer autocast does not reach a module called from another thread.
    with precision.autocast():
        thread = threading.Thread(target=lambda: probe(torch.randn(4, 8)))
        thread.start()
        thread.join()
    assert probe.seen[-1][0] is False


def test_dp_strategy_trains_through_the_trainer():
    probe = _AutocastProbe()
    trainer = Trainer(precision="bf16-mixed", device="cpu", strategy=DataParallelStrategy(
        torch.device("cpu")), no_progress=True, batch_size=32, epochs=1, max_steps=3)
    trainer.fit(probe, tiny_classification(n=96))
    assert isinstance(trainer.train_model, nn.DataParallel)
    assert trainer.step == 3 and probe.seen and all(s == (True, torch.bfloat16) for s in probe.seen)
