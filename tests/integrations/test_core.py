"""The callbacks' shared part on a plain model: sampled range recording (nothing taken on
unsampled steps, gradients unscaled), bounded non-finite checks, options, versions."""
from __future__ import annotations

import pytest
import torch

from amptrain.common.errors import UserError
from amptrain.integrations.core import DiagnoseOptions, DiagnoseSession, check_version

from .models import Overflowing


@pytest.fixture(autouse=True)
def _detached(monkeypatch):
    """Detach every session a test attached, last first: an attached session's audit keeps
    torch's training functions wrapped (the HF and Lightning callbacks detach at the end
    of training; these tests drive the session by hand)."""
    attached: list[DiagnoseSession] = []
    attach = DiagnoseSession.attach

    def recording(self, *args, **kwargs):
        attached.append(self)
        return attach(self, *args, **kwargs)

    monkeypatch.setattr(DiagnoseSession, "attach", recording)
    yield
    for session in reversed(attached):
        session.detach()


def _steps(session: DiagnoseSession, model, steps: int, scaler=None, start: int = 0) -> None:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 8, generator=g), torch.randint(0, 3, (8,), generator=g)
    for step in range(start, start + steps):
        session.step_begin(step, scaler)
        loss = model(x, y)["loss"]
        (scaler.scale(loss) if scaler is not None else loss).backward()
        session.before_optimizer_step(model.parameters())
        if scaler is not None:  # no optimizer here: the scaler only checks and updates
            scaler.unscale_(torch.optim.SGD(model.parameters(), lr=0.0))
            scaler.update()
        model.zero_grad()
        session.step_end()


def test_ranges_are_recorded_on_sampled_steps_only(tmp_path):
    model = Overflowing(1e5)
    session = DiagnoseSession(DiagnoseOptions(every=3, out_dir=str(tmp_path), verbose=False))
    session.attach(model, precision="32-true", trainer="test", out_dir=None)
    _steps(session, model, 7)
    assert session.sampled_steps == 3  # steps 0, 3, 6
    stats = session._recorder.read()
    # 8 samples x 16 features per sampled step reach the histogram, nothing more.
    assert stats["scale"]["activation"]["values_sampled"] == 3 * 8 * 16
    json_path, md_path = session.finish()
    assert json_path.parent == tmp_path and "keep in fp32: scale" in md_path.read_text()
    assert all(not m._forward_hooks for m in model.modules())


def test_gradients_are_recorded_unscaled():
    model = Overflowing(1.0)
    plain = DiagnoseSession(DiagnoseOptions(verbose=False))
    plain.attach(model, precision="32-true", trainer="test", out_dir=None)
    _steps(plain, model, 1)
    expected = plain._recorder.read()["head"]["gradient"]["abs_max"]
    plain.detach()
    model.zero_grad()

    scaled = DiagnoseSession(DiagnoseOptions(verbose=False))
    scaled.attach(model, precision="16-mixed", trainer="test", out_dir=None)
    _steps(scaled, model, 1, torch.amp.GradScaler("cpu", init_scale=1024.0))
    assert scaled._recorder.read()["head"]["gradient"]["abs_max"] == pytest.approx(expected)


def test_nonfinite_checks_stay_bounded_and_keep_the_first():
    model = Overflowing(1e39)
    session = DiagnoseSession(DiagnoseOptions(check_every=2, verbose=False))
    session.attach(model, precision="32-true", trainer="test", out_dir=None)
    _steps(session, model, 5)
    assert session.first.module == "scale" and session.first.step == 1
    assert len(session._watch._peaks) <= 2 * 2 * len(list(model.modules()))


def test_a_first_inf_on_an_unwatched_step_is_named_when_it_recurs():
    model = Overflowing(1.0)
    session = DiagnoseSession(DiagnoseOptions(every=100, check_every=2, verbose=False))
    session.attach(model, precision="32-true", trainer="test", out_dir=None)
    _steps(session, model, 2)
    model.scale.factor = 1e39  # from the third step on, the layer overflows fp32
    _steps(session, model, 4, start=2)
    assert session.first_bad_step == 3
    assert (session.first.module, session.first.phase, session.first.step) == (
        "scale", "forward", 5)  # armed after the check at step 4, named at step 5
    report = session.report()
    assert report["first_nonfinite_step"] == 3


def test_watch_every_step_names_the_very_first():
    model = Overflowing(1.0)
    session = DiagnoseSession(DiagnoseOptions(every=100, check_every=2, verbose=False,
                                              watch_every_step=True))
    session.attach(model, precision="32-true", trainer="test", out_dir=None)
    _steps(session, model, 2)
    model.scale.factor = 1e39
    _steps(session, model, 2, start=2)
    assert session.first.step == session.first_bad_step == 3


def test_options_and_versions():
    with pytest.raises(UserError, match="check_every"):
        DiagnoseOptions(check_every=0)
    with pytest.raises(UserError, match=r"needs lightning>=2\.0 \(found lightning 1\.9\.5\)"):
        check_version("lightning", "1.9.5", (2, 0), "DiagnoseCallback")
    check_version("lightning", "2.6.6", (2, 0), "DiagnoseCallback")
