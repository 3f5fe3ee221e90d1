"""trainer/core.py: the loop (accumulation maths, clipping, skipping, every precision end to
end, batches of any shape, compile) and what the library refuses before it trains."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from amptrain.data import TensorData
from amptrain.models import MLP
from amptrain.trainer import Trainer
from tests.conftest import tiny_classification, tiny_mlp


def _fit(data, **options):
    model = tiny_mlp()
    options = {"precision": "32-true", "device": "cpu", "no_progress": True, "epochs": 1,
               "scheduler": "none", **options}
    trainer = Trainer(**options)
    trainer.fit(model, data)
    return trainer, model


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_accumulation_equals_one_big_batch_including_partial_window(optimizer):
    data = tiny_classification(n=200)  # 200 = 3 x 64 + 8: the last window is partial
    common = dict(batch_size=64, optimizer=optimizer, lr=0.05, epochs=2)
    _, whole = _fit(data, accumulate=1, **common)
    trainer, accumulated = _fit(data, accumulate=4, **common)
    _, uneven = _fit(data, micro_batch_size=32, **common)
    assert trainer.accumulate == 4 and trainer.micro_batch_size == 16
    for a, b, c in zip(whole.parameters(), accumulated.parameters(), uneven.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-6)


def test_steps_count_optimizer_steps_not_micro_batches():
    data = tiny_classification(n=256)
    trainer, _ = _fit(data, batch_size=32, accumulate=4, max_steps=5, log_every=1)
    steps = [r["step"] for r in trainer.history if "loss" in r]
    assert steps == [1, 2, 3, 4, 5]
    assert trainer.step == 5


def test_grad_norm_is_logged_unscaled_in_fp16():
    data = tiny_classification(n=128)
    norms = {}
    for name in ("32-true", "16-mixed"):
        trainer, _ = _fit(data, precision=name, batch_size=64, max_steps=2, log_every=1,
                          clip_grad_norm=0.5)
        norms[name] = [r["grad_norm"] for r in trainer.history if "grad_norm" in r]
        if name == "16-mixed":
            assert trainer.history[0]["loss_scale"] == 65536.0
    assert norms["32-true"][0] > 0.5  # clipping was active
    torch.testing.assert_close(torch.tensor(norms["16-mixed"]), torch.tensor(norms["32-true"]),
                               rtol=2e-2, atol=0)


class _InfAt:
    """Poisons the gradient of the first layer on chosen optimizer steps."""

    def __init__(self, model, steps, trainer_ref):
        self.steps, self.trainer = set(steps), trainer_ref
        model.body[0].weight.register_hook(self._hook)

    def _hook(self, grad):
        if self.trainer[0].step in self.steps:
            return torch.full_like(grad, float("inf"))
        return grad


def test_fp16_skipped_step_does_not_advance_lr_schedule():
    data = tiny_classification(n=256)
    model = tiny_mlp()
    trainer = Trainer(precision="16-mixed", device="cpu", no_progress=True, batch_size=32,
                      epochs=1, scheduler="cosine", log_every=1, lr=0.01, init_scale=1024.0)
    _InfAt(model, {3}, [trainer])
    trainer.fit(model, data)
    logs = [r for r in trainer.history if "loss" in r]
    assert [r["skipped_steps"] for r in logs][2:4] == [0, 1]
    assert logs[3]["loss_scale"] == 512.0
    # The schedule is 8 steps long; one skip means the last step ran at the lr of step 7.
    lrs = [r["lr"] for r in logs]
    assert lrs[3] == lrs[2]  # the lr after the skipped step is the lr it would have used
    assert trainer.scheduler.last_epoch == 7


PRECISIONS = ["32-true", "tf32", "16-mixed", "bf16-mixed", "16-master", "bf16-master",
              "16-true", "bf16-true"]


@pytest.mark.parametrize("precision", PRECISIONS)
def test_every_precision_learns_digits(digits, precision, tmp_path):
    torch.manual_seed(0)
    model = MLP(64, 10, hidden=128)
    trainer = Trainer(precision=precision, device="cpu", no_progress=True, batch_size=32,
                      epochs=4, lr=3e-3, out=str(tmp_path))
    result = trainer.fit(model, digits.train, digits.val, class_names=digits.class_names)
    assert result.val_metrics["acc"] > 0.90, result
    expected = {"16-master": torch.float16, "bf16-master": torch.bfloat16,
                "16-true": torch.float16, "bf16-true": torch.bfloat16}.get(precision, torch.float32)
    assert model.head.weight.dtype == expected
    if precision.endswith("master"):
        assert all(p.dtype == torch.float32 for g in trainer.optimizer.param_groups
                   for p in g["params"])


def test_hf_style_outputs_and_dict_batches():
    class HFStyle(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = tiny_mlp()

        def forward(self, inputs, labels=None):
            logits = self.net(inputs)
            loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
            return {"loss": loss, "logits": logits}

    data = tiny_classification(n=96)
    batches = [{"inputs": data.tensors[0][i:i + 32], "labels": data.tensors[1][i:i + 32]}
               for i in range(0, 96, 32)]
    trainer = Trainer(precision="bf16-mixed", device="cpu", no_progress=True, batch_size=32,
                      epochs=2, log_every=1)
    result = trainer.fit(HFStyle(), batches, batches)
    assert result.steps == 6 and result.val_metrics["acc"] is not None


def test_user_dataloader_partial_last_window_normalised_by_samples():
    from torch.utils.data import DataLoader

    data = tiny_classification(n=80)
    whole_model, accumulated_model = tiny_mlp(), tiny_mlp()
    # 80 samples: batches of 16 -> windows of 3, 2 batches; one big batch of 48 then 32.
    small = DataLoader(data, batch_size=16, shuffle=False)
    big = DataLoader(data, batch_size=48, shuffle=False)
    common = dict(precision="32-true", device="cpu", no_progress=True, epochs=1,
                  scheduler="none", optimizer="sgd", lr=0.1)
    Trainer(batch_size=48, accumulate=3, **common).fit(accumulated_model, small)
    Trainer(batch_size=48, **common).fit(whole_model, big)
    for a, b in zip(whole_model.parameters(), accumulated_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_compile_trains_the_same_model_as_eager(precision):
    # torch.compile on the CPU generates C++ with the system compiler (Inductor).
    data = tiny_classification(n=128)
    common = dict(precision=precision, batch_size=32, optimizer="sgd", lr=0.1, epochs=2)
    _, eager = _fit(data, **common)
    compiled_trainer, compiled = _fit(data, compile=True, **common)
    assert type(compiled_trainer.train_model).__name__ == "OptimizedModule"
    tolerance = dict(rtol=1e-4, atol=1e-5) if precision == "32-true" else dict(rtol=0.05, atol=0.02)
    for a, b in zip(eager.parameters(), compiled.parameters()):
        torch.testing.assert_close(a, b, **tolerance)
    assert compiled_trainer.precision.skipped_steps == 0


# ------------------------------------------------ the library does not surprise its caller
def _mlp3():
    return tiny_mlp(features=8, classes=3)


def _loader(samples):
    return torch.utils.data.DataLoader(samples, batch_size=16)


LIBRARY_HOSTILE = [
    # (id, Trainer keywords, fit arguments as a function of (data, model), fragment)
    ("unknown-keyword", dict(lrr=0.1), None, "unknown keyword 'lrr' for Trainer"),
    ("lr-word", dict(lr="fast"), None, "lr must be a number (got 'fast')"),
    ("out-number", dict(out=123), None, "out must be a string (got int 123)"),
    ("seed-too-big", dict(seed=2 ** 70), None, "seed must be an integer from 0"),
    ("model-none", {}, lambda d, m: dict(model=None, train_data=d), "model must be a torch.nn"),
    ("data-none", {}, lambda d, m: dict(model=m, train_data=None), "train_data must be a Data"),
    ("empty-train", {}, lambda d, m: dict(model=m, train_data=TensorData(*(t[:0] for t in
                                                                         d.tensors))),
     "train_data is empty"),
    ("empty-val", {}, lambda d, m: dict(model=m, train_data=d, val_data=TensorData(
        *(t[:0] for t in d.tensors))), "val_data is empty"),
    ("float-labels", dict(task="classification"), lambda d, m: dict(model=m, train_data=TensorData(
        d.tensors[0], d.tensors[1].float())), "labels are float32"),
    # task auto: float targets are regression, and 3 outputs do not fit one value
    ("float-labels-auto", {}, lambda d, m: dict(model=m, train_data=TensorData(
        d.tensors[0], d.tensors[1].float())), "regression targets have 1"),
    ("regression-int-labels", dict(task="regression"), lambda d, m: dict(model=m, train_data=d),
     "integer class labels"),
    ("lm-class-labels", dict(task="lm"), lambda d, m: dict(model=m, train_data=d),
     "task lm needs token sequences"),
    ("loss-classification", dict(loss="l1"), lambda d, m: dict(model=m, train_data=d),
     "loss l1 applies to regression"),
    ("task-object", {}, lambda d, m: dict(model=m, train_data=d, task="lm"),
     "task must be an amptrain.tasks.Task"),
    ("labels-beyond-outputs", {}, lambda d, m: dict(model=m, train_data=TensorData(
        d.tensors[0], d.tensors[1] + 3)), "outside the model's 3 outputs"),
    ("labels-beyond-outputs-in-a-loader", {}, lambda d, m: dict(
        model=m, train_data=torch.utils.data.DataLoader(TensorData(d.tensors[0],
                                                                   d.tensors[1] + 3),
                                                        batch_size=16)),
     "outside the model's 3 outputs"),
    ("nan-features", {}, lambda d, m: dict(model=m, train_data=TensorData(
        d.tensors[0].masked_fill(d.tensors[0] > 2, float("nan")), d.tensors[1])),
     "contains NaN or infinite values"),
    ("batch-over-dataset", dict(batch_size=500), lambda d, m: dict(model=m, train_data=d),
     "batch_size 500 is larger than the training set (200 samples)"),
    ("optimizer-name", {}, lambda d, m: dict(model=m, train_data=d, optimizer="adam"),
     "optimizer must be a torch.optim.Optimizer"),
    ("class-names-string", {}, lambda d, m: dict(model=m, train_data=d, class_names="abc"),
     "class_names must be a list of strings"),
    # Issue 28, class 4: foreign exceptions become amptrain's, naming the argument.
    ("model-frozen", {}, lambda d, m: dict(model=m.requires_grad_(False), train_data=d),
     "model has nothing to train (4 parameters, none with requires_grad=True)"),
    ("model-without-parameters", {}, lambda d, m: dict(model=nn.Flatten(), train_data=d),
     "model has nothing to train (no parameters)"),
    ("model-on-meta", {}, lambda d, m: dict(model=m.to("meta"), train_data=d),
     "model has weights on the 'meta' device"),
    ("data-on-meta", {}, lambda d, m: dict(model=m, train_data=TensorData(
        d.tensors[0].to("meta"), d.tensors[1].to("meta"))), "train_data holds tensors on the "
                                                           "'meta' device"),
    ("val-inputs-of-another-shape", {}, lambda d, m: dict(model=m, train_data=d,
                                                          val_data=TensorData(
        torch.zeros(20, 5), torch.zeros(20, dtype=torch.long))),
     "val_data: input 0 has shape (5,) per sample, but train_data's has (8,)"),
    ("labels-all-distinct", {}, lambda d, m: dict(model=m, train_data=TensorData(
        d.tensors[0], torch.arange(200))), "every one of the 200 training labels is distinct"),
    ("dict-batch-unknown-key", {}, lambda d, m: dict(model=m, train_data=_loader(
        [{"inputs": x, "labels": y} for x, y in zip(*d.tensors)])),
     "has no parameter 'inputs'"),
    ("dict-batch-without-labels", {}, lambda d, m: dict(model=_Keyword(), train_data=_loader(
        [{"x": x} for x in d.tensors[0]])),
     "a dict batch carries its targets under 'labels'"),
    ("loss-not-scalar", {}, lambda d, m: dict(model=m, train_data=d,
                                              loss_fn=lambda out, y: (out - out.detach()).sum(1)),
     "backward() needs a scalar loss (one number), got shape (16,)"),
    # --- reliability-readers ---
    # (end of reliability-readers)
    # --- reliability-data-writers ---
    # Issue 36, class 2: a length the sampler would allocate for, a length that raises,
    # NaN inputs after the first batches (named as the data's fault, not --lr's).
    ("dataset-claims-10-12-samples", {}, lambda d, m: dict(model=m, train_data=type(
        "Huge", (torch.utils.data.Dataset,), {"__len__": lambda self: 10 ** 12,
                                              "__getitem__": lambda self, i: d[0]})()),
     "train_data claims 1000000000000 samples, over the limit of 268435456"),
    ("dataset-len-raises", {}, lambda d, m: dict(model=m, train_data=type(
        "Gone", (torch.utils.data.Dataset,), {"__len__": lambda self: 1 // 0,
                                              "__getitem__": lambda self, i: d[0]})()),
     "train_data: len() raised ZeroDivisionError"),
    ("nan-inputs-later-in-a-loader", dict(precision="32-true", max_steps=20, max_bad_steps=2),
     lambda d, m: dict(model=m, train_data=torch.utils.data.DataLoader(TensorData(
         torch.cat([d.tensors[0][:32], torch.full_like(d.tensors[0][32:], float("nan"))]),
         d.tensors[1]), batch_size=16)),
     "the training data (train_data) is not finite"),
    # Class 3: an out the file system cannot hold is one line, not an OSError.
    ("out-name-too-long", dict(out="/tmp/" + "x" * 300), lambda d, m: dict(model=m,
                                                                           train_data=d),
     "is 300 bytes, over the file system's"),
    # Class 7: NaN and infinity are not numbers >= 0 (they trained, then "lower lr").
    ("weight-decay-nan", dict(weight_decay=float("nan")),
     lambda d, m: dict(model=m, train_data=d), "weight_decay must be >= 0 (got nan)"),
    ("momentum-inf", dict(optimizer="sgd", momentum=float("inf")),
     lambda d, m: dict(model=m, train_data=d), "momentum must be >= 0 (got inf)"),
    ("warmup-steps-nan", dict(warmup_steps=float("nan")),
     lambda d, m: dict(model=m, train_data=d), "warmup_steps must be"),
    # (end of reliability-data-writers)
    # --- newcomer-defaults ---
    # (end of newcomer-defaults)
    # --- newcomer-readme ---
    # (end of newcomer-readme)
    # --- lowbit-formats ---
    # (end of lowbit-formats)
    # --- ppo ---
    ("ppo-task-on-a-dataset", dict(task="ppo"), lambda d, m: dict(model=m, train_data=d),
     "task ppo trains on environments: train_data must be the rollout of gym: data"),
    # gym: data says it is the ppo task's (task auto); the module here is no actor-critic.
    ("ppo-model-not-an-actor-critic", {}, lambda d, m: dict(
        model=m, train_data=__import__("amptrain.data").data.build_data("gym:CartPole-v1").train),
     "model (Sequential): task ppo needs an actor-critic whose forward takes one batch of "
     "observations, forward(obs) with obs of shape (N, 4)"),
    # (end of ppo)
    # --- reliab (issue 48) ---
    # An actor-critic whose forward cannot take observations: named by its signature.
    ("ppo-actor-critic-forward-takes-no-obs", {}, lambda d, m: dict(
        model=_NoObs(), train_data=__import__("amptrain.data").data.build_data(
            "gym:CartPole-v1").train),
     "model (_NoObs): task ppo needs an actor-critic whose forward takes one batch of "
     "observations"),
    # Class 7: an optimizer over other parameters than the model's never trained it.
    ("optimizer-over-other-parameters", {}, lambda d, m: dict(
        model=m, train_data=d, optimizer=torch.optim.SGD(_mlp3().parameters(), lr=0.1)),
     "optimizer holds 4 of 4 parameters that are not the model's"),
    # Class 9: samples the model cannot take are the data's fault, said at the first batch.
    ("dataset-samples-the-model-cannot-take", {}, lambda d, m: dict(
        model=m, train_data=TensorData(torch.zeros(200, 7), d.tensors[1])),
     "the model fails on the first batch of the training data (inputs (2, 7) float32"),
    # Class 8: a NUL byte in a path is one line, not os.stat's ValueError.
    ("out-with-a-nul-byte", dict(out="runs/x\0y"), lambda d, m: dict(model=m, train_data=d),
     "out holds a NUL byte (got 'runs/x\\x00y')"),
    # (end of reliab)
    # --- rlstats ---
    # (end of rlstats)
    # --- precsplit ---
    ("precision-unknown", dict(precision="fp12"), None, "unknown precision 'fp12'"),
    ("precision-number", dict(precision=3.5), None, "precision must be a string (got float"),
    # (end of precsplit)
    # --- windows ---
    # (end of windows)
    # --- parts ---
    # (end of parts)
    # --- tasks ---
    # (end of tasks)
    # --- owners ---
    # (end of owners)
]


class _Keyword(nn.Module):
    """A model whose forward takes its input as a keyword (dict batches)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        return self.linear(x)


