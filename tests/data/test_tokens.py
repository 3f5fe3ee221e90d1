"""tokens:DIR: memory-mapped blocks through the global-batch plan: the same blocks as
text:, exact resume mid-epoch, a fixed evaluation sample, disjoint DDP ranks."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from amptrain import Trainer
from amptrain.data import ByteTokenizer, DataOptions, TextOptions, build_data
from amptrain.data.tokenizing import prepare_corpus
from amptrain.common.errors import Preempted, UserError

TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(120))


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(256, 16)
        self.head = nn.Linear(16, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.embed(x)))


@pytest.fixture
def shards(tmp_path):
    (tmp_path / "corpus.txt").write_text(TEXT)
    out = tmp_path / "shards"
    out.mkdir()
    prepare_corpus(tmp_path / "corpus.txt", out, ByteTokenizer(), val_fraction=0.2,
                   progress=False, shard_tokens=1000)  # several shards: blocks span them
    return out


def test_blocks_are_the_text_stream_with_next_token_targets(shards):
    bundle = build_data(f"tokens:{shards}", DataOptions(text=TextOptions(seq_len=32)))
    stream = torch.tensor(list(TEXT.encode()))
    n_val = round(len(stream) * 0.2)
    assert bundle.task == "lm" and bundle.vocab_size == 256 and bundle.input_shape == (32,)
    x, y = bundle.train.read_batch(range(len(bundle.train)))
    assert torch.equal(x.flatten(), stream[:x.numel()])
    assert torch.equal(y.flatten(), stream[1:x.numel() + 1])
    assert x.numel() + 1 <= len(stream) - n_val
    vx, _ = bundle.val.read_batch([0])
    assert torch.equal(vx[0], stream[len(stream) - n_val:][:32])
    sample_x, sample_y = bundle.train[3]
    assert torch.equal(sample_x, x[3]) and torch.equal(sample_y, y[3])
    assert bundle.fitted == {"tokenizer": "byte", "seq_len": 32, "bytes_per_token": 1.0}


class StopAt:
    """Asks the run to stop after ``step`` (as SIGTERM does): a checkpoint, then Preempted."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, trainer: Trainer) -> None:
        if trainer.step == self.step:
            trainer.stop_requested = "SIGTERM"


def _fit(bundle, out, max_steps, resume=None, callbacks=()):
    trainer = Trainer(precision="32-true", device="cpu", batch_size=8, micro_batch_size=4,
                      max_steps=max_steps, epochs=3, lr=0.01, deterministic=True,
                      out=str(out), resume=resume, no_progress=True, eval_batches=1,
                      callbacks=callbacks)
    trainer.fit(TinyLM(), bundle.train, bundle.val)
    return trainer


