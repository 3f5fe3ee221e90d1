"""DDP in real processes (gloo on CPU): the same training as one process, and end to end.

The multi-process scenarios run once per session under torchrun
(tests/distributed/worker.py) and are compared here with single-process runs.
"""
from __future__ import annotations

import json
import os
import re
import sys

import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, Subset

from amptrain import checkpoint
from amptrain.trainer.windows import SampleOrder
from amptrain.cli import build_parser
from amptrain.commands.common import merged_values
from amptrain.config import RunConfig, build_config
from amptrain.distributed import Strategy
from tests.conftest import tiny_classification, tiny_mlp
from tests.distributed import two_part_worker, worker
from tests.distributed.helpers import (
    ROOT,
    _assert_params_close,
    _reference,
    child_env,
    free_port,
    run,
    torchrun,
)


# --------------------------------------------------------- worker scenarios
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
    plan = SampleOrder(worker.SAMPLES, 32, 32, seed=0)
    indices = next(plan.epoch(0)).micro_indices[0]
    x, y = tiny_classification(n=worker.SAMPLES).tensors
    model = tiny_mlp()
    F.cross_entropy(model(x[indices]), y[indices]).backward()
    for got, want in zip(no_sync[1][0][2], [p.grad for p in model.parameters()]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    # Control: syncing every micro-batch makes the off-boundary gradients identical too,
    # so the inequality above is no_sync's doing.
    for (_, _boundary, grads0), (_, _, grads1) in zip(snaps[0]["always_sync"],
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
def test_a_nonfinite_forward_on_one_rank_is_traced_to_that_rank_and_module(scenarios):
    ranks = [scenarios("nonfinite", r) for r in (0, 1)]
    line = ("amptrain: step 3 on rank 1 turned non-finite: first in module '0' (forward: "
            "its output held inf/NaN; its inputs were finite)")
    assert line in ranks[0]["said"] and "turned non-finite" not in ranks[1]["said"]
    files = ranks[0]["files"]
    assert files == ranks[1]["files"] and set(files) == {"nonfinite.json",
                                                         "nonfinite.rank1.json"}
    assert files["nonfinite.rank1.json"] == {"step": 3, "rank": 1, "module": "0",
                                             "phase": "forward", "inputs_finite": True,
                                             "exact": True, "note": ""}
    own = files["nonfinite.json"]     # rank 0's replay was finite: it says where it began
    assert own["module"] is None and own["step"] == 3
    assert own["note"].endswith("it began on rank 1, in module '0'")
    assert all(r["skipped_steps"] == 1 for r in ranks)


@pytest.mark.slow
def test_without_agreement_the_ranks_diverge(scenarios):
    """The control for the test above: what found-inf agreement prevents."""
    ranks = [scenarios("found_inf", r)["disagree-16-mixed"] for r in (0, 1)]
    assert [r["skipped_steps"] for r in ranks] == [0, 1]
    assert [r["loss_scale"] for r in ranks] == [1024.0, 512.0]
    assert not torch.equal(ranks[0]["params"]["body.0.weight"], ranks[1]["params"]["body.0.weight"])


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
    from amptrain.workflows.runner import run_training

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


_RELEASED = """
import gc, sys
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from amptrain.config import RunConfig
from amptrain.workflows.runner import run_training

run_training(RunConfig.from_options(model="mlp", data="digits", max_steps=2, batch_size=32,
                                    no_progress=True, out=sys.argv[1]))
# Nothing may be left for the interpreter's shutdown to free: a DDP wrapper collected then
# still holds the gloo group, whose threads abort the process (see release_group).
left = [o for o in gc.get_objects() if isinstance(o, DistributedDataParallel)]
print("left", len(left), "initialized", dist.is_initialized(), flush=True)
"""


@pytest.mark.slow
def test_the_process_group_and_its_ddp_wrapper_are_gone_when_training_returns(tmp_path):
    """The cause of the teardown abort (rank 1: terminate called without an active
    exception): the DDP wrapper outlived destroy_process_group in the Trainer's reference
    cycles, so the gloo group's threads were still running when Python shut down."""
    script = tmp_path / "released.py"
    script.write_text(_RELEASED)
    result = torchrun(str(script), str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr[-6000:]
    assert result.stdout.count("left 0 initialized False") == 2, result.stdout[-2000:]


def _flags_to_values(args: list[str]) -> dict:
    parser = build_parser()
    return merged_values(parser.parse_args(["train", *args]))


@pytest.mark.slow
def test_lm_run_under_two_processes_equals_one_process(tmp_path):
    """A gpt on text: the two ranks' blocks of each global batch are the one process's
    batch, so the weights after a few steps and the validation perplexity agree."""
    from tests.tasks.test_lm import write_corpus

    corpus = write_corpus(tmp_path / "corpus.txt", repeats=20)
    args = ["--model", "gpt:layers=1,heads=2,width=32", "--data", f"text:{corpus}",
            "--seq-len", "16", "--precision", "32-true", "--batch-size", "16", "--max-steps",
            "6", "--lr", "3e-3", "--log-every", "3", "--no-progress", "--device", "cpu"]
    two = torchrun("-m", "amptrain", "train", *args, "--out", str(tmp_path / "two"))
    assert two.returncode == 0, two.stderr[-6000:]
    one = run([sys.executable, "-m", "amptrain", "train", *args, "--out", str(tmp_path / "one")],
              child_env())
    assert one.returncode == 0, one.stderr[-6000:]
    states = [checkpoint.load(tmp_path / d / "checkpoints" / "last.pt") for d in ("one", "two")]
    assert states[1]["config"]["world_size"] == 2 and states[1]["task"]["name"] == "lm"
    _assert_params_close(states[1]["model"], states[0]["model"], 1e-4, 1e-5)
    vals = [[json.loads(line) for line in (tmp_path / d / "metrics.jsonl").open()
             if "val_perplexity" in line][-1] for d in ("one", "two")]
    assert vals[1]["val_perplexity"] == pytest.approx(vals[0]["val_perplexity"], rel=1e-4)


# ------------------------------------------------- several parts (a two-part task)
@pytest.fixture(scope="module")
def two_part_ranks(tmp_path_factory):
    """tests/distributed/two_part_worker.py on 2 processes: each rank's observations."""
    out = tmp_path_factory.mktemp("two_part")
    result = torchrun(str(ROOT / "tests" / "distributed" / "two_part_worker.py"), str(out))
    if result.returncode != 0:
        pytest.fail(f"two-part worker failed ({result.returncode}):\n{result.stderr[-6000:]}")
    return [torch.load(out / f"two_part-rank{r}.pt", weights_only=False) for r in (0, 1)]


def _tensors(state):
    """Every tensor of a nested state (optimizer states), in order."""
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        return [t for k in sorted(state, key=str) for t in _tensors(state[k])]
    if isinstance(state, (list, tuple)):
        return [t for v in state for t in _tensors(v)]
    return []


@pytest.mark.slow
@pytest.mark.parametrize("precision,accumulate,options", two_part_worker.RUNS,
                         ids=[two_part_worker.run_name(p, a) for p, a, _ in two_part_worker.RUNS])
def test_two_parts_each_with_its_own_ddp_wrapper_equal_one_process(
        two_part_ranks, precision, accumulate, options):
    name = two_part_worker.run_name(precision, accumulate)
    ranks = [r[name] for r in two_part_ranks]
    # Replicas bitwise equal: weights of both parts, both optimizers' states, the skips
    # and the loss scale (the found-inf flag agreed across ranks per optimizer).
    for key, value in ranks[0]["params"].items():
        assert torch.equal(value, ranks[1]["params"][key]), key
    for a, b in zip(_tensors(ranks[0]["optimizers"]), _tensors(ranks[1]["optimizers"])):
        assert torch.equal(a, b)
    assert ranks[0]["skipped"] == ranks[1]["skipped"]
    assert ranks[0]["loss_scale"] == ranks[1]["loss_scale"]
    reference = two_part_worker.fit(None, precision, accumulate, **options)
    ref = two_part_worker.observe(reference)
    assert ranks[0]["steps"] == ref["steps"] == two_part_worker.SAMPLES // 32
    assert ranks[0]["skipped"] == ref["skipped"]
    assert ranks[0]["loss_scale"] == ref["loss_scale"]
    if precision == "16-mixed":  # the first steps overflowed: D's and G's alike, on both
        assert ref["skipped"]["discriminator"] > 0 and ref["skipped"]["generator"] > 0
    else:
        assert ref["skipped"] == {"discriminator": 0, "generator": 0}
    # 32-true: the two processes sum the same fp32 gradients in another order (each rank
    # its half, then the all-reduce): differences at fp32 rounding, grown a little over 12
    # Adam steps. 16-mixed: each rank's forward/backward rounds its half-batch's matmuls
    # to fp16 (10 mantissa bits) where one process rounds the whole batch's: still far
    # below what training moves (asserted: > 5e-2).
    rtol, atol = (1e-5, 1e-6) if precision == "32-true" else (5e-3, 1e-3)
    init = two_part_worker.ToyGan().state_dict()
    for key, value in ref["params"].items():
        torch.testing.assert_close(ranks[0]["params"][key], value, rtol=rtol, atol=atol,
                                   msg=key)
    moved = max((ref["params"][k] - init[k]).abs().max().item() for k in init)
    assert moved > 5e-2, moved
    for got, want in zip(ranks[0]["records"], ref["records"]):
        assert got.keys() == want.keys()
        assert got["d_loss"] == pytest.approx(want["d_loss"], rel=1e-2)
        assert got["g_loss"] == pytest.approx(want["g_loss"], rel=1e-2)


def test_each_part_has_its_own_wrapper_and_no_sync_finds_it_through_compile():
    """wrapper_of: the wrapper a forward is (or holds through torch.compile); no_sync is
    that wrapper's (without a process group: wrappers stand-ins)."""
    from amptrain.distributed import DDPStrategy

    strategy = DDPStrategy.__new__(DDPStrategy)
    strategy.wrappers = []
    assert strategy.ddp is None and strategy.wrapper_of(torch.nn.Linear(1, 1)) is None

    class Wrapper(torch.nn.Module):  # a DDP stand-in: no process group here
        def __init__(self):
            super().__init__()
            self.synced = []

        def no_sync(self):
            import contextlib

            self.synced.append(False)
            return contextlib.nullcontext()

    d, g = Wrapper(), Wrapper()
    strategy.wrappers = [d, g]

    class Compiled(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self._orig_mod = inner

    assert strategy.wrapper_of(d) is d and strategy.wrapper_of(Compiled(g)) is g
    assert strategy.ddp is g  # the last made; a forward we did not wrap falls back to it
    assert strategy.wrapper_of(torch.nn.Linear(1, 1)) is g
    with strategy.accumulation_context(Compiled(d), boundary=False):
        pass
    with strategy.accumulation_context(g, boundary=True):
        pass
    assert d.synced == [False] and g.synced == []
