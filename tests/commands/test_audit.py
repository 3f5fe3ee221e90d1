"""``amptrain audit -- python SCRIPT`` as a user runs it: real scripts written here, run as
real subprocesses under the audit (few and tiny: each costs an interpreter start)."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from amptrain.audit import KINDS

from .helpers import REPO, amptrain

#: A loop with three independent traps, each on its own line (see TRAP_LINES).
TRAPS = '''\
import torch
torch.manual_seed(0)
model = torch.nn.Linear(8, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.9)
for step in range(4):
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model(torch.randn(4, 8)).square().mean()
    if step == 1:
        loss = loss * float("inf")      # a step the scaler skips
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    sched.step()
    opt.zero_grad()
torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, "ck.pt")
'''
TRAP_LINES = {"clip-before-unscale": 13, "scheduler-on-skipped-step": 16,
              "checkpoint-without-scaler": 18}

#: A loop by the book: 32-true with clipping, a schedule, an fp32 EMA and a checkpoint; fp16
#: autocast with a GradScaler used right; bf16 autocast without one. Prints each loss bit for bit.
CLEAN = '''\
import sys
import torch
import torch.nn.functional as F
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.9)
ema = torch.optim.swa_utils.AveragedModel(model)
data = [(torch.randn(16, 8), torch.randint(0, 4, (16,))) for _ in range(4)]
for x, y in data:                                    # 32-true
    loss = F.cross_entropy(model(x), y)
    print("32", loss.item().hex(), flush=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step(); sched.step(); opt.zero_grad(); ema.update_parameters(model)
torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, "ck32.pt")
if "--fp32-only" in sys.argv:
    sys.exit(3)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
for x, y in data:                                    # fp16 autocast, by the book
    with torch.autocast("cpu", dtype=torch.float16):
        loss = F.cross_entropy(model(x), y)
    print("16", loss.item().hex(), flush=True)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    before = scaler.get_scale()
    scaler.step(opt); scaler.update()
    if scaler.get_scale() >= before:
        sched.step()
    opt.zero_grad()
torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
            "scaler": scaler.state_dict()}, "ck16.pt")
for x, y in data:                                    # bf16 autocast, no scaler
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x), y)
    print("bf16", loss.item().hex(), flush=True)
    loss.backward(); opt.step(); opt.zero_grad()
'''


#: Two ranks under torchrun (gloo): a clip before unscale_ and a DCP save without the scaler.
DDP = '''\
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
for step in range(3):
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model(torch.randn(4, 8)).square().mean()
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
dcp.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, checkpoint_id="ckpt")
print("rank", dist.get_rank(), "saved", flush=True)
dist.destroy_process_group()
'''


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("audit-scripts")
    (folder / "traps.py").write_text(TRAPS)
    (folder / "clean.py").write_text(CLEAN)
    (folder / "ddp.py").write_text(DDP)
    return folder


@pytest.mark.slow
def test_three_planted_traps_are_found_each_at_its_line(scripts):
    done = amptrain("audit", "--json", "out.json", "--", sys.executable, "traps.py", cwd=scripts)
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]   # clip-before-unscale
    findings = json.loads((scripts / "out.json").read_text())["findings"]
    assert sorted(f["kind"] for f in findings) == sorted(TRAP_LINES)
    for f in findings:
        assert f["where"].endswith(f"traps.py:{TRAP_LINES[f['kind']]})"), f
        assert f["detail"] and f["fix"] and f["severity"] in ("error", "warning")
    clip = next(f for f in findings if f["kind"] == "clip-before-unscale")
    assert clip["severity"] == "error" and "loss scale 256" in clip["detail"]
    assert "1 of 4 scheduler steps" in next(
        f for f in findings if f["kind"] == "scheduler-on-skipped-step")["detail"]
    assert "error: clip-before-unscale at clip_grad_norm_" in done.stdout


@pytest.mark.slow
def test_a_loop_by_the_book_gets_nothing_and_its_losses_are_bitwise_the_same(scripts):
    plain = subprocess.run([sys.executable, "clean.py"], cwd=scripts, capture_output=True,
                           text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr[-2000:]
    audited = amptrain("audit", "--json", "clean.json", "--", sys.executable, "clean.py",
                       cwd=scripts)
    assert audited.returncode == 0, audited.stdout + audited.stderr[-2000:]
    losses = [line for line in plain.stdout.splitlines()
              if line.startswith(("32 ", "16 ", "bf16 "))]
    assert len(losses) == 12
    # The script's own lines come first, bit for bit; then the audit's.
    assert audited.stdout.startswith("\n".join(losses) + "\n")
    assert "no findings (12 optimizer steps observed)" in audited.stdout
    assert json.loads((scripts / "clean.json").read_text()) == {"findings": []}


@pytest.mark.slow
def test_steps_ends_the_script_cleanly_and_a_failure_passes_through(scripts, tmp_path,
                                                                     monkeypatch):
    stopped = amptrain("audit", "--steps", "2", "--", sys.executable, "clean.py", "--fp32-only",
                       cwd=scripts)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr[-2000:]
    assert [line[:3] for line in stopped.stdout.splitlines() if line.startswith("32 ")] \
        == ["32 "] * 2
    assert "ended the script after 2 optimizer steps" in stopped.stdout
    # The environment's own sitecustomize still runs (the audit's shadows it and chains it).
    (tmp_path / "sitecustomize.py").write_text("print('the user sitecustomize ran')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    failed = amptrain("audit", "--", sys.executable, "clean.py", "--fp32-only", cwd=scripts)
    assert failed.returncode == 3
    assert failed.stdout.startswith("the user sitecustomize ran\n")
    assert failed.stdout.splitlines()[-1] == "amptrain audit: the command exited with status 3"
    assert "no findings (4 optimizer steps observed)" in failed.stdout


def test_user_errors_are_one_line(tmp_path):
    (tmp_path / "taken.json").write_text("{}")
    for args, message in [
            (["audit"], "needs a command after `--`"),
            (["audit", "python", "x.py"], "is not a run directory"),
            (["audit", "--json", "taken.json", "--", "python", "x.py"], "exists already"),
            (["audit", "--steps", "0", "--", "python", "x.py"], "--steps must be"),
            (["audit", "--", "no-such-program-here"], "no such command")]:
        done = amptrain(*args, cwd=tmp_path)
        assert done.returncode == 2, (args, done.stderr)
        assert message in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert (tmp_path / "taken.json").read_text() == "{}"


def test_every_kind_is_planted_in_a_test():
    # The in-process loops (tests/audit/test_traps.py) and the script above, together.
    traps = (REPO / "tests" / "audit" / "test_traps.py").read_text()
    planted = set(re.findall(r'_only\(report, "([a-z0-9-]+)"\)', traps))
    planted |= set(re.findall(r'kinds\(\) == \["([a-z0-9-]+)"\]', traps)) | set(TRAP_LINES)
    assert planted == set(KINDS)


@pytest.mark.slow
def test_every_torchrun_rank_is_watched_and_a_dcp_save_is_judged(scripts):
    from tests.distributed.helpers import free_port

    done = amptrain("audit", "--json", "ddp.json", "--", sys.executable, "-m",
                    "torch.distributed.run", "--nproc-per-node", "2", "--nnodes", "1",
                    "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "ddp.py",
                    cwd=scripts, timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    assert "rank 0 saved" in done.stdout and "rank 1 saved" in done.stdout
    findings = json.loads((scripts / "ddp.json").read_text())["findings"]
    # each rank found both; each finding is reported once
    assert sorted((f["kind"], f["where"].rsplit(":", 1)[-1].rstrip(")")) for f in findings) == \
        [("checkpoint-without-scaler", "17"), ("clip-before-unscale", "13")]