class _NoObs(nn.Module):
    """An actor-critic whose forward takes no observations (a ppo model's mistake)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self) -> torch.Tensor:
        return self.linear.weight


@pytest.mark.parametrize("name,options,arguments,fragment", LIBRARY_HOSTILE,
                         ids=[c[0] for c in LIBRARY_HOSTILE])
def test_library_errors_name_the_keyword(name, options, arguments, fragment, tmp_path):
    from amptrain.common.errors import UserError

    data = tiny_classification(n=200)
    with pytest.raises(UserError) as error:
        trainer = Trainer(**{"no_progress": True, "max_steps": 3, "batch_size": 16,
                             "out": str(tmp_path / "run"), **options})
        trainer.fit(**arguments(data, _mlp3()))
    assert fragment in str(error.value) and "--" not in str(error.value)
    if not any(word in name for word in ("loader", "dict", "loss")):  # seen with a batch
        assert not (tmp_path / "run").exists()  # refused before anything was written


def test_own_optimizer_keeps_its_learning_rate_unless_a_schedule_is_asked_for(capsys):
    data = tiny_classification(n=200)
    model = _mlp3()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = Trainer(no_progress=True, epochs=2, batch_size=32, log_every=1)
    trainer.fit(model, data, optimizer=optimizer)
    assert optimizer.param_groups[0]["lr"] == 0.1
    assert {r["lr"] for r in trainer.history if "lr" in r} == {0.1}
    first_line = capsys.readouterr().err.splitlines()[0]
    assert "your optimizer keeps its learning rate" in first_line
    # scheduler= on the Trainer still applies one.
    model = _mlp3()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    Trainer(no_progress=True, epochs=2, batch_size=32, scheduler="cosine").fit(
        model, data, optimizer=optimizer)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.0)


# ------------------------------------------------ a Trainer used twice, and teardown
def test_a_second_fit_trains_the_second_model():
    data = tiny_classification(n=200)
    trainer = Trainer(precision="32-true", device="cpu", no_progress=True, max_steps=3,
                      batch_size=32, log_every=1)
    first_model, second_model = tiny_mlp(classes=3), tiny_mlp(classes=3, seed=1)
    first = trainer.fit(first_model, data)
    before = [p.detach().clone() for p in second_model.parameters()]
    second = trainer.fit(second_model, data)
    assert first.steps == second.steps == 3 and trainer.step == 3
    assert [r["step"] for r in trainer.history if "loss" in r] == [1, 2, 3]  # not 1..6
    assert trainer.model is second_model
    assert any(not torch.equal(a, b) for a, b in zip(before, second_model.parameters()))


@pytest.mark.parametrize("fails", [False, True])
def test_fit_gives_the_users_model_its_own_forward_back(fails):
    """16-mixed on a CPU wraps the forward of kept-fp32 modules (and norms); after fit,
    also one that raised, the user's modules have no patched forward left."""
    model = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 3))
    trainer = Trainer(precision="16-mixed", device="cpu", no_progress=True, max_steps=2,
                      batch_size=32, keep_fp32=["2"])

    class Boom:
        def on_step_end(self, trainer):
            raise RuntimeError("a callback failed")

    if fails:
        trainer.callbacks.append(Boom())
        with pytest.raises(RuntimeError, match="a callback failed"):
            trainer.fit(model, tiny_classification(n=64))
    else:
        trainer.fit(model, tiny_classification(n=64))
    assert all("forward" not in m.__dict__ for m in model.modules())
    if not fails:  # evaluating afterwards puts the islands back for the pass only
        assert trainer.evaluate(model, tiny_classification(n=64)).loss > 0
        assert all("forward" not in m.__dict__ for m in model.modules())


