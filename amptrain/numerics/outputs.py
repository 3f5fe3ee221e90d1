"""Where the telemetry goes: ``numerics.jsonl`` (one object per sampled step, module and
tensor), TensorBoard scalars under ``numerics/`` and, at the end, ``numerics.png``."""
from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..common.errors import AmptrainWarning

JSONL = "numerics.jsonl"
PICTURE = "numerics.png"


def _finite(value: Any) -> Any:
    # Strict JSON has no NaN/inf: a non-finite number is written as null.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


class NumericsLog:
    """``numerics.jsonl`` in ``out`` (appended to, so a resumed run continues it), kept in
    memory too for the picture (:meth:`picture`)."""

    def __init__(self, out: Path | None) -> None:
        self.path = out / JSONL if out is not None else None
        self.records: list[dict[str, Any]] = []

    def write(self, records: Iterable[dict[str, Any]]) -> None:
        records = [_finite(r) for r in records]
        self.records.extend(records)
        if self.path is not None and records:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with open(self.path, "a") as f:
                    f.writelines(json.dumps(r) + "\n" for r in records)
            except OSError as exc:
                # Telemetry is never the reason a run stops: one warning, no more writes.
                warnings.warn(f"numerics: {self.path} not written ({exc.strerror or exc}); "
                              f"the telemetry goes on in memory only", AmptrainWarning,
                              stacklevel=2)
                self.path = None

    def picture(self) -> Path | None:
        """``numerics.png``, or None without records or a run directory."""
        if self.path is None or not self.records:
            return None
        try:
            return heat_map(self.records, self.path.parent / PICTURE)
        except OSError as exc:
            warnings.warn(f"numerics: {PICTURE} not drawn ({exc.strerror or exc})",
                          AmptrainWarning, stacklevel=2)
            return None


def scalars(records: Iterable[dict[str, Any]]) -> dict[str, float]:
    """TensorBoard tags of one sampled step: ``numerics/<module>/<tensor>/<field>`` for
    amax, flushed and saturated in the run's format."""
    out: dict[str, float] = {}
    for r in records:
        for field in ("amax", "flushed", "saturated"):
            value = r[field]
            if value is not None:
                out[f"numerics/{r['module']}/{r['tensor']}/{field}"] = float(value)
    return out


def underflow_table(records: list[dict[str, Any]]) -> tuple[list[str], list[int], str,
                                                             list[list[float]],
                                                             list[list[float]]]:
    """(modules, steps, worst what-if format, own shares, worst shares): per module and
    sampled step the largest flushed share over its tensors, in the run's format and in
    the what-if format that flushes most on average."""
    modules = list(dict.fromkeys(r["module"] for r in records))
    steps = sorted({r["step"] for r in records})
    formats = list(records[0]["whatif"])
    worst = max(formats, key=lambda f: sum(r["whatif"][f]["flushed"] or 0 for r in records))
    own = [[0.0] * len(steps) for _ in modules]
    other = [[0.0] * len(steps) for _ in modules]
    row = {m: i for i, m in enumerate(modules)}
    col = {s: j for j, s in enumerate(steps)}
    for r in records:
        i, j = row[r["module"]], col[r["step"]]
        own[i][j] = max(own[i][j], r["flushed"] or 0.0)
        other[i][j] = max(other[i][j], r["whatif"][worst]["flushed"] or 0.0)
    return modules, steps, worst, own, other


def heat_map(records: list[dict[str, Any]], path: Path) -> Path:
    """Layers x sampled steps of the underflow share, in the run's format beside the
    worst what-if format."""
    import matplotlib  # deferred: only runs that end with records draw

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred: after the backend is chosen

    modules, steps, worst, own, other = underflow_table(records)
    fmt = records[0]["format"]
    # One colour scale for both panels, up to the largest share seen (small shares matter).
    top = max(1e-3, max(max(map(max, own)), max(map(max, other))))
    height = max(2.5, 0.28 * len(modules) + 1.5)
    fig, axes = plt.subplots(1, 2, figsize=(12, height), sharey=True, squeeze=False)
    for ax, table, title in zip(axes[0], (own, other), (f"run's format ({fmt})",
                                                         f"worst what-if ({worst})")):
        image = ax.imshow(table, aspect="auto", cmap="magma", vmin=0.0, vmax=top,
                          interpolation="nearest")
        ax.set_title(f"flushed to zero: {title}", fontsize=10)
        ax.set_xlabel("step")
        ticks = list(range(0, len(steps), max(1, len(steps) // 8)))
        ax.set_xticks(ticks, [str(steps[t]) for t in ticks])
    axes[0][0].set_yticks(range(len(modules)), modules, fontsize=7)
    fig.colorbar(image, ax=axes[0].tolist(), label="share of values flushed")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
