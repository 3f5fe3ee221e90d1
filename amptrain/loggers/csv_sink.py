"""``DIR/metrics.csv``: one row per record, one column per field (``--logger csv``).

Columns are the fields seen so far; a record with a new field (the first evaluation's
``val_*``) rewrites the file once with the wider header, so every row stays readable by
``csv.DictReader`` or pandas. A resumed run drops the rows after its checkpoint's step.
"""
from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any, TextIO

from .base import Sink
from ..common.outdir import new_file

NAME = "metrics.csv"


class CSVSink(Sink):
    name = "csv"

    def __init__(self, out: Path, resumed_at: int | None = None) -> None:
        self.path = out / NAME
        self.columns: list[str] = []
        rows: list[dict[str, str]] = []
        if self.path.exists() or self.path.is_symlink():
            if resumed_at is None or not self.path.is_file() or self.path.is_symlink():
                # Not this run's own earlier file (train refuses such an --out up front).

                new_file(self.path).close()  # raises, naming the file
            with self.path.open(newline="") as f:
                reader = csv.DictReader(f)
                self.columns = list(reader.fieldnames or [])
                rows = [r for r in reader
                        if resumed_at is None or int(float(r.get("step") or 0)) <= resumed_at]
            self._rewrite(rows)
        self._file: TextIO = self.path.open("a", newline="", buffering=1)

    def _rewrite(self, rows: list[dict[str, str]]) -> None:
        partial = self.path.with_name(self.path.name + ".tmp")
        with partial.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.columns)
            writer.writeheader()
            writer.writerows(rows)
        os.replace(partial, self.path)

    def log(self, record: dict[str, Any]) -> None:
        row = {k: "" if v is None else v for k, v in record.items()}
        new = [k for k in row if k not in self.columns]
        if new:
            self._file.close()
            rows: list[dict[str, str]] = []
            if self.path.exists():
                with self.path.open(newline="") as f:
                    rows = list(csv.DictReader(f))
            self.columns += new
            self._rewrite(rows)
            self._file = self.path.open("a", newline="", buffering=1)
        csv.DictWriter(self._file, fieldnames=self.columns).writerow(row)

    def close(self) -> None:
        self._file.close()


def create(out: Path, *, resumed_at: int | None, params: dict[str, Any]) -> Sink:
    return CSVSink(out, resumed_at)