def _islands_model():
    return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 3))


def test_fit_gives_the_forward_back_when_the_loss_raises_at_step_2():
    calls = []

    def loss_fn(outputs, targets):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("the loss failed")
        return nn.functional.cross_entropy(outputs, targets)

    model = _islands_model()
    trainer = Trainer(precision="16-mixed", device="cpu", no_progress=True, max_steps=4,
                      batch_size=32, keep_fp32=["2"])
    with pytest.raises(RuntimeError, match="the loss failed"):
        trainer.fit(model, tiny_classification(n=64), loss_fn=loss_fn)
    assert trainer.step == 1
    assert all("forward" not in m.__dict__ for m in model.modules())


def test_a_failed_set_up_gives_the_forward_back():
    from amptrain.common.errors import UserError

    data = tiny_classification(n=64)
    model = _islands_model()
    trainer = Trainer(precision="16-mixed", device="cpu", no_progress=True, max_steps=2,
                      batch_size=32, keep_fp32=["2"])
    # Refused by the output check, after the precision set the model up.
    with pytest.raises(UserError, match="outside the model's 3 outputs"):
        trainer.fit(model, TensorData(data.tensors[0], data.tensors[1] + 3))
    assert all("forward" not in m.__dict__ for m in model.modules())


def test_the_progress_bar_counts_epochs_like_the_log_lines(monkeypatch):
    # One numbering everywhere, from 0: metrics.jsonl's epoch, the log lines, the bar.
    from amptrain.trainer.logs import RunLogger

    descs: list[str] = []
    bar = RunLogger.bar
    monkeypatch.setattr(RunLogger, "bar", lambda self, total, desc, initial=0: (
        descs.append(desc), bar(self, total, desc, initial))[1])
    trainer = Trainer(precision="32-true", epochs=2, batch_size=50, log_every=1)
    trainer.fit(tiny_mlp(), tiny_classification(n=100))
    assert [d for d in descs if d.startswith("epoch")] == ["epoch 0 (0-1)", "epoch 1 (0-1)"]
    assert sorted({r["epoch"] for r in trainer.history if "loss" in r}) == [0, 1]


