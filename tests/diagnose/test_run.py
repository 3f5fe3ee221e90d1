"""The diagnosis runs: the overflowing module is found, and its recommendation trains cleanly."""
from __future__ import annotations

import math
import warnings

import pytest

from amptrain.common.errors import AmptrainWarning, forget_warnings
from amptrain.config import RunConfig
from amptrain.diagnose.ranges import FP16_MAX
from amptrain.diagnose.run import diagnose, run_steps
from amptrain.diagnose.writer import summary_lines, write_reports
from amptrain.tasks.gan import GanTask
from tests.diagnose.conftest import (
    bundle,
    config,
    inflated_gpt,
    lm_bundle,
    peaked_model,
    scaled_model,
    tiled_model,
    train_16_mixed,
)


def test_overflow_module_is_found_and_its_recommendation_trains_cleanly():
    report = diagnose(config(), steps=4, data=bundle(), model=scaled_model(1e5))

    first = report["first_nonfinite"]
    assert (first["module"], first["phase"], first["step"]) == ("amplify", "forward", 1)
    assert report["modules"]["amplify"]["activation"]["abs_max"] > FP16_MAX
    assert next(iter(report["modules"])) == "amplify"  # riskiest first
    recs = report["recommendations"]
    keep = [k["pattern"] for k in recs["keep_fp32"]]
    assert "amplify" in keep
    assert all(k["reason"] for k in recs["keep_fp32"])
    assert report["runs"]["16-mixed"]["skipped_steps"] == 4
    assert recs["verified"]["clean"]
    assert recs["bf16"]["avoids_problem"]

    # Without the recommendation 16-mixed skips every step; with it, none.
    plain = train_16_mixed(1e5, steps=10, min_scale=2.0 ** -10)
    assert plain.precision.skipped_steps == 10
    fixed = train_16_mixed(1e5, steps=10, keep_fp32=keep, init_scale=recs["init_scale"],
                           min_scale=min(1.0, recs["init_scale"]))
    assert fixed.precision.skipped_steps == 0
    losses = [r["loss"] for r in fixed.history if "loss" in r]
    assert len(losses) == 10 and all(math.isfinite(v) for v in losses)


def test_gpt_attention_scores_that_overflow_fp16_are_named(tmp_path):
    report = diagnose(config(task="lm", lr=1e-4), steps=3, data=lm_bundle(),
                      model=inflated_gpt(3000.0))

    first = report["first_nonfinite"]
    assert (first["module"], first["phase"], first["step"]) == \
        ("blocks.0.attn.scores", "forward", 1)
    scores = report["modules"]["blocks.0.attn.scores"]
    assert scores["type"] == "AttentionScores"
    assert scores["activation"]["abs_max"] > FP16_MAX
    assert any("attention scores" in r for r in scores["reasons"])
    # q and k themselves fit in fp16: the overflow is in their products.
    assert report["modules"]["blocks.0.attn.qkv"]["activation"]["abs_max"] < FP16_MAX
    recs = report["recommendations"]
    assert recs["attention"]["modules"] == ["blocks.0.attn.scores", "blocks.1.attn.scores"]
    assert [k["pattern"] for k in recs["keep_fp32"]] == ["blocks.*.attn.scores"]
    assert "--keep-fp32 'blocks.*.attn.scores'" in recs["flags"]
    assert recs["verified"]["clean"] and recs["bf16"]["avoids_problem"]

    _, md = write_reports(report, tmp_path)
    text = md.read_text()
    assert "- attention: attention scores" in text and "`blocks.0.attn.scores`" in text


def test_gpt_attention_in_range_is_not_named():
    report = diagnose(config(task="lm"), steps=2, data=lm_bundle(), model=inflated_gpt(1.0))
    assert report["first_nonfinite"] is None
    assert report["recommendations"]["attention"] is None
    assert report["recommendations"]["keep_fp32"] == []
    # The recorder saw the attention's scores and softmax although training fuses them.
    assert report["modules"]["blocks.1.attn.softmax"]["activation"]["abs_max"] <= 1.0


