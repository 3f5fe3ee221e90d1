"""Language modelling: the loss per token, perplexity and bits per byte, checks, and whole
runs of the built-in gpt on text the tests write (learning, exact resume, compare)."""
from __future__ import annotations

import json
import math
import random

import pytest
import torch

from amptrain import checkpoint
from amptrain.compare import CompareOptions, run_compare
from amptrain.config import RunConfig, build_config
from amptrain.data import TensorData, TokenBlocks
from amptrain.common.errors import Preempted, UserError
from amptrain.workflows.runner import run_training
from amptrain.tasks import LanguageModelTask, infer_task
from amptrain.tasks import delta_field, judge


def write_corpus(path, repeats: int = 60, seed: int = 0):
    """A small repetitive text: easy to learn, so perplexity falls far below 256."""
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "omega", "kappa"]
    lines = [" ".join(rng.choice(words) for _ in range(6)) + ".\n" for _ in range(8)]
    path.write_text("".join(lines) * repeats)
    return path


def test_perplexity_and_bits_per_byte_follow_the_loss():
    task = LanguageModelTask(bytes_per_token=1.0, seq_len=8)
    result = task.finish_eval(task.start_eval(torch.device("cpu")), None, math.log(4.0), 10)
    assert result.metrics["perplexity"] == pytest.approx(4.0)
    assert result.metrics["bits_per_byte"] == pytest.approx(2.0)
    assert result.perplexity == pytest.approx(4.0)
    two_bytes = LanguageModelTask(bytes_per_token=2.0)
    assert two_bytes.finish_eval(None, None, math.log(4.0), 1).metrics["bits_per_byte"] == \
        pytest.approx(1.0)
    report = task.reports.report(result)
    assert report["tokens"] == 80 and report["loss_unit"] == "nats per token"
    assert task.logs.throughput(100.0) == {"tokens_per_s": 800.0}


def test_loss_is_the_mean_cross_entropy_per_token():
    logits = torch.randn(2, 5, 7)
    targets = torch.randint(0, 7, (2, 5))
    expected = torch.nn.functional.cross_entropy(logits.reshape(10, 7), targets.reshape(10))
    assert torch.allclose(LanguageModelTask().loss(logits, targets), expected)


def test_fit_reads_the_block_length_and_the_bytes_per_token():
    task = LanguageModelTask()
    task.learn_from(TokenBlocks(torch.arange(200), 16, bytes_per_token=3.5))
    assert task.state() == {"bytes_per_token": 3.5, "seq_len": 16}
    assert infer_task(TokenBlocks(torch.arange(50), 8)) == "lm"


def test_checks_name_the_option():
    task = LanguageModelTask()
    with pytest.raises(UserError, match="task lm needs token sequences"):
        task.checks.check_data(TensorData(torch.zeros(4, 3), torch.zeros(4).long()), "train_data")
    with pytest.raises(UserError, match="language model must return logits"):
        task.checks.check_outputs(torch.zeros(2, 5), torch.zeros(2, 5).long(), model_name="mlp",
                           all_targets=None)
    with pytest.raises(UserError, match="token id 9 is outside the model's 4 vocabulary"):
        task.checks.check_outputs(torch.zeros(1, 2, 4), torch.tensor([[1, 9]]), model_name=None,
                           all_targets=None)


def test_verdict_is_the_relative_change_of_perplexity():
    task = LanguageModelTask()
    assert judge(task, 3.03, 3.0, 0.02) == (pytest.approx(0.01), "ok")
    assert judge(task, 3.3, 3.0, 0.02)[1] == "worse"
    assert delta_field(task) == "delta_perplexity_rel"
    assert task.verdict.tolerance_option == "tolerance_rel"


GPT = "gpt:layers=2,heads=2,width=64"


def _config(tmp_path, corpus, **values) -> RunConfig:
    return build_config(RunConfig, {"model": GPT, "data": f"text:{corpus}", "seq_len": 32,
                                    "batch_size": 16, "lr": 3e-3, "no_progress": True,
                                    "device": "cpu", "log_every": 20, "warmup_steps": 10,
                                    "out": str(tmp_path / "run"), **values})


@pytest.mark.slow
def test_gpt_learns_a_repeated_text_far_below_the_vocabulary(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt")
    result = run_training(_config(tmp_path, corpus, max_steps=250, precision="bf16-mixed",
                                  eval_every=250))
    # Uniform over 256 bytes is perplexity 256; the text has ~7 letters + space + '.'.
    assert result.val_metrics["perplexity"] < 3.0, result.val_metrics
    assert result.val_metrics["bits_per_byte"] == pytest.approx(
        math.log2(result.val_metrics["perplexity"]))
    assert result.tokens_per_s and result.tokens_per_s == pytest.approx(
        result.samples_per_s * 32, rel=0.5)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert any("tokens_per_s" in r for r in records)
    assert any("val_perplexity" in r for r in records)
    report = json.loads((tmp_path / "run" / "eval" / "report.json").read_text())
    assert report["perplexity"] == pytest.approx(result.val_metrics["perplexity"])
    assert (tmp_path / "run" / "eval" / "lm_report.txt").exists()


class _StopAt:
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, trainer) -> None:
        if trainer.step == self.step:
            trainer.stop_requested = "SIGTERM"