# ------------------------------------------------ the run's length (max_steps, epochs)
def test_max_steps_alone_trains_that_many_steps_over_several_epochs(capsys):
    data = tiny_classification(n=200)  # batch 32: 7 steps an epoch
    trainer = Trainer(precision="32-true", device="cpu", no_progress=True, batch_size=32,
                      max_steps=17, log_every=1, scheduler="cosine", lr=0.01)
    result = trainer.fit(tiny_mlp(), data)
    assert (result.steps, result.epochs_completed) == (17, 2)  # 2 whole epochs, a third begun
    assert "17 steps (max_steps 17; 2.4 epochs of 7 steps)" in capsys.readouterr().err
    lrs = [r["lr"] for r in trainer.history if "lr" in r]
    # The cosine schedule spans the 17 steps the run trains: it reaches 0 on the last one.
    assert len(lrs) == 17 and lrs[-1] == pytest.approx(0.0, abs=1e-12) and min(lrs[:-1]) > 0


def test_both_given_the_run_ends_at_whichever_comes_first(capsys):
    data = tiny_classification(n=200)
    options = dict(precision="32-true", device="cpu", no_progress=True, batch_size=32)
    assert Trainer(epochs=1, max_steps=100, **options).fit(tiny_mlp(), data).steps == 7
    assert Trainer(epochs=3, max_steps=10, **options).fit(tiny_mlp(), data).steps == 10
    assert "7 steps (the fewer of max_steps 100 and epochs 1 of 7 steps)" \
        in capsys.readouterr().err


def test_neither_given_three_epochs_and_a_config_file_counts_as_given(capsys):
    from amptrain.config import TrainConfig

    data = tiny_classification(n=200)
    options = dict(precision="32-true", device="cpu", no_progress=True, batch_size=32)
    assert Trainer(**options).fit(tiny_mlp(), data).steps == 21
    assert "21 steps (3 epochs of 7 steps, the default)" in capsys.readouterr().err
    config = TrainConfig.from_options(epochs=3, max_steps=40, **options)
    assert Trainer(config).fit(tiny_mlp(), data).steps == 21  # both given: the fewer


def test_a_generator_shorter_than_max_steps_ends_when_it_runs_dry():
    # A stream read once: max_steps alone allows any number of epochs, but an epoch that
    # gives nothing ends the run (instead of looping forever on an empty generator).
    data = tiny_classification(n=160)
    batches = ((x, y) for x, y in zip(data.tensors[0].split(32), data.tensors[1].split(32)))
    trainer = Trainer(precision="32-true", device="cpu", no_progress=True, batch_size=32,
                      max_steps=20)
    result = trainer.fit(tiny_mlp(), batches)
    assert result.steps == 5 and trainer.run_length.epochs is None