@pytest.mark.slow
def test_gan_overflow_names_the_part_and_the_loss(monkeypatch):
    """diagnose on a GAN trains the GAN's own step (its two losses, through the task's
    training_step) and names the part and the loss whose values overflow fp16."""
    calls = []
    original = GanTask.training_step

    def spy(self, ctx):
        calls.append(ctx)
        return original(self, ctx)

    monkeypatch.setattr(GanTask, "training_step", spy)
    run = RunConfig.from_options(model="module:tests.diagnose.conftest.overflowing_gan",
                                 task="gan", data="digits", device="cpu", batch_size=32,
                                 no_progress=True, scheduler="none", lr=1e-4)
    report = diagnose(run, steps=2)

    # 32-true, 16-mixed and bf16-mixed runs of two steps each, every one the GAN's own
    # step (the check of the recommendation is a fourth when --keep-fp32 can apply).
    assert len(calls) >= 3 * 2
    first = report["first_nonfinite"]
    assert first["module"] == "discriminator.head.amplify" and first["phase"] == "forward"
    assert first["part"] == "discriminator"
    assert (first["loss_id"], first["loss"]) == (0, "d_loss")
    assert report["runs"]["16-mixed"]["first_nonfinite"]["part"] == "discriminator"
    assert report["runs"]["32-true"]["first_nonfinite"] is None
    line = next(s for s in summary_lines(report) if s.startswith("first non-finite"))
    assert "of part 'discriminator'" in line and "d_loss (loss_id 0)" in line
    # Each step steps both parts' optimizers, and each part's skip counts.
    assert report["runs"]["16-mixed"]["parts"] == 2
    assert "4 of 4 optimizer steps (2 steps x 2 parts) skipped" in line


def test_the_low_bit_report_measures_mx_with_mx_scale_and_the_fixed_runs_do_not_warn():
    """--mx-scale rceil: the report's mxfp4 keeps every block's peak (``peaked_model``;
    FLOOR saturates it) and says so; the 32-true, 16-mixed and bf16-mixed runs do not warn
    that rceil does nothing; --lowbit-bf16-last, which nothing here reads, warns once."""
    reports, said = {}, {}
    for mode in ("floor", "rceil"):
        forget_warnings()   # warn() speaks once per process
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", AmptrainWarning)
            reports[mode] = diagnose(config(mx_scale=mode, lowbit_bf16_last=1), steps=1,
                                     data=bundle(n=32), model=peaked_model())
        said[mode] = [str(w.message) for w in caught if "does nothing" in str(w.message)]
    weight = {m: r["recommendations"]["lowbit"]["modules"]["mid"]["mxfp4"]["weight"]
              for m, r in reports.items()}
    assert weight["floor"]["saturated"] >= 1 / 32 and weight["rceil"]["saturated"] == 0.0
    assert reports["rceil"]["recommendations"]["lowbit"]["mx_scale"] == "rceil"
    assert any("low-bit formats (MX block scales: rceil)" in line
               for line in summary_lines(reports["rceil"]))
    assert said["floor"] == said["rceil"] == [
        "lowbit_bf16_last 1 does nothing in diagnose's runs (32-true, 16-mixed, bf16-mixed) "
        "and its low-bit report: it keeps Linear layers of a low-bit precision in bf16"]


@pytest.mark.parametrize("no_progress", [True, False])
def test_steps_alone_set_each_runs_length_and_the_progress_is_the_configs(no_progress):
    seen = {}

    class Look:
        def __init__(self, trainer):
            seen["no_progress"] = trainer.config.logging.no_progress
            seen["epochs"] = trainer.run_length.epochs

        def remove(self):
            pass

    # 64 samples at batch 32: 2 steps an epoch; a config's --epochs 1 does not cut the run
    summary, _ = run_steps(config(epochs=1, no_progress=no_progress), bundle(n=64),
                           scaled_model(1.0), steps=5, precision="32-true", attach=Look)
    assert summary.steps == 5
    assert seen == {"no_progress": no_progress, "epochs": 3}


