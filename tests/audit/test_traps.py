"""One planted loop per kind, audited in this process with ``amptrain.audit()``: each trap
is found, attributed to the line that planted it, and nothing else is found."""
from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from torch.optim.swa_utils import AveragedModel

import amptrain


def _line() -> str:
    """``this_file:N`` of the caller's line."""
    frame = inspect.currentframe().f_back
    return f"{__file__}:{frame.f_lineno}"


def _model(dtype=torch.float32):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                               torch.nn.Linear(16, 4)).to(dtype)


def _batch(dtype=torch.float32):
    return torch.randn(16, 8, dtype=dtype), torch.randint(0, 4, (16,))


def _only(report, kind):
    assert report.kinds() == [kind], report.format()
    return report.findings[0]


def test_half_optimizer_state():
    model = _model(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)    # updates of 0.1: none rounded away
    with amptrain.audit() as report:
        for _ in range(3):
            x, y = _batch(torch.bfloat16)
            F.cross_entropy(model(x).float(), y).backward()
            opt.step(); where = _line()  # noqa: E702 (the line is the one measured)
            opt.zero_grad()
    found = _only(report, "half-optimizer-state")
    assert found.severity == "error" and where in found.where and "0.weight" in found.where
    assert "4 of 4 parameters" in found.detail and "torch.bfloat16" in found.detail


def test_update_below_ulp():
    model = _model(torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)    # no state; updates ~1e-6 of ~0.1
    with amptrain.audit() as report:
        for _ in range(3):
            x, y = _batch(torch.bfloat16)
            F.cross_entropy(model(x).float(), y).backward()
            opt.step(); where = _line()  # noqa: E702 (the line is the one measured)
            opt.zero_grad()
    found = _only(report, "update-below-ulp")
    assert found.severity == "warning" and where in found.where
    assert "100.0 %" in found.detail and "torch.bfloat16" in found.detail


def test_fp32_weights_lose_no_update():
    # The same tiny lr on fp32 weights: the share is measured on half weights only.
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    with amptrain.audit() as report:
        x, y = _batch()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    assert report.findings == [] and report.steps == 1


def test_scaler_with_bf16():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with amptrain.audit() as report:
        scaler = torch.amp.GradScaler("cpu")
        for _ in range(2):
            x, y = _batch()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
            scaler.scale(loss).backward(); where = _line()  # noqa: E702 (the line is the one measured)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    found = _only(report, "scaler-with-bf16")
    assert where in found.where and "autocast ran in bfloat16" in found.detail


def test_half_ema_averaged_model_and_lerp():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    swa = AveragedModel(model, avg_fn=torch.optim.swa_utils.get_ema_avg_fn(0.999))
    swa.to(torch.bfloat16)
    ema = [p.detach().to(torch.bfloat16) for p in model.parameters()]
    with amptrain.audit() as report:
        for _ in range(4):
            x, y = _batch()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            swa.update_parameters(model); averaged = _line()  # noqa: E702 (the line is the one measured)
            with torch.no_grad():
                for e, p in zip(ema, model.parameters()):
                    e.lerp_(p.to(e.dtype), 0.001); lerped = _line()  # noqa: E702 (the line is the one measured)
    assert report.kinds() == ["half-ema"], report.format()
    wheres = [f.where for f in report.findings]
    assert any(averaged in w for w in wheres) and any(lerped in w for w in wheres), wheres
    assert all("torch.bfloat16" in f.detail and "lost to rounding" in f.detail
               for f in report.findings)


def test_fp32_ema_loses_nothing():
    model = _model()
    ema = [p.detach().clone() for p in model.parameters()]
    with amptrain.audit() as report:
        with torch.no_grad():
            for e, p in zip(ema, model.parameters()):
                e.lerp_(p + 1e-3, 0.001)
    assert report.findings == []


def test_half_loss():
    model = _model()
    with amptrain.audit() as report:
        x, y = _batch()
        logits = model(x).to(torch.float16)
        loss = F.cross_entropy(logits, y); where = _line()  # noqa: E702 (the line is the one measured)
        torch.softmax(logits.float(), dim=-1)       # fp32: nothing to say
    found = _only(report, "half-loss")
    assert where in found.where and "cross_entropy" in found.detail and "float16" in found.detail
    assert loss.dtype == torch.float16                # the script's own result, untouched


def test_a_loss_on_autocasts_fp32_list_is_fine():
    # Under CPU autocast cross_entropy is on the fp32 list: its result is float32. (CPU
    # autocast's list lacks log_softmax: a bf16 log_softmax there is found, as it should be.)
    model = _model()
    x, y = _batch()
    with amptrain.audit() as report:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
            F.log_softmax(model(x), dim=-1); where = _line()  # noqa: E702 (the line is the one measured)
    assert loss.dtype == torch.float32
    assert _only(report, "half-loss").where.endswith(where.rsplit("/", 1)[1] + ")")


def test_fp16_without_scaler():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with amptrain.audit() as report:
        x, y = _batch()
        with torch.autocast("cpu", dtype=torch.float16):
            where = _line(); loss = F.cross_entropy(model(x), y)  # noqa: E702 (the line is the one measured)
        loss.backward()
        opt.step()
    found = _only(report, "fp16-without-scaler")
    assert where.rsplit(":", 1)[0] in found.where


def test_a_loop_by_the_book_gets_nothing(tmp_path):
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.9)
    ema = AveragedModel(model)
    with amptrain.audit() as report:
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
        for _ in range(4):
            x, y = _batch()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = F.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            before = scaler.get_scale()
            scaler.step(opt)
            scaler.update()
            if scaler.get_scale() >= before:
                sched.step()
            opt.zero_grad()
            ema.update_parameters(model)
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                    "scaler": scaler.state_dict()}, tmp_path / "ck.pt")
        for _ in range(2):                        # bf16 autocast, no scaler
            x, y = _batch()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
    assert report.findings == [], report.format()
    assert report.steps == 6


def test_the_audit_puts_torch_back():
    saved = (torch.save, torch.Tensor.lerp_, torch.nn.utils.clip_grad_norm_,
             torch.amp.GradScaler.step, F.cross_entropy, torch.autocast.__enter__)
    with amptrain.audit():
        assert torch.save is not saved[0]
    assert (torch.save, torch.Tensor.lerp_, torch.nn.utils.clip_grad_norm_,
            torch.amp.GradScaler.step, F.cross_entropy, torch.autocast.__enter__) == saved

