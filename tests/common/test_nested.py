"""The one walker over nested tensors (amptrain/nested.py): containers keep their types,
non-tensor leaves pass through, paths name where a tensor sits."""
from __future__ import annotations

from collections import OrderedDict, defaultdict, namedtuple
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from amptrain.common import nested

Pair = namedtuple("Pair", "inputs targets")


def sample() -> dict:
    return {"x": [torch.arange(4.0), (torch.ones(4, 2), "text")],
            "state": OrderedDict(w=torch.zeros(4)), "shape": torch.Size([4, 2]), "n": 3,
            "pair": Pair(torch.arange(4), torch.arange(4) * 2)}


def test_map_tensors_keeps_every_container_type_and_leaf():
    mapped = nested.map_tensors(lambda t: t + 1, sample())
    assert type(mapped) is dict and type(mapped["state"]) is OrderedDict
    assert type(mapped["x"]) is list and type(mapped["x"][1]) is tuple
    assert type(mapped["pair"]) is Pair and type(mapped["shape"]) is torch.Size
    assert mapped["shape"] == torch.Size([4, 2]) and mapped["n"] == 3
    assert mapped["x"][1][1] == "text"
    assert torch.equal(mapped["x"][0], torch.arange(4.0) + 1)
    assert torch.equal(mapped["pair"].targets, torch.arange(4) * 2 + 1)
    assert torch.equal(mapped["state"]["w"], torch.ones(4))


def test_leaf_hook_sees_the_non_tensor_leaves():
    seen = []
    nested.map_tensors(lambda t: t, sample(), leaf=lambda v: seen.append(v) or v)
    assert "text" in seen and 3 in seen


def test_defaultdict_keeps_its_factory():
    value = defaultdict(list, a=torch.ones(1))
    mapped = nested.map_tensors(lambda t: t * 2, value)
    assert isinstance(mapped, defaultdict) and mapped["missing"] == []


def test_paths_name_where_each_tensor_sits():
    paths = []
    nested.map_tensors_with_path(lambda p, t: paths.append(p) or t, sample())
    assert paths == [("x", 0), ("x", 1, 0), ("state", "w"), ("pair", 0), ("pair", 1)]


def test_tensors_in_order_and_in_attributes_only_when_asked():
    @dataclass
    class Output:
        logits: torch.Tensor
        extra: list

    value = {"out": Output(torch.ones(1), [torch.zeros(2)]), "module": nn.Linear(1, 1)}
    assert nested.tensors(value) == []
    found = nested.tensors(value, attributes=True)
    assert [t.shape for t in found] == [torch.Size([1]), torch.Size([2])]  # no module weights
    assert len(nested.tensors(sample())) == 5


def test_concat_and_slice_rows_are_inverse():
    batch = {"x": [torch.arange(4.0), (torch.ones(4, 2),)], "state": OrderedDict(w=torch.zeros(4)),
             "pair": Pair(torch.arange(4), torch.arange(4) * 2)}
    parts = [nested.slice_rows(batch, i, i + 2) for i in (0, 2)]
    assert parts[0]["x"][0].tolist() == [0.0, 1.0] and parts[1]["pair"].inputs.tolist() == [2, 3]
    assert nested.slice_rows(sample(), 0, 1)["n"] == 3  # other leaves are kept
    joined = nested.concat(parts)
    assert torch.equal(joined["x"][0], torch.arange(4.0)) and joined["x"][1][0].shape == (4, 2)
    assert type(joined["state"]) is OrderedDict and type(joined["pair"]) is Pair
    assert torch.equal(joined["pair"].targets, torch.arange(4) * 2)
    with pytest.raises(TypeError, match="holding a str"):
        nested.concat([{"a": "x"}, {"a": "y"}])

