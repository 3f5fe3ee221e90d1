"""`amptrain compare`: the A/B study's contract, fairness, measurements and reports."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from amptrain import cli, report
from amptrain.compare import CompareOptions, RunProbe, run_compare, state_bytes, summarise
from amptrain.config import RunConfig
from amptrain.data import TensorData
from amptrain.runner import prepare_run
from amptrain.tasks import ClassificationTask
from amptrain.trainer import Trainer, forward_batch

verdict = ClassificationTask().verdict
ROOT = Path(__file__).parents[1]
#: DESIGN.md: compare.json's summary fields, in order.
SUMMARY_FIELDS = ["precision", "samples_per_s", "speedup", "step_time_ms", "peak_mem_bytes",
                  "mem_ratio", "val_acc_mean", "val_acc_std", "delta_acc_pp", "final_loss_mean",
                  "skipped_steps", "verdict"]
PRECISIONS = ["32-true", "16-mixed", "bf16-mixed"]
SEEDS = [0, 1]


def small_config(out: Path, **overrides) -> RunConfig:
    values = dict(model="cnn:8", data="digits", device="cpu", max_steps=6, batch_size=64,
                  no_progress=True, out=str(out))
    values.update(overrides)
    return RunConfig.from_options(**values)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """One real 3 precisions x 2 seeds study; a spy records what each training run saw."""
    torch.set_num_threads(2)
    out = tmp_path_factory.mktemp("compare") / "study"
    seen: dict[tuple[str, int], dict] = {}
    original = Trainer._train_step

    def spy(self, window):
        if self.out is not None:  # the training runs (timing Trainers write nothing)
            record = seen.setdefault((self.precision.name, self.config.seed),
                                     {"batches": [], "initial": None, "first_window": window})
            if record["initial"] is None:
                record["initial"] = {k: v.detach().clone() for k, v in
                                     self.precision.fp32_state_dict(self.model).items()}
            record["batches"].append([t.clone() for b in window.micro_batches for t in b])
        return original(self, window)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Trainer, "_train_step", spy)
        result = run_compare(small_config(out), CompareOptions(timing_steps=3, timing_warmup=1),
                             pick_log_every=False)
    return {"out": out, "result": result, "seen": seen,
            "details": json.loads((out / "study.json").read_text())}


# ------------------------------------------------------------- the contract
def test_compare_json_has_exactly_the_documented_fields(study):
    data = json.loads((study["out"] / "compare.json").read_text())
    assert data == study["result"]
    assert set(data) == {"baseline", "runs", "summary"}
    assert data["baseline"] == "32-true"
    assert [row["precision"] for row in data["summary"]] == PRECISIONS  # baseline first
    for row in data["summary"]:
        assert list(row) == SUMMARY_FIELDS
        assert row["samples_per_s"] > 0 and row["step_time_ms"] > 0 and row["peak_mem_bytes"] > 0
        assert 0 <= row["val_acc_mean"] <= 1 and row["val_acc_std"] >= 0
        assert row["final_loss_mean"] > 0 and row["skipped_steps"] >= 0
        assert row["verdict"] == verdict(row["delta_acc_pp"], 0.5)
    assert sorted((r["precision"], r["seed"]) for r in data["runs"]) == \
        sorted((p, s) for p in PRECISIONS for s in SEEDS)
    for run in data["runs"]:
        run_dir = study["out"] / "runs" / run["precision"] / f"seed-{run['seed']}"
        assert run["dir"] == f"runs/{run['precision']}/seed-{run['seed']}"
        for name in ("config.yaml", "metrics.jsonl", "tb", "checkpoints/last.pt",
                     "eval/report.json", "eval/classification_report.txt"):
            assert (run_dir / name).exists(), name
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        assert (config["precision"], config["seed"]) == (run["precision"], run["seed"])
        assert run["steps"] == 6 and run["halted"] is None


def test_speedups_and_ratios_are_against_the_baseline_of_the_same_invocation(study):
    summary = {row["precision"]: row for row in study["result"]["summary"]}
    speed = study["details"]["speed"]
    base = summary["32-true"]
    assert base["speedup"] == 1.0 and base["mem_ratio"] == 1.0 and base["delta_acc_pp"] == 0.0
    for p, row in summary.items():
        # The throughput is this invocation's: batch / median of the steps timed here.
        median_s = statistics.median(speed[p]["step_times_ms"]) / 1e3
        assert row["samples_per_s"] == pytest.approx(64 / median_s, rel=1e-3)
        assert len(speed[p]["step_times_ms"]) == 3
        assert row["speedup"] == pytest.approx(row["samples_per_s"] / base["samples_per_s"])
        assert row["mem_ratio"] == pytest.approx(row["peak_mem_bytes"] / base["peak_mem_bytes"])
        accs = [r["val_acc"] for r in study["result"]["runs"] if r["precision"] == p]
        assert row["val_acc_mean"] == pytest.approx(np.mean(accs))
        assert row["val_acc_std"] == pytest.approx(np.std(accs, ddof=1))
        assert row["delta_acc_pp"] == pytest.approx((np.mean(accs) - base["val_acc_mean"]) * 100)


def test_every_precision_starts_from_the_same_weights(study):
    """Same seed: identical fp32 weights, hence equal first-step losses re-evaluated in fp32."""
    seen, runs = study["seen"], study["result"]["runs"]
    losses = {}
    for (precision, seed), record in seen.items():
        _, model = prepare_run(small_config(study["out"], seed=seed))  # architecture only
        model.load_state_dict(record["initial"])
        model.train()
        with torch.no_grad():
            losses[precision, seed] = sum(
                forward_batch(model, b, torch.nn.functional.cross_entropy)[0].item() * n
                for b, n in zip(record["first_window"].micro_batches,
                                record["first_window"].micro_samples)) / 64
    for seed in SEEDS:
        reference = seen["32-true", seed]["initial"]
        for p in PRECISIONS[1:]:
            state = seen[p, seed]["initial"]
            assert all(torch.equal(reference[k], state[k]) for k in reference), (p, seed)
            assert losses[p, seed] == losses["32-true", seed]
        probe = [r["first_step_loss_fp32"] for r in runs if r["seed"] == seed]
        assert probe == pytest.approx([losses["32-true", seed]] * 3, rel=1e-5)
        assert len({r["initial_weights_sha256"] for r in runs if r["seed"] == seed}) == 1
    assert all(r["same_initial_weights"] for r in runs)
    assert losses["32-true", 0] != losses["32-true", 1]  # the check can tell seeds apart


def test_every_precision_sees_the_same_data_in_the_same_order(study):
    seen, runs = study["seen"], study["result"]["runs"]
    for seed in SEEDS:
        reference = seen["32-true", seed]["batches"]
        assert len(reference) == 6
        for p in PRECISIONS[1:]:
            batches = seen[p, seed]["batches"]
            assert len(batches) == len(reference)
            for mine, theirs in zip(batches, reference):
                assert all(torch.equal(a, b) for a, b in zip(mine, theirs))
        assert len({r["data_order_sha256"] for r in runs if r["seed"] == seed}) == 1
    first_labels = [seen["32-true", s]["batches"][0][-1] for s in SEEDS]
    assert not torch.equal(*first_labels)  # another seed, another order
    assert len({r["data_order_sha256"] for r in runs}) == 2


def test_probe_notices_a_model_that_does_not_start_from_the_seed_weights(tmp_path):
    config = small_config(tmp_path / "run", precision="bf16-mixed")
    data, model = prepare_run(config)
    reference = {k: v.clone() for k, v in model.state_dict().items()}
    reference["head.weight"] += 1e-3
    probe = RunProbe(reference)
    Trainer(config, callbacks=[probe]).fit(model, data.train)
    assert probe.facts["same_initial_weights"] is False
    assert probe.facts["first_step_loss_fp32"] > 0


# ----------------------------------------------------------- summary logic
def test_verdicts_follow_the_tolerance_and_failures_are_reported():
    runs = [{"precision": p, "seed": s, "val_acc": acc, "final_loss": 0.1, "skipped_steps": k,
             "halted": halted}
            for p, s, acc, k, halted in [
                ("32-true", 0, 0.900, 0, None), ("32-true", 1, 0.910, 0, None),
                ("16-mixed", 0, 0.901, 1, None), ("16-mixed", 1, 0.919, 2, None),   # +0.5 pp
                ("bf16-mixed", 0, 0.880, 0, None), ("bf16-mixed", 1, 0.890, 0, None),  # -2 pp
                ("16-true", 0, 0.93, 0, None), ("16-true", 1, None, None, "scale fell")]]
    speed = {"32-true": {"samples_per_s": 100.0, "step_time_ms": 640.0, "peak_mem_bytes": 1000},
             "16-mixed": {"samples_per_s": 150.0, "step_time_ms": 427.0, "peak_mem_bytes": 800},
             "bf16-mixed": {"samples_per_s": 200.0, "step_time_ms": 320.0, "peak_mem_bytes": 500}}
    rows = {r["precision"]: r for r in summarise(
        "32-true", ["32-true", "16-mixed", "bf16-mixed", "16-true"], runs, speed, 0.5)}
    assert rows["16-mixed"]["delta_acc_pp"] == pytest.approx(0.5)
    assert rows["16-mixed"]["verdict"] == "ok" and rows["16-mixed"]["skipped_steps"] == 3
    assert rows["bf16-mixed"]["verdict"] == "worse"
    assert rows["bf16-mixed"]["speedup"] == 2.0 and rows["bf16-mixed"]["mem_ratio"] == 0.5
    assert rows["16-true"]["verdict"] == "failed" and rows["16-true"]["speedup"] is None
    assert verdict(0.51, 0.5) == "better" and verdict(-0.51, 0.5) == "worse"
    assert verdict(None, 0.5) is None
    assert all(list(r) == SUMMARY_FIELDS for r in rows.values())


def test_state_bytes_count_weights_then_optimizer_state():
    model = torch.nn.Linear(256, 256)
    trainer = Trainer(precision="32-true", device="cpu", optimizer="adamw", no_progress=True,
                      batch_size=8)
    trainer.setup(model, TensorData(torch.randn(8, 256), torch.randint(0, 256, (8,))))
    weights = sum(p.numel() * 4 for p in model.parameters())
    assert state_bytes(trainer) == weights  # Adam's moments appear at its first step
    trainer.train_step(next(iter(trainer.train_windows.epoch(0))))
    trainer.finish_step()
    assert state_bytes(trainer) >= 3 * weights


def test_speed_only_study_skips_training_and_still_reports(tmp_path):
    out = tmp_path / "bench"
    result = run_compare(small_config(out), CompareOptions(
        precisions="bf16,32-true", bench_steps=2, timing_warmup=1, seeds=3, interleave=False))
    assert result["runs"] == [] and not (out / "runs").exists()
    assert [r["precision"] for r in result["summary"]] == ["32-true", "bf16-mixed"]
    for row in result["summary"]:
        assert list(row) == SUMMARY_FIELDS
        assert row["samples_per_s"] > 0 and row["val_acc_mean"] is None
        assert row["verdict"] is None
    assert "speed only" in (out / "report.md").read_text()
    assert Image.open(out / "compare.png").size == report.PNG_SIZE


# ---------------------------------------------------------------- the CLI
def test_cli_takes_train_options_and_compare_options_from_yaml_and_flags(tmp_path, capsys):
    config = tmp_path / "study.yaml"
    config.write_text(yaml.safe_dump({"model": "mlp", "precisions": ["32-true", "bf16-mixed"],
                                      "bench_steps": 1, "batch_size": 32}))
    out = tmp_path / "out"
    code = cli.main(["compare", "--config", str(config), "--batch-size", "16", "--timing-warmup",
                     "0", "--no-interleave", "--device", "cpu", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "bf16-mixed" in printed and "speedup" in printed
    details = json.loads((out / "study.json").read_text())
    assert details["config"]["model"] == "mlp" and details["config"]["batch_size"] == 16
    assert details["options"]["interleave"] is False
    assert details["speed"]["bf16-mixed"]["batch_samples"] == 16


@pytest.mark.parametrize("argv, message", [
    (["--precisions", "32-true,fp17"], "--precisions: unknown --precision 'fp17'"),
    (["--seeds", "0"], "--seeds must be an integer >= 1"),
    (["--tolerance-pp", "-1"], "--tolerance-pp must be a number >= 0"),
    (["--resume", "auto"], "unrecognized arguments: --resume"),
    # not silently read as --precisions bf16-mixed (argparse's prefix matching is off)
    (["--precision", "bf16-mixed"], "unrecognized arguments: --precision bf16-mixed"),
])
def test_cli_user_errors_exit_2_with_one_line(tmp_path, capsys, argv, message):
    assert _exit_code(["compare", "--out", str(tmp_path / "x"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_cli_refuses_an_out_dir_that_holds_a_study(tmp_path, capsys):
    (tmp_path / "compare.json").write_text("{}")
    assert _exit_code(["compare", "--out", str(tmp_path)]) == 2
    assert "already holds a compare study" in capsys.readouterr().err


def _exit_code(argv: list[str]) -> int:
    """main()'s exit code, whether it returns it or argparse exits with it."""
    try:
        return cli.main(argv)
    except SystemExit as exc:
        return exc.code


