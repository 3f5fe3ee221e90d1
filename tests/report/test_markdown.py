"""amptrain.report.markdown: report.md."""
from __future__ import annotations

from amptrain.report.markdown import render_markdown
from amptrain.report.load import load_study
from amptrain.report.tables import fastest, markdown_table


def test_markdown_report_has_the_table_plot_and_hardware(study):
    text = (study["out"] / "report.md").read_text()
    assert "| `32-true` (baseline) |" in text and "| `bf16-mixed` |" in text
    assert "![" in text and "(compare.png)" in text
    assert "## Hardware and software" in text and "torch" in text
    best = fastest(study["result"]["summary"])
    if best != "32-true":
        # The row may carry a mark after the name: "| `16-mixed` (emulated) |".
        assert "**" in next(line for line in text.splitlines()
                            if line.startswith(f"| `{best}`"))


def test_render_markdown_sections_in_order(tiny_study):
    study = load_study(tiny_study)
    text = render_markdown(study)
    lines = text.splitlines()
    assert lines[0] == "# amptrain compare — cnn on digits"
    assert lines[2] == ("**16-mixed is 1.50× faster than 32-true, 0.60× the memory, "
                        "accuracy within ±0.5 pp (+0.20 pp).**")
    assert markdown_table(study.summary, study.baseline) in text
    headings = [line for line in lines if line.startswith("## ")]
    assert headings == ["## Runs", "## How it was measured", "## Hardware and software"]
    assert ("| `16-mixed` | 1 | 91.00 % | 0.4000 | 0.3000 | 1 | 8 | 1.5 s | yes | "
            "`runs/16-mixed/seed-1` |") in lines
    assert "```bash\namptrain compare --model cnn --data digits --out 'a&b'\n```" in text
    assert "| torch | 2.13.0+cpu |" in lines and lines[-1] == "| gpus | none |"
    assert text.endswith("|\n")


def test_render_markdown_flags_halted_runs_and_different_initial_weights(tiny_study):
    study = load_study(tiny_study)
    study.compare["runs"][1].update(halted="loss scale fell below 1", val_acc=None)
    study.compare["runs"][2]["same_initial_weights"] = False
    runs = [line for line in render_markdown(study).splitlines() if "| `runs/" in line]
    assert runs[1].startswith("| `32-true` | 1 | halted |")
    assert "| **no** |" in runs[2]


def test_render_markdown_of_a_speed_only_study(speed_only_study):
    text = render_markdown(load_study(speed_only_study))
    assert "(speed only: accuracy not measured)" in text
    assert "## Runs" not in text
    assert "## How it was measured" in text