@pytest.mark.slow
def test_resume_of_an_lm_run_is_bitwise(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt", repeats=20)
    common = dict(max_steps=12, precision="bf16-mixed", deterministic=True,
                  model="gpt:layers=1,heads=2,width=32,dropout=0.1")
    run_training(_config(tmp_path, corpus, **common, out=str(tmp_path / "straight")))
    with pytest.raises(Preempted):
        run_training(_config(tmp_path, corpus, **common, out=str(tmp_path / "cut")),
                     callbacks=[_StopAt(5)])
    run_training(_config(tmp_path, corpus, **common, out=str(tmp_path / "cut"), resume="auto"))
    straight = checkpoint.load(tmp_path / "straight" / "checkpoints" / "last.pt")
    resumed = checkpoint.load(tmp_path / "cut" / "checkpoints" / "last.pt")
    assert resumed["step"] == straight["step"] == 12
    for name, value in straight["model"].items():
        assert torch.equal(value, resumed["model"][name]), name
    assert resumed["task"] == straight["task"] == {"name": "lm", "bytes_per_token": 1.0,
                                                    "seq_len": 32}


@pytest.mark.slow
def test_compare_judges_perplexity_by_its_relative_change(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt", repeats=20)
    # The verdict's arithmetic needs two finished runs, not converged ones: 8 steps.
    config = _config(tmp_path, corpus, max_steps=8, out=str(tmp_path / "study"))
    options = build_config(CompareOptions, {"precisions": "32-true,bf16-mixed", "seeds": 1,
                                            "timing_steps": 3, "timing_warmup": 1,
                                            "tolerance_rel": 0.05})
    result = run_compare(config, options)
    base, bf16 = result["summary"]
    assert "val_perplexity_mean" in bf16 and "delta_perplexity_rel" in bf16
    assert "val_acc_mean" not in bf16
    expected = (bf16["val_perplexity_mean"] - base["val_perplexity_mean"]) / \
        base["val_perplexity_mean"]
    assert bf16["delta_perplexity_rel"] == pytest.approx(expected)
    assert bf16["verdict"] == ("ok" if abs(expected) <= 0.05 else
                               "worse" if expected > 0 else "better")
    assert all(r["val_perplexity"] is not None for r in result["runs"])
    report = (tmp_path / "study" / "report.md").read_text()
    assert "Δ perplexity" in report and "val perplexity" in report
    study = json.loads((tmp_path / "study" / "study.json").read_text())
    assert study["task"]["name"] == "lm" and study["task"]["tolerance"] == 0.05


def test_resume_mismatch_names_the_flag_of_the_block_size_or_the_tokenizer():
    from amptrain.tasks import LanguageModelTask, RegressionTask

    said = LanguageModelTask.wording.resume_mismatch("input_shape", (64,), (32,), config={},
                                                     saved={}, path="c.pt")
    assert said is not None and said.startswith("--seq-len 64 differs from checkpoint c.pt's 32")
    said = LanguageModelTask.wording.resume_mismatch("num_classes", 300, 256,
                                                     config={"tokenizer": "hf:t"},
                                                     saved={}, path="c.pt")
    assert said is not None and "--tokenizer hf:t gives a vocabulary of 300" in said \
        and "(--tokenizer byte)" in said
    # Other tasks leave the message to resume's generic one.
    assert RegressionTask.wording.resume_mismatch("num_classes", 2, 1, config={}, saved={},
                                                  path="c.pt") is None


class _PositionLM(torch.nn.Module):
    """Logits per position, classes last (nanoGPT's shape)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.head = torch.nn.Embedding(50, 8), torch.nn.Linear(8, 50)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x))


def _token_dataset() -> torch.utils.data.TensorDataset:
    ids = torch.randint(0, 50, (32, 9), generator=torch.Generator().manual_seed(0))
    return torch.utils.data.TensorDataset(ids[:, :-1].contiguous(), ids[:, 1:].contiguous())


def test_a_tensor_dataset_of_token_blocks_trains_as_an_lm_by_default(capsys):
    """issue 49: the default task ended in torch's "Expected target size [2, 128], got
    [2, 64]"; token blocks and their next tokens are an LM's data."""
    from amptrain import Trainer

    data = _token_dataset()
    assert infer_task(data) == "lm"
    assert infer_task(torch.utils.data.TensorDataset(torch.zeros(4, 3, dtype=torch.long),
                                                     torch.zeros(4, dtype=torch.long))) \
        == "classification"
    trainer = Trainer(precision="32-true", device="cpu", batch_size=8, max_steps=2,
                      no_progress=True)
    result = trainer.fit(_PositionLM(), data, data)
    assert trainer.task.name == "lm" and math.isfinite(result.final_loss)
    assert "task lm" in capsys.readouterr().err.splitlines()[0]


def test_classification_asked_for_on_token_blocks_names_task_lm_in_one_line():
    from amptrain import Trainer

    trainer = Trainer(precision="32-true", device="cpu", batch_size=8, max_steps=2,
                      no_progress=True, task="classification")
    with pytest.raises(UserError, match=r'^the model returns \(2, 8, 50\) for targets of '
                                        r'\(2, 8\): logits per position, classes last; for '
                                        r'next-token prediction set task="lm"$'):
        trainer.fit(_PositionLM(), _token_dataset())
