"""inapplicable.py: an option that does nothing in the chosen setting says so in one
warning line (issue 28, class 6), and one that applies says nothing."""
from __future__ import annotations

import logging

import pytest
import torch

from amptrain import cli
from amptrain.trainer import Trainer
from tests.conftest import tiny_classification, tiny_mlp

# (id, Trainer options, a fragment of the one warning line, or None: no warning)
CASES = [
    ("momentum-with-adamw", dict(optimizer="adamw", momentum=0.5),
     "momentum applies to optimizer sgd only; optimizer adamw ignores it"),
    ("init-scale-with-bf16", dict(precision="bf16-mixed", init_scale=1024.0),
     "init_scale sets the loss scaler, which precision bf16-mixed does not use"),
    ("two-scaler-options-in-fp32", dict(precision="32-true", growth_interval=10,
                                        backoff_factor=0.25),
     "backoff_factor, growth_interval set the loss scaler, which precision 32-true"),
    ("momentum-with-sgd", dict(optimizer="sgd", momentum=0.5), None),
    ("init-scale-with-fp16", dict(precision="16-mixed", init_scale=1024.0), None),
]


@pytest.mark.parametrize("name,options,fragment", CASES, ids=[c[0] for c in CASES])
def test_an_option_that_does_nothing_is_one_warning(caplog, name, options, fragment):
    trainer = Trainer(device="cpu", no_progress=True, max_steps=1, batch_size=32, **options)
    with caplog.at_level(logging.WARNING, logger="amptrain"):
        trainer.fit(tiny_mlp(), tiny_classification(n=64))
    said = [r.getMessage() for r in caplog.records if "does not use" in r.getMessage()
            or "ignores it" in r.getMessage()]
    if fragment is None:
        assert said == []
    else:
        assert len(said) == 1 and fragment in said[0] and said[0].startswith("warning: ")


def test_momentum_with_your_own_optimizer_is_warned(caplog):
    model = tiny_mlp()
    with caplog.at_level(logging.WARNING, logger="amptrain"):
        Trainer(device="cpu", no_progress=True, max_steps=1, batch_size=32, momentum=0.5).fit(
            model, tiny_classification(n=64), optimizer=torch.optim.Adam(model.parameters()))
    assert any("your own optimizer ignores it" in r.getMessage() for r in caplog.records)


def test_resuming_a_kahan_run_with_plain_says_the_compensation_is_dropped(tmp_path, caplog):
    data = tiny_classification(n=64)
    common = dict(device="cpu", no_progress=True, batch_size=32, precision="bf16-true",
                  out=str(tmp_path / "run"))
    Trainer(max_steps=2, weight_update="kahan", **common).fit(tiny_mlp(), data)
    with caplog.at_level(logging.WARNING, logger="amptrain"):
        Trainer(max_steps=3, resume="auto", **common).fit(tiny_mlp(), data)
    said = [r.getMessage() for r in caplog.records if "weight-update state" in r.getMessage()
            or "weight_update" in r.getMessage()]
    assert len(said) == 1 and "kahan" in said[0] and "dropped" in said[0], said


def test_the_command_line_names_the_flag(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = cli.main(["train", "--model", "mlp", "--optimizer", "adamw", "--momentum", "0.5",
                     "--max-steps", "1", "--no-progress", "--out", str(tmp_path / "run")])
    assert code == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "warning:" in line]
    assert lines == ["amptrain: warning: --momentum applies to --optimizer sgd only; "
                     "--optimizer adamw ignores it"]


# Issue 36, class 7: more options that did nothing without a word.
MORE_CASES = [
    ("base-batch-size-without-lr-scaling", dict(base_batch_size=256),
     "base_batch_size is the batch size lr was tuned for, read by lr_scaling"),
    ("max-bad-steps-with-a-loss-scaler", dict(precision="16-mixed", max_bad_steps=3),
     "max_bad_steps stops a run without a loss scaler; precision 16-mixed has one"),
    ("base-batch-size-with-lr-scaling", dict(base_batch_size=32, lr_scaling="linear"), None),
    ("max-bad-steps-without-a-scaler", dict(precision="bf16-mixed", max_bad_steps=3), None),
]


@pytest.mark.parametrize("name,options,fragment", MORE_CASES, ids=[c[0] for c in MORE_CASES])
def test_more_options_that_do_nothing_are_one_warning(caplog, name, options, fragment):
    trainer = Trainer(device="cpu", no_progress=True, max_steps=1, batch_size=32, **options)
    with caplog.at_level(logging.WARNING, logger="amptrain"):
        trainer.fit(tiny_mlp(), tiny_classification(n=64))
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("warning: ")
            and "does not divide" not in r.getMessage()]
    if fragment is None:
        assert said == []
    else:
        assert len(said) == 1 and fragment in said[0], said


def test_optimizer_options_with_your_own_optimizer_are_warned(caplog):
    model = tiny_mlp()
    with caplog.at_level(logging.WARNING, logger="amptrain"):
        Trainer(device="cpu", no_progress=True, max_steps=1, batch_size=32, lr=0.5,
                weight_decay=0.1).fit(model, tiny_classification(n=64),
                                      optimizer=torch.optim.SGD(model.parameters(), lr=0.01))
    said = [r.getMessage() for r in caplog.records if "your own optimizer" in r.getMessage()]
    assert len(said) == 1 and "lr, weight_decay build amptrain's optimizer" in said[0]


def test_base_batch_size_without_lr_scaling_is_warned_on_the_command_line(tmp_path):
    from tests.commands.helpers import amptrain

    done = amptrain("train", "--model", "mlp", "--max-steps", "1", "--base-batch-size", "256",
                    "--out", str(tmp_path / "run"), "--no-progress", "--logger", "none")
    assert done.returncode == 0, done.stderr
    assert "amptrain: warning: --base-batch-size is the batch size --lr was tuned for" \
        in done.stderr


# Issue 33: the options a user gave are carried with the config, never guessed.
def test_a_config_built_from_options_carries_them_to_the_warning(caplog):
    from amptrain.config import TrainConfig

    config = TrainConfig.from_options(optimizer="adamw", momentum=0.9)  # 0.9: the default
    with caplog.at_level(logging.WARNING, logger="amptrain"):
        Trainer(config, device="cpu", no_progress=True, max_steps=1,
                batch_size=32).fit(tiny_mlp(), tiny_classification(n=64))
    assert any("momentum applies to optimizer sgd only" in r.getMessage()
               for r in caplog.records)


def test_a_value_nobody_gave_is_not_guessed_to_be_given(caplog):
    from amptrain.config import ScheduleConfig, TrainConfig

    config = TrainConfig(schedule=ScheduleConfig(optimizer="adamw", momentum=0.5))
    with caplog.at_level(logging.WARNING, logger="amptrain"):
        Trainer(config, device="cpu", no_progress=True, max_steps=1,
                batch_size=32).fit(tiny_mlp(), tiny_classification(n=64))
    assert not any("momentum" in r.getMessage() for r in caplog.records)


def test_a_flag_typed_at_its_default_value_is_given_too(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = cli.main(["train", "--model", "mlp", "--momentum", "0.9", "--max-steps", "1",
                     "--no-progress", "--out", str(tmp_path / "run")])
    assert code == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "warning:" in line]
    assert lines == ["amptrain: warning: --momentum applies to --optimizer sgd only; "
                     "--optimizer adamw ignores it"]
