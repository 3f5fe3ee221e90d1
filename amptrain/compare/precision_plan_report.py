"""What ``amptrain plan`` writes: DIR/precision-plan.yaml (the plan, with its evidence,
readable by ``--precision plan:FILE``), plan.json (everything) and plan.md (the tables)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ..common import outdir
from ..diagnose.sensitivity import LayerSensitivity
from ..precision.hardware.peak_rates import ESTIMATE_LABEL, speed_estimates
from ..tasks import delta_field

if TYPE_CHECKING:
    from .precision_plan import Search


def plan_yaml(fmt: str, baseline: str, layers: dict[str, str], share: float,
              evidence: list[dict[str, Any]] | None = None, header: str = "") -> str:
    """A precision plan file: ``layers`` (module -> format) and what the reader should
    know (the format, the baseline, the FLOPs share, the search's evidence)."""
    data: dict[str, Any] = {"format": fmt, "baseline": baseline,
                            "lowbit_flops_share": round(share, 4), "layers": layers}
    if evidence is not None:
        data["evidence"] = evidence
    return header + yaml.safe_dump(data, sort_keys=False, width=100)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f} %"


def _num(value: Any) -> str:
    return "-" if value is None else (f"{value:.4g}" if isinstance(value, float) else str(value))


def markdown(report: dict[str, Any]) -> str:
    """plan.md: the plan, the ranking and every search run."""
    task, fmt = report["task"], report["format"]
    lines = [f"# Precision plan: {fmt} against {report['baseline']}", "",
             f"{report['plan']['layers_in_format']} of {len(report['ranking'])} eligible "
             f"Linear layers in {fmt}: **{_pct(report['plan']['lowbit_flops_share'])}** of "
             f"their matmul FLOPs; verdict against {report['baseline']}: "
             f"**{report['plan']['verdict']}** ({task['metric']}, tolerance "
             f"{task['tolerance_why']}).", ""]
    if report["cut_short"]:
        lines += [f"The search was cut short: {report['cut_short']}.", ""]
    estimate = report["speed_estimate"]
    shown = ", ".join(f"{gpu} {'x%.2f' % x if x is not None else f'no {fmt} hardware'}"
                      for gpu, x in estimate.items() if gpu != "label")
    lines += [f"Expected Linear-matmul speedup over bf16 ({estimate['label']}): {shown}.", ""]
    lines += ["Train with it: `--precision plan:" + report["plan"]["file"] + "`", "",
              "## Ranking (least sensitive first)", "",
              "| layer | FLOPs share | flushed | saturated | SNR dB | loss change | score |",
              "|---|---|---|---|---|---|---|"]
    total = sum(r["flops"] for r in report["ranking"]) or 1
    for r in report["ranking"]:
        out = " (stands out: ranked last)" if r.get("loss_outlier") else ""
        lines.append(f"| {r['name']} | {_pct(r['flops'] / total)} | {_pct(r['flushed'])} | "
                     f"{_pct(r['saturated'])} | {_num(r['snr_db'])} | "
                     f"{_num(r['loss_delta'])}{out} | {_num(r['score'])} |")
    delta = task["delta_field"]
    lines += ["", f"## Search ({len(report['search'])} candidate runs, baseline "
              f"{task['metric']} {_num(report['baseline_value'])})", "",
              f"| candidate | layers in {fmt} | FLOPs share | {task['metric']} | {delta} | "
              f"verdict |", "|---|---|---|---|---|---|"]
    for e in report["search"]:
        lines.append(f"| {e['candidate']} | {len(e['layers'])} | "
                     f"{_pct(e['lowbit_flops_share'])} | {_num(e['value'])} | "
                     f"{_num(e[delta])} | {e['verdict']} |")
    lines += ["", f"Budget: {report['budget']['steps_spent']} training steps, "
              f"{report['budget']['seconds']:.1f} s.", ""]
    return "\n".join(lines)


def write_outputs(out: Path, search: Search, ranking: list[LayerSensitivity],
                  chosen: list[str], linear_flops: dict[str, int], *,
                  command: str | None = None) -> dict[str, Any]:
    """Write precision-plan.yaml, plan.json and plan.md; returns plan.json's content.
    ``linear_flops``: every plain Linear's multiply-adds per token (for the estimate)."""
    share = search.share(chosen)
    evidence = search.evidence
    chosen_key = frozenset(chosen)
    verdict = next((e["verdict"] for e in evidence if frozenset(e["layers"]) == chosen_key),
                   "no layer in the format" if not chosen else None)
    plan_file = out / "precision-plan.yaml"
    header = (f"# amptrain plan: {len(chosen)} Linear layers in {search.fmt}, "
              f"{100 * share:.0f} % of the eligible matmul FLOPs; verdict against "
              f"{search.baseline}: {verdict}\n"
              + (f"# the search was cut short: {search.budget.cut_short}\n"
                 if search.budget.cut_short else "")
              + f"# use: --precision plan:{plan_file}\n")
    outdir.write_text(plan_file, plan_yaml(search.fmt, search.baseline,
                                           search.all_layers(chosen), share, evidence,
                                           header), replace=False)
    task = search.task
    report = {
        "command": command, "format": search.fmt, "baseline": search.baseline,
        "seeds": search.seeds,
        "task": {"name": task.name, "metric": task.metrics.primary.key,
                 "delta_field": delta_field(task), "tolerance": search.tolerance.value,
                 "tolerance_why": search.tolerance.why},
        "baseline_value": search.baseline_value(f"val_{task.metrics.primary.key}_mean"),
        "plan": {"file": str(plan_file), "layers": search.all_layers(chosen),
                 "layers_in_format": len(chosen), "lowbit_flops_share": share,
                 "verdict": verdict},
        "speed_estimate": {"label": ESTIMATE_LABEL, **speed_estimates(
            linear_flops, {name: search.fmt for name in chosen})},
        "ranking": [s.to_json() for s in ranking],
        "search": evidence,
        "cut_short": search.budget.cut_short,
        "budget": {"steps": search.budget.steps, "steps_spent": search.budget.spent_steps,
                   "time_s": search.budget.seconds, "seconds": search.budget.elapsed()},
    }
    outdir.write_text(out / "plan.json", json.dumps(report, indent=2) + "\n", replace=False)
    outdir.write_text(out / "plan.md", markdown(report), replace=False)
    return report