def test_resume_mid_epoch_is_bitwise_the_uninterrupted_run(shards, tmp_path):
    bundle = build_data(f"tokens:{shards}", DataOptions(text=TextOptions(seq_len=16)))
    steps_per_epoch = len(bundle.train) // 8
    stop, total = steps_per_epoch + 3, steps_per_epoch + 9  # stop inside the second epoch
    whole = _fit(bundle, tmp_path / "whole", total)
    with pytest.raises(Preempted):
        _fit(bundle, tmp_path / "cut", total, callbacks=[StopAt(stop)])
    resumed = _fit(bundle, tmp_path / "cut", total, resume="auto")
    assert resumed.step == whole.step == total
    for (name, a), b in zip(whole.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name
    assert resumed.last_eval.loss == whole.last_eval.loss


def test_eval_batches_reads_a_fixed_sample_and_the_final_one_can_read_all(shards, tmp_path):
    bundle = build_data(f"tokens:{shards}", DataOptions(text=TextOptions(seq_len=8)))
    options = dict(precision="32-true", device="cpu", batch_size=4, max_steps=2,
                   no_progress=True)
    sampled = Trainer(**options, eval_batches=2)
    sampled.fit(TinyLM(), bundle.train, bundle.val)
    full = Trainer(**options, eval_batches=2, final_eval_full=True)
    full.fit(TinyLM(), bundle.train, bundle.val)
    assert len(bundle.val) > 8
    assert sampled.last_eval.samples == 8  # 2 batches of 4
    assert full.last_eval.samples == len(bundle.val)
    again = sampled.evaluate()  # the same fixed sample every time
    assert again.samples == 8 and again.loss == sampled.last_eval.loss
    with pytest.raises(UserError, match="final_eval_full applies with eval_batches"):
        Trainer(final_eval_full=True)


def test_shards_of_another_tokenizer_than_the_run_are_refused(shards):
    with pytest.raises(UserError, match="trained on the tokenizer hf:gpt2, the shards hold"):
        build_data(f"tokens:{shards}", DataOptions(fitted={"tokenizer": "hf:gpt2"}))
    meta = json.loads((shards / "meta.json").read_text())
    assert meta["tokenizer"] == "byte"


@pytest.mark.slow
def test_ddp_ranks_read_disjoint_blocks_that_make_up_the_epoch(shards, tmp_path):
    from tests.distributed.helpers import ROOT, torchrun

    script = tmp_path / "ranks.py"
    script.write_text(f"""
import json, sys, torch
sys.path.insert(0, {str(ROOT)!r})
from amptrain import Trainer
from amptrain.data import DataOptions, TextOptions, build_data
from amptrain.distributed import build_strategy
from tests.data.test_tokens import TinyLM
bundle = build_data("tokens:{shards}", DataOptions(text=TextOptions(seq_len=16)))
trainer = Trainer(strategy=build_strategy("ddp", "cpu"), device="cpu", precision="32-true",
                  batch_size=8, no_progress=True, max_steps=1)
trainer.setup(TinyLM(), bundle.train)
rows = [[x.tolist() for x in w.micro_batches[0][0]] for w in trainer.train_windows.epoch(1)]
json.dump(rows, open("{tmp_path}/rank%d.json" % trainer.strategy.rank, "w"))
trainer.strategy.teardown()
""")
    result = torchrun(str(script))
    assert result.returncode == 0, result.stderr[:3000]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    bundle = build_data(f"tokens:{shards}", DataOptions(text=TextOptions(seq_len=16)))
    single = Trainer(device="cpu", precision="32-true", batch_size=8, no_progress=True,
                     max_steps=1)
    single.setup(TinyLM(), bundle.train)
    expected = [[x.tolist() for x in w.micro_batches[0][0]] for w in single.train_windows.epoch(1)]
    assert len(ranks[0]) == len(ranks[1]) == len(expected)
    for step, want in enumerate(expected):  # each global batch split between the ranks
        # Rank 0 the first half of each global batch, rank 1 the second: disjoint shares.
        half = len(want) // 2
        assert ranks[0][step] == want[:half] and ranks[1][step] == want[half:]


class ViewingLM(TinyLM):
    """nanoGPT-style: flattens its input with ``.view``, which a strided batch refuses."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time = x.shape
        return super().forward(x.view(batch * time)).view(batch, time, -1)


def test_batches_are_contiguous_so_a_model_may_view_them(shards, tmp_path):
    bundle = build_data(f"tokens:{shards}", DataOptions(text=TextOptions(seq_len=32)))
    x, y = bundle.train.read_batch([0, 2, 1])
    assert x.is_contiguous() and y.is_contiguous()  # issue 49: they were strided views
    seen = []
    trainer = Trainer(precision="32-true", device="cpu", batch_size=8, micro_batch_size=4,
                      max_steps=2, lr=0.01, no_progress=True,
                      callbacks=[])
    model = ViewingLM()
    model.register_forward_pre_hook(lambda module, args: seen.append(args[0].is_contiguous()))
    result = trainer.fit(model, bundle.train)
    assert result.steps == 2 and seen and all(seen)
