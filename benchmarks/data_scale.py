"""Real data at real scale (issue 24): does memory and start-up stay flat as data grows?

* ``prepare`` throughput (MB of text per second) per number of processes, on the Python
  standard library's sources repeated to >= 50 MB (symlinks: the corpus costs no disk);
* peak RSS and time to the first training step of ``train --data tokens:`` on that
  corpus against a tiny one, and the same for a second ``text:`` run (the token cache);
* an image folder of 4000 generated PNGs against 1000: peak RSS, samples/s and
  ``data_wait_frac`` with 0, 1 and 2 DataLoader workers, against the in-memory path (the
  same images decoded into an npz file).

Every measurement is a fresh ``python`` process (peak RSS from ``wait4``'s rusage);
variants alternate (A B A B) and medians are reported. Run:
``python benchmarks/data_scale.py [--reps 2] [--write]``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CHILD_ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
GPT = "gpt:layers=2,heads=2,width=64"
FIRST = "FIRST_STEP_AT"


# ----------------------------------------------------------------------- the child
def child(argv: list[str]) -> None:
    """A training run that prints when its first step ended (wall clock)."""
    sys.path.insert(0, str(ROOT))
    from amptrain.config import RunConfig, build_config
    from amptrain.workflows.runner import run_training

    class FirstStep:
        def on_step_end(self, trainer: Any) -> None:
            if trainer.step == 1:
                print(f"{FIRST} {time.time():.4f}", flush=True)

    options = json.loads(argv[0])
    config = build_config(RunConfig, options, source="option")
    result = run_training(config, callbacks=[FirstStep()])
    print("RESULT " + json.dumps({"samples_per_s": result.samples_per_s,
                                  "data_wait_frac": result.data_wait_frac}), flush=True)


def run_child(options: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, Any]:
    """(first-step seconds after launch, peak RSS MB, result) of one training process."""
    started = time.time()
    proc = subprocess.Popen([sys.executable, __file__, "--child", json.dumps(options)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**CHILD_ENV, **(env or {})})
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"child failed: {options}\n{err[-2000:]}")
    first = next(float(line.split()[1]) for line in out.splitlines() if line.startswith(FIRST))
    result = json.loads(next(line[7:] for line in out.splitlines()
                             if line.startswith("RESULT ")))
    return {"first_step_s": first - started, "rss_mb": _peak_rss_mb(proc), **result}


def _peak_rss_mb(proc: subprocess.Popen) -> float:
    return proc.peak_rss_kb / 1024  # type: ignore[attr-defined]


class _Popen(subprocess.Popen):
    """Popen that reaps its child with wait4, keeping the child's peak RSS."""

    peak_rss_kb = 0

    def _try_wait(self, wait_flags: int) -> tuple[int, int]:  # type: ignore[override]
        try:
            pid, status, usage = os.wait4(self.pid, wait_flags)
        except ChildProcessError:
            return self.pid, 0
        if pid:
            self.peak_rss_kb = usage.ru_maxrss
        return pid, status


subprocess.Popen = _Popen  # type: ignore[misc]


# ----------------------------------------------------------------------- corpora
def stdlib_corpus(directory: Path, min_mb: float) -> float:
    """The standard library's .py files (no site-packages), symlinked in copies until the
    corpus holds ``min_mb``; returns its MB."""
    lib = Path(os.__file__).parent
    files = sorted(p for p in lib.rglob("*.py") if "site-packages" not in p.parts)
    total, rep = 0, 0
    while total < min_mb * 1e6:
        for f in files:
            link = directory / f"rep{rep}" / f.relative_to(lib)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(f)
            total += f.stat().st_size
        rep += 1
    return total / 1e6


def tiny_corpus(directory: Path) -> None:
    lib = Path(os.__file__).parent
    directory.mkdir(parents=True)
    for name in ("os.py", "argparse.py"):
        (directory / name).symlink_to(lib / name)


