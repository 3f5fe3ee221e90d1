"""Find what overflows or underflows in fp16, and what to do about it: ``amptrain diagnose``.

Four short runs of the same steps from the same initial weights and data, through the
:class:`~amptrain.trainer.Trainer`: ``32-true`` with per-module range statistics, then
``16-mixed`` as the user would train it (where inf/NaN first appears), ``16-mixed`` with
the recommendations applied (``keep_fp32`` + initial loss scale), and ``bf16-mixed``.

Modules, in the one direction data flows: :mod:`.ranges` (number formats, range
statistics, the hooks that record them) <- :mod:`.recommend` (fp32 islands, loss scale,
risk, bf16 verdict) <- :mod:`.writer` (summary, diagnose.md/.json) and :mod:`.run` (the
runs, :func:`diagnose`). The command line is :mod:`amptrain.commands.diagnose`.
"""
from __future__ import annotations

from .ranges import (
    BF16,
    BF16_MAX,
    E_MAX,
    E_MIN,
    FORMATS,
    FP16,
    FP16_MAX,
    N_BINS,
    SAMPLE_LIMIT,
    FormatLimits,
    RangeRecorder,
    RangeStats,
    floor_log2,
    fractions,
    summarize,
)
from .recommend import (
    ATTENTION_PARTS,
    NEAR_OVERFLOW_FACTOR,
    SCALE_HEADROOM,
    SCALE_LOG2_RANGE,
    SIGNIFICANT,
    attention_overflow,
    bf16_trouble,
    keep_fp32_candidates,
    module_risks,
    recommend_loss_scale,
)
from .run import RunSummary, diagnose, run_steps
from .writer import markdown_report, summary_lines, write_reports

__all__ = [
    "ATTENTION_PARTS", "BF16", "BF16_MAX", "E_MAX", "E_MIN", "FORMATS", "FP16", "FP16_MAX",
    "NEAR_OVERFLOW_FACTOR", "N_BINS", "SAMPLE_LIMIT", "SCALE_HEADROOM", "SCALE_LOG2_RANGE",
    "SIGNIFICANT", "FormatLimits", "RangeRecorder", "RangeStats", "RunSummary",
    "attention_overflow", "bf16_trouble", "diagnose", "floor_log2", "fractions",
    "keep_fp32_candidates", "markdown_report", "module_risks", "recommend_loss_scale",
    "run_steps", "summarize", "summary_lines", "write_reports",
]
