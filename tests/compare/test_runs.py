"""compare/runs.py: every precision x seed a normal training run, checked to start from the
seed's weights and to see the seed's data order."""
from __future__ import annotations

import logging

import pytest
import torch

from amptrain.compare import RunProbe, digest
from amptrain.compare.runs import _check_comparable
from amptrain.workflows.runner import data_and_model
from amptrain.trainer import Trainer, forward_batch
from tests.compare.conftest import PRECISIONS, SEEDS, small_config


def test_every_precision_starts_from_the_same_weights(study):
    """Same seed: identical fp32 weights, hence equal first-step losses re-evaluated in fp32."""
    seen, runs = study["seen"], study["result"]["runs"]
    losses = {}
    for (precision, seed), record in seen.items():
        _, model = data_and_model(small_config(study["out"], seed=seed))  # architecture only
        model.load_state_dict(record["initial"])
        model.train()
        with torch.no_grad():
            losses[precision, seed] = sum(
                forward_batch(model, b, torch.nn.functional.cross_entropy)[0].item() * n
                for b, n in zip(record["first_window"].micro_batches,
                                record["first_window"].micro_samples)) / 64
    for seed in SEEDS:
        reference = seen["32-true", seed]["initial"]
        for p in PRECISIONS[1:]:
            state = seen[p, seed]["initial"]
            assert all(torch.equal(reference[k], state[k]) for k in reference), (p, seed)
            assert losses[p, seed] == losses["32-true", seed]
        probe = [r["first_step_loss_fp32"] for r in runs if r["seed"] == seed]
        assert probe == pytest.approx([losses["32-true", seed]] * 3, rel=1e-5)
        assert len({r["initial_weights_sha256"] for r in runs if r["seed"] == seed}) == 1
    assert all(r["same_initial_weights"] for r in runs)
    assert losses["32-true", 0] != losses["32-true", 1]  # the check can tell seeds apart


def test_every_precision_sees_the_same_data_in_the_same_order(study):
    seen, runs = study["seen"], study["result"]["runs"]
    for seed in SEEDS:
        reference = seen["32-true", seed]["batches"]
        assert len(reference) == 6
        for p in PRECISIONS[1:]:
            batches = seen[p, seed]["batches"]
            assert len(batches) == len(reference)
            for mine, theirs in zip(batches, reference):
                assert all(torch.equal(a, b) for a, b in zip(mine, theirs))
        assert len({r["data_order_sha256"] for r in runs if r["seed"] == seed}) == 1
    first_labels = [seen["32-true", s]["batches"][0][-1] for s in SEEDS]
    assert not torch.equal(*first_labels)  # another seed, another order
    assert len({r["data_order_sha256"] for r in runs}) == 2


def test_probe_notices_a_model_that_does_not_start_from_the_seed_weights(tmp_path):
    config = small_config(tmp_path / "run", precision="bf16-mixed")
    data, model = data_and_model(config)
    reference = {k: v.clone() for k, v in model.state_dict().items()}
    reference["head.weight"] += 1e-3
    probe = RunProbe(reference)
    Trainer(config, callbacks=[probe]).fit(model, data.train)
    assert probe.facts["same_initial_weights"] is False
    assert probe.facts["first_step_loss_fp32"] > 0


def test_digest_sees_names_dtypes_and_exact_bytes_but_not_dict_order():
    weights = {"a": torch.arange(4.0), "b": torch.ones(2, 2)}
    same = digest(weights)
    assert digest({"b": torch.ones(2, 2), "a": torch.arange(4.0)}) == same
    assert len(same) == 64 and int(same, 16) >= 0  # a sha256 in hex
    assert digest({**weights, "a": torch.arange(4.0).double()}) != same        # dtype
    assert digest({**weights, "b": torch.ones(4)}) != same                     # shape
    assert digest({"c": weights["a"], "b": weights["b"]}) != same              # name
    nudged = torch.arange(4.0)
    nudged[3] = torch.nextafter(nudged[3], torch.tensor(10.0))
    assert digest({**weights, "a": nudged}) != same                            # one ulp
    # JSON-able values: the data order of a study.
    assert digest({"orders": [[0, 1, 2]]}) == digest({"orders": [[0, 1, 2]]})
    assert digest({"orders": [[0, 1, 2]]}) != digest({"orders": [[0, 2, 1]]})


def test_runs_that_did_not_start_alike_are_warned_about(caplog):
    alike = [{"seed": 0, "precision": p, "data_order_sha256": "x", "same_initial_weights": True}
             for p in ("32-true", "bf16-mixed")]
    with caplog.at_level(logging.WARNING, logger="amptrain"):
        _check_comparable(alike)
    assert caplog.records == []
    unlike = [dict(alike[0]), {**alike[1], "data_order_sha256": "y",
                               "same_initial_weights": False}]
    with caplog.at_level(logging.WARNING, logger="amptrain"):
        _check_comparable(unlike)
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["compare: seed 0: the precisions saw different data orders",
                        "compare: seed 0: bf16-mixed did not start from the seed's initial "
                        "weights (is the model factory seeded?)"]
