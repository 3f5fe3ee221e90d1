"""How long ``amptrain`` takes to answer ``--help``, ``--version`` and a mistyped flag
(issue 26, part 3): wall time of ``python -m amptrain ARGS`` in a fresh process.

Each ``--tree`` is a checkout whose ``amptrain`` package is put first on PYTHONPATH (the
default: this one); with two, e.g. ``--tree /tmp/before --tree .``, the trees alternate
in a random order every round, so both see the same machine load. Also prints the five
slowest imports of each command line (``python -X importtime``, cumulative).

    python benchmarks/startup.py [--tree DIR ...] [--rounds 7]
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = {"--help": ["--help"], "--version": ["--version"],
         "train --epoch 3": ["train", "--epoch", "3"], "train --help": ["train", "--help"],
         "compare --help": ["compare", "--help"],
         "compare --precision x": ["compare", "--precision", "x"]}


def run(tree: Path, args: list[str], importtime: bool = False) -> tuple[float, str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    flags = ["-X", "importtime"] if importtime else []
    started = time.perf_counter()
    # In the tree: `python -m` puts the working directory first on sys.path.
    done = subprocess.run([sys.executable, *flags, "-m", "amptrain", *args], env=env, cwd=tree,
                          capture_output=True, text=True, timeout=300)
    return time.perf_counter() - started, done.stderr


def slowest_imports(stderr: str, n: int = 5) -> str:
    rows = []
    for line in stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            _, cumulative, name = line.split("|")
            if cumulative.strip().isdigit():
                rows.append((int(cumulative), name.strip()))
    top = sorted(rows, reverse=True)[:n]
    return ", ".join(f"{name} {us / 1e6:.2f} s" for us, name in top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", type=Path,
                        help="checkout to time (repeatable; default: this one)")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    trees = [t.resolve() for t in (args.tree or [ROOT])]
    rng = random.Random(0)
    times: dict[tuple[Path, str], list[float]] = {(t, c): [] for t in trees for c in CASES}
    bare: list[float] = []  # the interpreter alone, the floor under every case
    for tree in trees:  # warm the file cache, not timed
        run(tree, ["--version"])
    for _ in range(args.rounds):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        bare.append(time.perf_counter() - started)
        for case, argv in CASES.items():
            order = list(trees)
            rng.shuffle(order)
            for tree in order:
                times[(tree, case)].append(run(tree, argv)[0])
    print(f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}, "
          f"{args.rounds} rounds, median (min-max) wall seconds")
    print(f"python -c pass: {statistics.median(bare):.2f} s ({min(bare):.2f}-{max(bare):.2f})")
    for tree in trees:
        for case in CASES:
            values = times[(tree, case)]
            print(f"{tree}: amptrain {case}: {statistics.median(values):.2f} s "
                  f"({min(values):.2f}-{max(values):.2f})")
        print(f"  importtime of --help: {slowest_imports(run(tree, ['--help'], True)[1])}")


if __name__ == "__main__":
    main()