# ------------------------------------------------------------- acceptance
@pytest.mark.slow
def test_acceptance_digits_cnn_three_precisions_two_seeds(tmp_path):
    """The issue's acceptance run, end to end through the command line."""
    out = tmp_path / "study"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.perf_counter()
    completed = subprocess.run(
        [sys.executable, "-m", "amptrain", "compare", "--model", "cnn", "--data", "digits",
         "--seeds", "2", "--epochs", "1", "--timing-steps", "10", "--no-progress",
         "--out", str(out)], capture_output=True, text=True, env=env, timeout=600)
    elapsed = time.perf_counter() - started
    assert completed.returncode == 0, completed.stderr[-3000:]
    data = json.loads((out / "compare.json").read_text())
    assert set(data) == {"baseline", "runs", "summary"} and data["baseline"] == "32-true"
    assert [r["precision"] for r in data["summary"]] == PRECISIONS
    assert all(list(r) == SUMMARY_FIELDS for r in data["summary"])
    assert len(data["runs"]) == 6 and all(r["same_initial_weights"] for r in data["runs"])
    assert data["summary"][0]["speedup"] == 1.0
    for name in ("report.md", "report.html", "compare.png"):
        assert (out / name).stat().st_size > 1000
    print(f"acceptance study took {elapsed:.0f} s")  # shown with -s; never asserted
