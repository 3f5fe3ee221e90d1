"""FSDP2: training in real processes, checkpoints that load on one device, the policy.

Run as a script under torchrun, this module is also the worker of the sharded-checkpoint
test (``python -m torch.distributed.run --nproc-per-node 2 tests/distributed/test_fsdp.py
OUT``).
"""
from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":  # the worker: this checkout first on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pytest
import torch
from torch import nn

from amptrain import checkpoint
from amptrain.distributed.fsdp import _shard_units, fsdp_fp32_modules, fsdp_policy
from amptrain.common.errors import UserError
from amptrain.precision import Precision
from tests.conftest import tiny_mlp
from tests.distributed import worker
from tests.distributed.helpers import _assert_params_close, _reference, torchrun


# --------------------------------------------------------- worker scenarios
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


# ------------------------------------------------------------- unit checks
@pytest.mark.parametrize("name,param,reduce", [
    ("32-true", None, torch.float32), ("16-mixed", torch.float16, torch.float32),
    ("bf16-mixed", torch.bfloat16, torch.float32), ("16-master", torch.float16, torch.float32),
    ("bf16-master", torch.bfloat16, torch.float32)])
def test_fsdp_policy_follows_the_precision(name, param, reduce):
    precision = Precision(name, device="cpu")
    policy = fsdp_policy(precision)
    assert (policy.param_dtype, policy.reduce_dtype) == (param, reduce)
    assert fsdp_policy(precision, fp32=True).param_dtype is None


@pytest.mark.parametrize("name", ["16-true", "bf16-true"])
def test_fsdp_refuses_modes_without_fp32_weights(name):
    with pytest.raises(UserError, match="-mixed with --strategy fsdp"):
        fsdp_policy(Precision(name, device="cpu"))


def test_fsdp_groups_blocks_and_keeps_fp32_modules_apart():
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    assert _shard_units(model) == [model[0], model[1], model[3]]
    fp32 = fsdp_fp32_modules(Precision("bf16-mixed", device="cpu", keep_fp32=["3"]), model)
    assert fp32 == [model[3], model[1]]
    assert fsdp_fp32_modules(Precision("32-true", device="cpu"), model) == []


# ------------------------------------------------------- sharded checkpoints
class _Crash(Exception):
    """Ends a run on every rank at once (a crash the ranks agree on)."""


class _CrashAfter:
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, trainer) -> None:
        if trainer.step == self.step:
            raise _Crash(f"crashed after step {trainer.step}")


def _sharded_worker(out: Path) -> None:
    """Every rank: a run that saves sharded at step 3 and crashes after step 4, resumed to
    step 6 (by ``--resume auto`` and by the ``step-3`` directory), and a straight run."""
    import torch.distributed as dist

    from amptrain.distributed import FSDPStrategy, build_strategy
    from amptrain.trainer import Trainer

    torch.set_num_threads(1)
    group = build_strategy("ddp", "cpu")  # joins torchrun's process group (gloo)
    rank = group.rank
    options = {**worker.COMMON, "precision": "32-true", "optimizer": "adamw", "lr": 0.01,
               "max_steps": 6}

    def fit(run: Path, callbacks=(), **more):
        trainer = Trainer(strategy=FSDPStrategy(torch.device("cpu")), out=str(run),
                          callbacks=callbacks, **{**options, **more})
        trainer.fit(tiny_mlp(), worker.tiny_classification(n=worker.SAMPLES))
        return trainer

    try:
        result: dict = {}
        crashed = out / "crashed"
        try:
            fit(crashed, callbacks=[_CrashAfter(4)], save_every=3)
        except _Crash:
            pass
        dist.barrier()  # rank 0 publishes once its own wait returns
        directory = crashed / "checkpoints"
        result["after_crash"] = sorted(str(p.relative_to(directory))
                                       for p in directory.rglob("*"))
        if rank == 0:  # a second copy, resumed from the step-3 directory by its path
            import shutil

            shutil.copytree(crashed, out / "by-path")
        dist.barrier()
        resumed = fit(crashed, save_every=3, resume="auto")
        by_path = fit(out / "by-path", save_every=3,
                      resume=str(out / "by-path" / "checkpoints" / "sharded" / "step-3"))
        straight = fit(out / "straight")
        result.update(resumed=worker.params(resumed), by_path=worker.params(by_path),
                      straight=worker.params(straight),
                      steps=(resumed.step, by_path.step, straight.step),
                      first_logged=[min(r["step"] for r in t.history if "loss" in r)
                                    for t in (resumed, by_path, straight)])
        torch.save(result, out / f"sharded-rank{rank}.pt")
        dist.barrier()
    finally:
        group.teardown()


@pytest.mark.slow
def test_fsdp_sharded_checkpoint_resumes_bitwise(tmp_path):
    done = torchrun(str(Path(__file__).resolve()), str(tmp_path))
    assert done.returncode == 0, done.stderr[-6000:]
    for rank in (0, 1):
        result = torch.load(tmp_path / f"sharded-rank{rank}.pt", weights_only=False)
        # The crash left the sharded step 3 (published: no temporary directory) and no
        # full checkpoint; every rank wrote its own shard file.
        assert "sharded/latest" in result["after_crash"]
        assert "sharded/step-3/.metadata" in result["after_crash"]
        assert "sharded/step-3/state.pt" in result["after_crash"]
        assert len([p for p in result["after_crash"] if p.endswith(".distcp")]) == 2
        assert not [p for p in result["after_crash"] if ".tmp" in p or p.endswith(".pt")
                    and not p.startswith("sharded/")]
        assert result["steps"] == (6, 6, 6)
        assert result["first_logged"] == [4, 4, 1]  # both resumed after step 3
        for name, value in result["straight"].items():
            assert torch.equal(result["resumed"][name], value), name
            assert torch.equal(result["by_path"][name], value), name
    # The end of the run wrote one full checkpoint, which loads on one device.
    state = checkpoint.load(tmp_path / "crashed" / "checkpoints" / "last.pt")
    assert state["step"] == 6
    model = tiny_mlp()
    model.load_state_dict(state["model"])
    for name, value in model.state_dict().items():
        assert torch.equal(value, torch.load(tmp_path / "sharded-rank0.pt",
                                             weights_only=False)["straight"][name]), name


if __name__ == "__main__":
    _sharded_worker(Path(sys.argv[1]))
