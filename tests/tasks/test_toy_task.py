"""Issue 43 item 2: a new task is one file. A toy task written to a file of its own (mean
absolute error on float targets), loaded from it, trains through the Trainer, evaluates,
writes its report and is judged by compare's verdict, with nothing of amptrain edited. It
declares the core protocol and one part, its verdict (a relative change); every other
part is the ready-made default."""
from __future__ import annotations

import importlib.util
import textwrap

import torch
from torch import nn

from amptrain.trainer import Trainer
from amptrain.tasks import delta_field, judge

TOY = textwrap.dedent('''
    """A toy task: predict a float target, judged by the mean absolute error."""
    import torch
    from torch.nn import functional as F

    from amptrain.tasks import EvalResult, EvalSums, Metric, Metrics, Task, Verdict


    class _Errors(EvalSums):
        def __init__(self, device):
            self.total = torch.zeros((), device=device)
            self.count = 0

        def update(self, outputs, targets):
            self.total += (outputs.reshape(-1) - targets.reshape(-1)).abs().sum()
            self.count += targets.numel()


    class MeanAbsoluteError(Task):
        name = "mae"
        metrics = Metrics(Metric("mae", "mean absolute error", higher_is_better=False))
        verdict = Verdict(unit="rel")  # the one part it differs in: a relative change

        def loss(self, outputs, targets):
            return F.l1_loss(outputs.reshape(-1), targets.reshape(-1).float())

        def start_eval(self, device):
            return _Errors(device)

        def finish_eval(self, sums, gather, loss, samples):
            total = gather(sums.total.reshape(1)).sum()
            return EvalResult(loss=loss, samples=samples,
                              metrics={"mae": float(total) / max(sums.count, 1)}, task=self)
''')


def test_a_task_in_one_file_trains_evaluates_and_is_judged(tmp_path):
    path = tmp_path / "toy_task.py"
    path.write_text(TOY)
    spec = importlib.util.spec_from_file_location("toy_task", path)
    toy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(toy)

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(256, 4, generator=generator)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0])
    data = torch.utils.data.TensorDataset(x, y)
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    task = toy.MeanAbsoluteError()
    before = Trainer(max_steps=1, batch_size=32, no_progress=True, logger="none")
    before.prepare(model, task=task)
    first = before.evaluate(data=data)
    untrained = first.metrics["mae"]
    result = Trainer(epochs=8, batch_size=32, lr=0.05, no_progress=True, logger="none",
                     scheduler="none").fit(model, data, data, task=task)
    trained = result.val_metrics["mae"]
    assert trained < 0.5 * untrained            # it learnt, measured by its own metric
    # compare's verdict on the task's own terms: a relative change, lower is better.
    assert judge(task, trained, untrained, 0.02)[1] == "better"
    assert delta_field(task) == "delta_mae_rel" and task.verdict.format_delta(-0.5) == "-50.00 %"
    assert task.verdict.tolerance_option == "tolerance_rel"
    # The default parts: its words, its report, the Trainer's epochs.
    assert task.wording.describe(task.name) == "task mae" and not task.iteration.owns
    first.write(tmp_path / "eval")
    assert sorted(p.name for p in (tmp_path / "eval").iterdir()) == ["mae_report.txt",
                                                                      "report.json"]