def amptrain_cli(*args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([sys.executable, "-m", "amptrain", *args], capture_output=True,
                          text=True, env={**CHILD_ENV, **(env or {})})
    if done.returncode != 0:
        raise SystemExit(f"amptrain {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return done.stdout


def images(directory: Path, count: int, size: int = 32, classes: int = 4) -> None:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(count)
    for i in range(count):
        c = i % classes
        pixels = rng.integers(0, 120, (size, size, 3)) + 40 * c
        path = directory / f"class{c}" / f"{i:05d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels.astype(np.uint8)).save(path)


def images_npz(folder: Path, path: Path) -> None:
    """The same images decoded into memory (the in-memory path: npz:FILE)."""
    import numpy as np
    from PIL import Image

    xs, ys = [], []
    for c, sub in enumerate(sorted(folder.iterdir())):
        for f in sorted(sub.iterdir()):
            xs.append(np.asarray(Image.open(f).convert("RGB")).transpose(2, 0, 1))
            ys.append(c)
    np.savez(path, x=np.stack(xs), y=np.array(ys))


# ----------------------------------------------------------------------- measuring
def median(values: list[float]) -> float:
    return statistics.median(values)


def spread(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}" if len(values) > 1 else "-"


def alternate(variants: dict[str, Any], reps: int, measure: Any) -> dict[str, list[Any]]:
    """``measure(value)`` for each variant, alternating A B, B A, ... ``reps`` times."""
    results: dict[str, list[Any]] = {k: [] for k in variants}
    names = list(variants)
    for r in range(reps):
        for name in (names if r % 2 == 0 else names[::-1]):
            results[name].append(measure(variants[name]))
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--min-mb", type=float, default=50.0)
    parser.add_argument("--images", type=int, default=4000)
    parser.add_argument("--write", action="store_true", help="append to RESULTS.md")
    args = parser.parse_args()
    lines: list[str] = []
    work = Path(tempfile.mkdtemp(prefix="amptrain-data-scale-"))
    cache = {"AMPTRAIN_CACHE": str(work / "cache")}
    big, tiny = work / "stdlib", work / "tiny"
    mb = stdlib_corpus(big, args.min_mb)
    tiny_corpus(tiny)
    lines.append(f"Corpus: the standard library's .py files x{len(list(big.iterdir()))} = "
                 f"{mb:.1f} MB; tiny corpus: os.py + argparse.py.")

    # prepare: MB/s per process count
    def prepare(workers: int) -> float:
        out = work / f"prep-{workers}-{time.time_ns()}"
        text = amptrain_cli("prepare", "--data", f"text:{big}", "--out", str(out),
                            "--workers", str(workers), "--no-progress")
        return float(text.split("MB/s")[0].rsplit("(", 1)[1])
    speeds = alternate({"1": 1, "2": 2}, args.reps, prepare)
    lines += ["", "| prepare processes | MB/s (median) | spread |", "|---|---:|---:|"]
    lines += [f"| {k} | {median(v):.1f} | {spread(v)} |" for k, v in speeds.items()]
    print("\n".join(lines), flush=True)
    shown = len(lines)

    # tokens: big vs tiny
    shards = {"big": work / "shards-big", "tiny": work / "shards-tiny"}
    amptrain_cli("prepare", "--data", f"text:{big}", "--out", str(shards["big"]), "--no-progress")
    amptrain_cli("prepare", "--data", f"text:{tiny}", "--out", str(shards["tiny"]),
                 "--no-progress")

    def train(data: str, **extra: Any) -> dict[str, Any]:
        options = {"model": GPT, "data": data, "seq_len": 64, "batch_size": 16, "max_steps": 20,
                   "eval_batches": 2, "precision": "32-true", "device": "cpu",
                   "no_progress": True, "out": str(work / f"run-{time.time_ns()}"), **extra}
        return run_child(options, cache)

    def token_row(label: str, runs: dict[str, list[dict[str, Any]]]) -> list[str]:
        rows = []
        for name, results in runs.items():
            rss = [r["rss_mb"] for r in results]
            first = [r["first_step_s"] for r in results]
            rows.append(f"| {label} {name} | {median(rss):.0f} | {spread(rss)} | "
                        f"{median(first):.2f} | {spread(first)} |")
        return rows
    lines += ["", "| run | peak RSS MB (median) | spread | first step s after launch | spread |",
              "|---|---:|---:|---:|---:|"]
    lines += token_row("tokens:", alternate({"tiny": f"tokens:{shards['tiny']}",
                                             "50 MB": f"tokens:{shards['big']}"}, args.reps, train))
    first_text = {name: train(f"text:{path}") for name, path in (("tiny", tiny), ("50 MB", big))}
    lines += [f"| text: first run (tokenizes, caches) {k} | {v['rss_mb']:.0f} | - | "
              f"{v['first_step_s']:.2f} | - |" for k, v in first_text.items()]
    lines += token_row("text: second run", alternate({"tiny": f"text:{tiny}",
                                                      "50 MB": f"text:{big}"}, args.reps, train))
    print("\n".join(lines[shown:]), flush=True)
    shown = len(lines)

    # images
    folders = {n: work / f"images-{n}" for n in (1000, args.images)}
    for n, folder in folders.items():
        images(folder, n)
    images_npz(folders[args.images], work / "images.npz")

    def train_images(spec_workers: tuple[str, Any]) -> dict[str, Any]:
        data, workers = spec_workers
        options = {"model": "cnn", "data": data, "batch_size": 64, "max_steps": 30,
                   "log_every": 10, "precision": "32-true", "device": "cpu",
                   "no_progress": True, "out": str(work / f"img-{time.time_ns()}"),
                   "num_workers": workers}
        return run_child(options, cache)
    big_folder = f"imagefolder:{folders[args.images]},size=32"
    variants = {"1000 images, 0 workers": (f"imagefolder:{folders[1000]},size=32", 0),
                f"{args.images} images, 0 workers": (big_folder, 0),
                f"{args.images} images, 1 worker": (big_folder, 1),
                f"{args.images} images, 2 workers": (big_folder, 2),
                f"{args.images} images in memory (npz)": (f"npz:{work / 'images.npz'}", 0)}
    runs = alternate(variants, args.reps, train_images)
    lines += ["", "| image run (cnn, batch 64, 30 steps) | peak RSS MB | first step s | "
              "samples/s | data_wait_frac |", "|---|---:|---:|---:|---:|"]
    for name, results in runs.items():
        lines.append(f"| {name} | {median([r['rss_mb'] for r in results]):.0f} | "
                     f"{median([r['first_step_s'] for r in results]):.2f} | "
                     f"{median([r['samples_per_s'] for r in results]):.0f} | "
                     f"{median([r['data_wait_frac'] for r in results]):.2f} |")
    report = "\n".join(lines)
    print("\n".join(lines[shown:]), flush=True)
    if args.write:
        import platform

        cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                    if ln.startswith("model name")), platform.processor())
        load = open("/proc/loadavg").read().split()[:3]
        with open(ROOT / "benchmarks" / "RESULTS.md", "a") as f:
            f.write(f"\n## Data at scale (issue 24)\n\n{cpu}, {os.cpu_count()} cores, load "
                    f"average {' '.join(load)} at the end (machine shared with other jobs: "
                    f"absolute times are inflated). Command: `python benchmarks/data_scale.py "
                    f"--reps {args.reps} --write`; medians of {args.reps} alternating runs, "
                    f"each a fresh process (peak RSS from wait4).\n\n{report}\n")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2:])
    else:
        main()
