"""report.html: one self-contained page (styles inline, plots as base64 PNGs), so it can be
mailed or archived as a single file and opened offline."""
from __future__ import annotations

import base64
import html

from .context import _config_line, _device_line, _method_lines, _title, env_rows
from .plots import panel_row
from .load import SAMPLES_PNG, Study, _num, delta_of, run_metric_cell, sample_grids
from .tables import _cells, columns, fastest, recommendation, seed_warning, timing_warning

#: Inline rather than a linked stylesheet: the page must stay one self-contained file.
_CSS = """
:root { --fg:#1f2430; --muted:#667085; --line:#e4e7ec; --bg:#f6f7f9; --ok:#1e7b34;
        --okbg:#e3f4e7; --bad:#b42318; --badbg:#fde8e7; --good:#175cd3; --goodbg:#e5efff; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--fg);
       font:15px/1.5 -apple-system, "Segoe UI", Roboto, "DejaVu Sans", Arial, sans-serif; }
main { max-width:1240px; margin:0 auto; padding:28px 24px 48px; }
h1 { font-size:26px; margin:0 0 4px; }
h2 { font-size:18px; margin:32px 0 12px; }
.sub { color:var(--muted); margin:0 0 20px; }
.headline { background:#fff; border:1px solid var(--line); border-left:6px solid var(--good);
            border-radius:10px; padding:14px 18px; font-size:17px; font-weight:600; }
.card { background:#fff; border:1px solid var(--line); border-radius:10px; padding:16px;
        overflow-x:auto; }
table { border-collapse:collapse; width:100%; font-variant-numeric:tabular-nums; }
th, td { padding:8px 7px; border-bottom:1px solid var(--line); text-align:right;
         white-space:nowrap; }
/* The summary must fit a 1280 px window without a scrollbar: headers, names (with the
   user's alias and "(emulated)") and the speedup's spread wrap instead of widening it. */
table.summary th { white-space:normal; vertical-align:bottom; }
table.summary td.name { white-space:normal; min-width:10em; }
.iqr { display:block; font-size:12px; color:var(--muted); }
th { font-size:11px; text-transform:uppercase; letter-spacing:.03em; color:var(--muted);
     font-weight:600; }
th:first-child, td:first-child { text-align:left; }
tr.baseline td { background:#fafbfc; }
td.name { font-weight:700; }
.swatch { display:inline-block; width:10px; height:10px; border-radius:2px; margin-right:8px; }
.tag { display:inline-block; font-size:11px; font-weight:700; padding:1px 7px; border-radius:99px;
       margin-left:6px; background:#eef0f3; color:var(--muted); vertical-align:1px; }
.tag.fast { background:#fff4d6; color:#8a5a00; }
.verdict { display:inline-block; min-width:64px; text-align:center; font-weight:700;
           padding:2px 10px; border-radius:99px; }
.v-ok { background:var(--okbg); color:var(--ok); }
.v-worse, .v-failed { background:var(--badbg); color:var(--bad); }
.v-better { background:var(--goodbg); color:var(--good); }
.v-na { background:#eef0f3; color:var(--muted); }
td.best { background:#fff4d6; font-weight:800; }
.neg { color:var(--bad); } .pos { color:var(--good); }
img { display:block; width:100%; height:auto; }
ul.method { margin:0; padding-left:20px; } ul.method li { margin:4px 0; }
pre { background:#0f1720; color:#e6edf3; padding:12px 14px; border-radius:8px; overflow-x:auto; }
td.path, th.path { text-align:left; }
table.env td { text-align:left; white-space:normal; } table.env td:first-child { color:var(--muted);
  width:210px; }
.warning { background:var(--badbg); color:var(--bad); border-radius:10px; padding:10px 14px;
           font-weight:600; }
footer { color:var(--muted); font-size:13px; margin-top:28px; }
.grids { display:flex; flex-wrap:wrap; gap:16px; }
.grids figure { margin:0; flex:1 1 220px; max-width:360px; }
.grids img { image-rendering:pixelated; border:1px solid var(--line); border-radius:6px; }
.grids figcaption { font-size:13px; color:var(--muted); margin-top:6px; }
"""


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _html_table(study: Study) -> str:
    best = fastest(study.summary)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns(study.summary))
    body = []
    for row in study.summary:
        cells = [html.escape(c) for c in _cells(row, study.baseline, study.emulated,
                                                 study.given, study.names)]
        p = row["precision"]
        tags = ""
        if p == study.baseline:
            tags += '<span class="tag">baseline</span>'
        if p == best:
            tags += '<span class="tag fast">fastest</span>'
        cells[0] = (f'<span class="swatch" style="background:{study.colour(p)}"></span>'
                    f"{cells[0]}{tags}")
        v = row["verdict"] or "na"
        cells[1] = f'<span class="verdict v-{html.escape(v)}">{cells[1]}</span>'
        delta = delta_of(row, study.task)
        if p != study.baseline and delta is not None and delta != 0:
            # Red when worse in the metric's direction (a lower perplexity is better).
            worse = (delta < 0) == study.task.metrics.primary.higher_is_better
            cells[3] = f'<span class="{"neg" if worse else "pos"}">{cells[3]}</span>'
        speed, _, spread = cells[5].partition(" (")
        if spread:  # the per-round spread under the speedup, not beside it
            cells[5] = f'{speed}<span class="iqr">({spread}</span>'
        classes = [["name"]] + [[] for _ in cells[1:]]
        if p == best:
            classes[5].append("best")
        tds = "".join(f'<td class="{" ".join(c)}">{cell}</td>' if c else f"<td>{cell}</td>"
                      for cell, c in zip(cells, classes))
        body.append(f'<tr class="{"baseline" if p == study.baseline else ""}">{tds}</tr>')
    return (f'<table class="summary"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>")


def _html_warning(study: Study) -> str:
    warnings = [w for w in (timing_warning(study.summary), seed_warning(study.summary)) if w]
    return "".join(f'<p class="warning">⚠️ {html.escape(w)}</p>' for w in warnings)


def _html_runs(study: Study) -> str:
    runs = study.compare.get("runs", [])
    if not runs:
        return ""
    primary = study.task.metrics.primary
    metric = "val acc" if primary.key == "acc" else f"val {primary.label}"
    head = "".join(f"<th>{c}</th>" for c in ("precision", "seed", metric, "val loss",
                                             "final loss", "skipped", "steps", "wall time",
                                             "same init")) + '<th class="path">directory</th>'
    rows = []
    for r in runs:
        acc = run_metric_cell(r, study.task)
        same = {True: "yes", False: "NO"}.get(r.get("same_initial_weights"), "n/a")
        cells = [study.name_of(r["precision"]), str(r["seed"]), acc,
                 _num(r.get("val_loss"), ".4f"),
                 _num(r.get("final_loss"), ".4f"), str(r.get("skipped_steps", "n/a")),
                 str(r.get("steps", "n/a")), _num(r.get("wall_s"), ".1f", " s"), same, r["dir"]]
        rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells[:-1])
                    + f'<td class="path">{html.escape(cells[-1])}</td></tr>')
    return (f'<h2>Runs</h2><div class="card"><table><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table></div>")


def _html_samples(study: Study) -> str:
    """Each precision's sample grid side by side (embedded, so the page stays one file)."""
    grids = sample_grids(study)
    if not grids:
        return ""
    figures = []
    for p, run, path in grids:
        png = path.read_bytes()
        caption = (f"{p}, seed {run['seed']}: val {study.task.metrics.primary.label} "
                   f"{run_metric_cell(run, study.task)}")
        figures.append(f"<figure>{_img(png, f'generated samples, {p}')}"
                       f"<figcaption>{html.escape(caption)}</figcaption></figure>")
    return (f'<h2>Samples</h2><div class="card"><div class="grids">{"".join(figures)}</div>'
            f'<p class="sub">The final evaluation\'s generated images of each precision\'s '
            f"first seed ({SAMPLES_PNG} of its run).</p></div>")


def render_html(study: Study) -> str:
    """report.html: one self-contained page (styles inline, plots as base64 PNGs)."""
    headline = recommendation(study.summary, study.baseline, study.tolerance, study.emulated)
    metric = study.task.metrics.primary.label
    esc = html.escape
    speed_png = panel_row(study, ["throughput", "memory", "accuracy"])
    curves_png = panel_row(study, ["loss", "loss_scale"], widths=[2, 1])
    env = "".join(f"<tr><td>{esc(k)}</td><td>{esc(v)}</td></tr>" for k, v in env_rows(study))
    method = "".join(f"<li>{esc(line)}</li>" for line in _method_lines(study))
    command = f"<pre>{esc(study.details['command'])}</pre>" if study.details.get("command") else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(_title(study))}</title><style>{_CSS}</style></head>
<body><main>
<h1>{esc(_title(study))}</h1>
<p class="sub">{esc(_device_line(study))} · {esc(_config_line(study))} ·
relative to <b>{esc(study.baseline)}</b> measured in the same invocation</p>
<div class="headline">{esc(headline)}</div>
<h2>Summary</h2>
<div class="card">{_html_table(study)}</div>{_html_warning(study)}
<h2>Speed, memory and {esc(metric)}</h2>
<div class="card">{_img(speed_png, f"throughput, peak memory and {metric} per precision")}</div>
<h2>Training curves</h2>
<div class="card">{_img(curves_png, "training loss and fp16 loss scale over steps")}</div>
{_html_samples(study)}
{_html_runs(study)}
<h2>How it was measured</h2>
<div class="card"><ul class="method">{method}</ul>{command}</div>
<h2>Hardware and software</h2>
<div class="card"><table class="env">{env}</table></div>
<footer>Generated by amptrain compare · {esc(study.details.get("started", ""))}</footer>
</main></body></html>
"""