@pytest.mark.slow
def test_ppo_value_loss_overflow_is_named_at_the_critic_with_what_follows(tmp_path):
    pytest.importorskip("gymnasium")
    # MountainCar: -1 every step, unnormalised (the discrete recipe); undiscounted Monte
    # Carlo returns reach the rollout's length. At the default loss scale 65536 the
    # critic's weight gradients overflow fp16 in the scaled backward: steps are skipped
    # while no module's output is ever inf.
    config = RunConfig.from_options(data="gym:MountainCar-v0", gamma=1.0, gae_lambda=1.0,
                                    num_envs=2, rollout_steps=64, env_steps=1024, seed=0,
                                    no_progress=True, logger="none")
    report = diagnose(config, steps=8)
    fp16 = report["runs"]["16-mixed"]
    assert fp16["skipped_steps"] > 0 and report["first_nonfinite"] is None
    over = report["recommendations"]["run_scale_overflow"]
    assert over["init_scale"] == 65536 and over["modules"]
    for o in over["modules"]:
        assert o["module"].startswith("critic.") and o["path"] == "critic"
        assert o["scaled"] > FP16_MAX and "value loss (unnormalised rewards" in o["loss"]
        assert int(o["loss"].split("returns up to |")[1].split("|")[0]) > 32  # large returns
    # What follows is checked: the critic in fp32 at the same scale skips nothing, and
    # so does the recommended lower scale.
    assert over["keep_fp32_paths"] == {"keep_fp32": ["critic"], "skipped_steps": 0,
                                       "steps": 8}
    assert report["recommendations"]["init_scale"] < 65536
    assert report["recommendations"]["verified"]["skipped_steps"] == 0
    worst = over["modules"][0]["module"]
    assert report["modules"][worst]["reasons"][0].startswith("weight gradients x the loss "
                                                            "scale 65536 reach")
    lines = summary_lines(report)
    assert any(line.startswith(f"16-mixed: {fp16['skipped_steps']} of 8 steps skipped with "
                               "no non-finite module output") for line in lines)
    assert any(line.startswith(f"overflow at the loss scale 65536: {worst} weight gradients")
               and "the value loss" in line for line in lines)
    follows = next(line for line in lines if line.startswith("  follows: "))
    assert "--init-scale" in follows and "--keep-fp32 critic" in follows
    assert "smaller returns" in follows


def test_a_diagnosis_runs_halt_does_not_send_the_user_to_run_diagnose():
    summary, _ = run_steps(config(min_scale=2.0 ** 10, init_scale=2.0 ** 12), bundle(),
                           scaled_model(1e5), 6, "16-mixed")
    assert summary.halted and "loss scale fell" in summary.halted
    assert "amptrain diagnose" not in summary.halted and "diagnose_model" not in \
        summary.halted
    assert "the report of this diagnosis" in summary.halted


def test_the_low_bit_report_measures_nvfp4_without_the_part_left_out():
    """--nvfp4-without 2d: the report's nvfp4 measures the weight in 1x16 blocks (named
    "nvfp4 without 2d"), no warning; sr and rht leave the report's counts (and its name
    nvfp4) as they are, and the warning says so for that value only (for --precision
    nvfp4: its run reads it)."""
    reports, said = {}, {}
    for without, precision in (("none", "auto"), ("2d", "auto"), ("sr", "auto"),
                               ("rht", "nvfp4")):
        forget_warnings()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", AmptrainWarning)
            reports[without] = diagnose(config(nvfp4_without=without, precision=precision),
                                        steps=1, data=bundle(n=32), model=tiled_model())
        said[without] = [str(w.message) for w in caught if "nvfp4_without" in str(w.message)]
    lowbit = {w: r["recommendations"]["lowbit"] for w, r in reports.items()}
    flushed = {w: low["modules"]["mid"]["nvfp4"]["weight"]["flushed"]
               for w, low in lowbit.items()}
    # 1x16 blocks flush only the values near zero of a row's own range (about 4 %)
    assert flushed["none"] > 0.9 and flushed["2d"] < 0.1
    assert flushed["sr"] == flushed["rht"] == flushed["none"]
    assert lowbit["2d"]["nvfp4_without"] == "2d"
    assert lowbit["2d"]["labels"] == {"nvfp4": "nvfp4 without 2d"}
    assert lowbit["none"]["labels"] == lowbit["sr"]["labels"] == lowbit["rht"]["labels"] == {}
    line = next(s for s in summary_lines(reports["2d"]) if s.startswith("low-bit formats"))
    assert "; nvfp4 without 2d " in line and "; nvfp4-plain " in line
    why = ("the report counts the forward GEMM's input and weight and the grad-input GEMM's "
           "gradient, rounded to nearest, which nvfp4 without {} quantises as nvfp4 does")
    assert said["none"] == said["2d"] == []
    assert said["sr"] == [f"nvfp4_without sr does nothing in diagnose's runs (32-true, "
                          f"16-mixed, bf16-mixed) and its low-bit report: {why.format('sr')}"]
    assert said["rht"] == [f"nvfp4_without rht changes the nvfp4 run only, not diagnose's "
                           f"low-bit report: {why.format('rht')}"]
