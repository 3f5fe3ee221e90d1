"""The plan's search order and growth: a planted ranking and a planted verdict, where the
expected plan is known (the end-to-end runs are in tests/commands/test_plan.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from amptrain.compare.precision_plan import Search, search_along
from amptrain.diagnose.sensitivity import LayerSensitivity, by_cost


def _layer(name: str, flops: int, flushed: float) -> LayerSensitivity:
    return LayerSensitivity(name=name, flops=flops, flushed=flushed, saturated=0.0,
                            snr_db=float("inf"), loss_delta=0.0)


def test_the_ranking_puts_big_insensitive_layers_first():
    layers = [_layer("small", 1024, 0.1), _layer("big", 4096, 0.2),
              _layer("big_sensitive", 4096, 0.9), _layer("tie", 1024, 0.1)]
    # per FLOP: big 4.9e-5 < small = tie 9.8e-5 (model order) < big_sensitive 2.2e-4
    assert [s.name for s in by_cost(layers)] == ["big", "small", "tie", "big_sensitive"]
    assert _layer("empty", 0, 0.0).score_per_flop == float("inf")


class PlantedSearch(Search):
    """A search whose verdict is planted: refused with ``bad`` in the set, or with both
    ``x`` and ``y``; every attempt is recorded."""

    def __init__(self) -> None:   # no runs: only attempt() is used by search_along
        self.tried: list[list[str]] = []

    def attempt(self, layers: list[str]) -> bool | None:
        self.tried.append(list(layers))
        return "bad" not in layers and not {"x", "y"} <= set(layers)


def test_the_search_grows_greedily_past_a_refused_layer():
    ranking = [_layer(n, 1, 0.0) for n in ("x", "bad", "y", "z")]
    search = PlantedSearch()
    assert search_along(ranking, search) == ["x", "z"]
    assert search.tried == [["x", "bad", "y", "z"], ["x"], ["x", "bad"], ["x", "y"],
                            ["x", "z"]]


def test_the_search_stops_where_the_budget_does(tmp_path: Path):
    class Broke(PlantedSearch):
        def attempt(self, layers: list[str]) -> Any:
            self.tried.append(list(layers))
            return False if len(self.tried) == 1 else (True if len(self.tried) < 3 else None)

    search = Broke()
    assert search_along([_layer(n, 1, 0.0) for n in "abc"], search) == ["a"]
    assert len(search.tried) == 3


def test_plan_warns_once_about_a_low_bit_setting_its_candidates_do_not_read():
    """A candidate is a precision plan: it reads --mx-scale for MX layers, never
    --lowbit-bf16-last or --nvfp4-without (its runs take their defaults, so they are quiet)."""
    import warnings

    from amptrain.common.errors import AmptrainWarning, forget_warnings
    from amptrain.compare.precision_plan import warn_unread_lowbit
    from amptrain.config import RunConfig
    config = RunConfig.from_options(model="mlp", data="digits", precision="nvfp4",
                                    mx_scale="rceil", nvfp4_without="rht")
    said = {}
    for fmt in ("nvfp4", "mxfp4"):
        forget_warnings()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", AmptrainWarning)
            warn_unread_lowbit(config, fmt)
        said[fmt] = sorted(str(w.message).split(" does nothing")[0] for w in caught)
    assert said == {"nvfp4": ["mx_scale rceil", "nvfp4_without rht"],
                    "mxfp4": ["nvfp4_without rht"]}
