"""report.md: the study as Markdown, with compare.png beside it."""
from __future__ import annotations

from .context import _config_line, _method_lines, _title, env_rows
from .study import Study, _num
from .tables import markdown_table, recommendation


def render_markdown(study: Study) -> str:
    """report.md: headline, table, plot, runs, method and hardware."""
    tolerance = study.details.get("options", {}).get("tolerance_pp", 0.5)
    parts = [f"# {_title(study)}", "",
             f"**{recommendation(study.summary, study.baseline, tolerance, study.emulated)}**", "",
             (f"Speedup, memory ratio and Δ accuracy are relative to `{study.baseline}` "
              f"measured in the same invocation. {_config_line(study)}."), "",
             markdown_table(study.summary, study.baseline, study.emulated), "",
             "![loss curves, loss scale, throughput, memory and accuracy](compare.png)", ""]
    runs = study.compare.get("runs", [])
    if runs:
        parts += ["## Runs", "", ("| precision | seed | val acc | val loss | final loss "
                                  "| skipped | steps | wall time | same init | directory |"),
                  "|---|---:|---:|---:|---:|---:|---:|---:|:---:|---|"]
        for r in runs:
            same = {True: "yes", False: "**no**"}.get(r.get("same_initial_weights"), "n/a")
            acc = "halted" if r.get("halted") else _num(
                None if r.get("val_acc") is None else r["val_acc"] * 100, ".2f", " %")
            parts.append(f"| `{r['precision']}` | {r['seed']} | {acc} | "
                         f"{_num(r.get('val_loss'), '.4f')} | {_num(r.get('final_loss'), '.4f')} | "
                         f"{r.get('skipped_steps', 'n/a')} | {r.get('steps', 'n/a')} | "
                         f"{_num(r.get('wall_s'), '.1f', ' s')} | {same} | `{r['dir']}` |")
        parts.append("")
    parts += ["## How it was measured", ""] + [f"- {line}" for line in _method_lines(study)]
    if study.details.get("command"):
        parts += ["", "```bash", study.details["command"], "```"]
    parts += ["", "## Hardware and software", "", "| | |", "|---|---|"]
    parts += [f"| {k} | {v} |" for k, v in env_rows(study)]
    return "\n".join(parts) + "\n"
