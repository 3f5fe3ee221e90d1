"""``amptrain audit RUN_DIR``: the audit of an amptrain run from its ``config.yaml`` and,
when the run recorded it, its ``numerics.jsonl``.

amptrain's own loop is written by the book (the scaler unscales before clipping, the
schedule follows real steps, checkpoints hold the scaler), so the traps of a hand-written
loop cannot occur there; what a run can still show is in its numbers. Each line of
numerics.jsonl is one sampled step, module and tensor::

    {"step", "module", "tensor": "activation"|"weight"|"gradient", "format", "amax",
     "flushed", "saturated", "whatif": {"fp16": {"flushed", "saturated", "snr_db"}, ...}}

with ``flushed`` and ``saturated`` the shares (0..1) of the tensor's values flushed to zero
or saturated in the run's own ``format``.
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..common.errors import UserError
from ..common.yaml_files import load_yaml
from .findings import AuditReport, Finding

CONFIG, NUMERICS = "config.yaml", "numerics.jsonl"
#: Share of a tensor's values flushed to zero from which a finding is made.
FLUSHED_SHARE = 0.01
#: A what-if format is a candidate when no sampled tensor flushes more than FLUSHED_SHARE,
#: none saturates, and the worst quantisation SNR is at least this.
CANDIDATE_SNR_DB = 20.0
#: Half-weight precisions: the weights themselves are fp16/bf16 (no fp32 master).
HALF_WEIGHTS = ("16-true", "bf16-true")


@dataclass
class Worst:
    """The worst sampled value of one measure for one (module, tensor), and its step."""

    value: float
    step: int
    module: str
    tensor: str


def _number(record: dict[str, Any], key: str) -> float | None:
    value = record.get(key)
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def read_numerics(path: Path) -> list[dict[str, Any]]:
    """The records of ``numerics.jsonl`` (a line that is not a JSON object is refused)."""
    records = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                raise UserError(f"amptrain audit: {path} line {number} is not JSON") from None
            if not isinstance(record, dict):
                raise UserError(f"amptrain audit: {path} line {number} is not a JSON object")
            records.append(record)
    return records


def _worst(records: Iterable[dict[str, Any]], measure: Any) -> dict[tuple[str, str], Worst]:
    """Per (module, tensor): the largest ``measure(record)`` over the sampled steps."""
    found: dict[tuple[str, str], Worst] = {}
    for r in records:
        value = measure(r)
        if value is None:
            continue
        key = (str(r.get("module", "?")), str(r.get("tensor", "?")))
        if key not in found or value > found[key].value:
            found[key] = Worst(value, int(r.get("step", 0) or 0), *key)
    return found


def _listed(worst: list[Worst], percent: bool = True) -> str:
    return "; ".join(f"{w.module} {w.tensor} {100 * w.value:.2f} % at step {w.step}"
                     if percent else f"{w.module} {w.tensor} at step {w.step}" for w in worst)


def numerics_findings(records: list[dict[str, Any]], precision: str) -> list[Finding]:
    """What the sampled numbers say: tensors that flush or saturate in the run's format,
    and the what-if formats every sampled tensor would have fitted."""
    findings = []
    flushed = sorted(_worst(records, lambda r: _number(r, "flushed")).values(),
                     key=lambda w: -w.value)
    flushed = [w for w in flushed if w.value >= FLUSHED_SHARE]
    if flushed:
        fmt = next((str(r.get("format")) for r in records if r.get("format")), precision)
        findings.append(Finding(
            "flush-to-zero", "warning", flushed[0].module,
            f"{len(flushed)} sampled module tensors lose at least {100 * FLUSHED_SHARE:g} % of "
            f"their values to zero in {fmt}: {_listed(flushed[:3])}",
            "keep these modules in fp32 (--keep-fp32 NAME) or use a wider format (bf16)"))
    saturated = sorted(_worst(records, lambda r: _number(r, "saturated")).values(),
                       key=lambda w: -w.value)
    saturated = [w for w in saturated if w.value > 0]
    if saturated:
        findings.append(Finding(
            "saturation", "warning", saturated[0].module,
            f"{len(saturated)} sampled module tensors saturate in the run's format: "
            f"{_listed(saturated[:3])}",
            "keep these modules in fp32 (--keep-fp32 NAME), or lower the loss scale"))
    fits = []
    for fmt in dict.fromkeys(k for r in records for k in (r.get("whatif") or {})):
        rows = [(r.get("whatif") or {}).get(fmt) or {} for r in records]
        worst_flush = max((_number(x, "flushed") or 0.0 for x in rows), default=0.0)
        worst_sat = max((_number(x, "saturated") or 0.0 for x in rows), default=0.0)
        snrs = [s for x in rows if (s := _number(x, "snr_db")) is not None]
        if snrs and worst_flush < FLUSHED_SHARE and worst_sat == 0 \
                and min(snrs) >= CANDIDATE_SNR_DB:
            fits.append(f"{fmt} (worst SNR {min(snrs):.1f} dB)")
    if fits:
        steps = len({r.get("step") for r in records})
        findings.append(Finding(
            "whatif-fits", "info", "",
            f"over {steps} sampled steps every module tensor would fit in: {', '.join(fits)} "
            f"(flushed < {100 * FLUSHED_SHARE:g} %, none saturated, SNR >= "
            f"{CANDIDATE_SNR_DB:g} dB)",
            "try the cheapest of these with `amptrain compare --precisions ...`"))
    return findings


def config_findings(config: dict[str, Any]) -> list[Finding]:
    """What the resolved config alone says."""
    precision = str(config.get("precision", ""))
    findings = []
    if precision in HALF_WEIGHTS and config.get("weight_update", "plain") == "plain":
        findings.append(Finding(
            "update-below-ulp", "warning", f"precision {precision}",
            f"the weights are kept in {precision.split('-')[0]} with plain rounding: updates "
            "under half an ulp of a weight are lost (not measured from config.yaml alone)",
            "use --weight-update kahan or stochastic, or a -master/-mixed precision"))
    return findings


def audit_run_dir(path: str | Path) -> tuple[AuditReport, bool]:
    """The report of the run in ``path``, and whether numerics.jsonl was there."""
    run = Path(path)
    if not (run / CONFIG).is_file():
        raise UserError(f"amptrain audit: {run} holds no {CONFIG}; give an amptrain run "
                        "directory, or a command after `--`")
    config = load_yaml(run / CONFIG, keep_resolved=True)
    report = AuditReport()
    report.extend(config_findings(config))
    has_numerics = (run / NUMERICS).is_file()
    if has_numerics:
        records = read_numerics(run / NUMERICS)
        report.steps = len({r.get("step") for r in records})
        report.extend(numerics_findings(records, str(config.get("precision", ""))))
    return report, has_numerics
