"""report.md: the study as Markdown, with compare.png beside it."""
from __future__ import annotations

from .context import _config_line, _method_lines, _title, env_rows
from .load import Study, _num, run_metric_cell, sample_grids
from .tables import markdown_table, recommendation, seed_warning, timing_warning


def render_markdown(study: Study) -> str:
    """report.md: headline, table, plot, runs, method and hardware."""
    metric = study.task.metrics.primary.label
    headline = recommendation(study.summary, study.baseline, study.tolerance, study.emulated)
    parts = [f"# {_title(study)}", "", f"**{headline}**", "",
             (f"Speedup, memory ratio and Δ {metric} are relative to `{study.baseline}` "
              f"measured in the same invocation. {_config_line(study)}."), "",
             markdown_table(study.summary, study.baseline, study.emulated, study.given,
                            study.names), "",
             *([f"> ⚠️ {warning}", ""] if (warning := timing_warning(study.summary)) else []),
             *([f"> ⚠️ {weak}", ""] if (weak := seed_warning(study.summary)) else []),
             f"![loss curves, loss scale, throughput, memory and {metric}](compare.png)", ""]
    runs = study.compare.get("runs", [])
    if runs:
        column = "val acc" if study.task.metrics.primary.key == "acc" else f"val {metric}"
        parts += ["## Runs", "", (f"| precision | seed | {column} | val loss | final loss "
                                  "| skipped | steps | wall time | same init | directory |"),
                  "|---|---:|---:|---:|---:|---:|---:|---:|:---:|---|"]
        for r in runs:
            same = {True: "yes", False: "**no**"}.get(r.get("same_initial_weights"), "n/a")
            acc = run_metric_cell(r, study.task)
            parts.append(f"| `{study.name_of(r['precision'])}` | {r['seed']} | {acc} | "
                         f"{_num(r.get('val_loss'), '.4f')} | {_num(r.get('final_loss'), '.4f')} | "
                         f"{r.get('skipped_steps', 'n/a')} | {r.get('steps', 'n/a')} | "
                         f"{_num(r.get('wall_s'), '.1f', ' s')} | {same} | `{r['dir']}` |")
        parts.append("")
    grids = sample_grids(study)
    if grids:  # each precision's generated samples (a generative task's runs)
        parts += ["## Samples", "", "| " + " | ".join(f"`{p}`" for p, _, _ in grids) + " |",
                  "|" + "---|" * len(grids),
                  "| " + " | ".join(f"![{p} samples]({path.relative_to(study.out).as_posix()})"
                                    for p, _, path in grids) + " |",
                  "| " + " | ".join(f"seed {run['seed']}: {run_metric_cell(run, study.task)}"
                                    for _, run, _ in grids) + " |", ""]
    parts += ["## How it was measured", ""] + [f"- {line}" for line in _method_lines(study)]
    if study.details.get("command"):
        parts += ["", "```bash", study.details["command"], "```"]
    parts += ["", "## Hardware and software", "", "| | |", "|---|---|"]
    parts += [f"| {k} | {v} |" for k, v in env_rows(study)]
    return "\n".join(parts) + "\n"
