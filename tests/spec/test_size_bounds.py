"""Sizes and waits a spec can ask for are bounded: the local launcher (the default) trains on a shared Airflow worker,
where no pod limit applies, so a model of 10^12 weights, a batch of 2 billion rows or a million kept
checkpoints took the worker's memory or the bucket from every other task. Tuning ranges and run parameters
are held to the same bounds. And preemption relaunches, which an elastic Job hands to torchrun's
--max_restarts (it restarts a crashing trainer that often)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from tests.support import REPO
from trainpipe.errors import SpecError
from trainpipe.spec.loader import load_yaml_text
from trainpipe.spec.validate import validate_loaded

FRAUD = yaml.safe_load((REPO / "dag_configs" / "fraud_detector.yaml").read_text())
TUNED = yaml.safe_load((REPO / "dag_configs" / "fraud_detector_tuned.yaml").read_text())
GPU = yaml.safe_load((REPO / "dag_configs" / "search_ranker_gpu.yaml").read_text())


def _training(spec: dict[str, Any]) -> dict[str, Any]:
    return spec["training"]


CASES: list[tuple[str, dict[str, Any], Callable[[dict[str, Any]], None], str, str]] = [
    ("layer width", FRAUD, lambda s: _training(s)["model"].update(hidden_layers=[1_000_000, 1_000_000]),
     "training.model.hidden_layers[0]", "less than or equal to 65536"),
    ("layer count", FRAUD, lambda s: _training(s)["model"].update(hidden_layers=[8] * 65),
     "training.model.hidden_layers", "at most 64 items"),
    ("batch size", FRAUD, lambda s: _training(s).update(batch_size=2_000_000_000),
     "training.batch_size", "less than or equal to 4194304"),
    ("kept checkpoints", FRAUD, lambda s: _training(s)["checkpoint"].update(keep_last=1_000_000),
     "training.checkpoint.keep_last", "less than or equal to 1000"),
    ("preemption relaunches", FRAUD, lambda s: _training(s).update(preemption={"max_restarts": 1_000_000}),
     "training.preemption.max_restarts", "less than or equal to 100"),
    ("hash buckets", FRAUD, lambda s: _training(s).update(
        transforms={"merchant_category": {"type": "categorical", "encode": "hashing", "hash_buckets": 2_000_000_000}}),
     "training.transforms.merchant_category.hash_buckets", "less than or equal to 16777216"),
    # Waits of a pod: a stopped pod keeps its GPUs through its grace period, a pending one holds the slot.
    ("grace period", GPU, lambda s: _training(s)["kubernetes"].update(termination_grace_period="365d"),
     "training.kubernetes.termination_grace_period", "at most 1h: longer, a stopped pod would keep its GPUs that long"),
    ("schedule timeout", GPU, lambda s: _training(s)["kubernetes"].update(schedule_timeout="30d"),
     "training.kubernetes.schedule_timeout", "at most 7d"),
    ("startup timeout", GPU, lambda s: _training(s)["kubernetes"].update(startup_timeout="2d"),
     "training.kubernetes.startup_timeout", "at most 1d"),
    ("finished jobs kept", GPU, lambda s: _training(s)["kubernetes"].update(ttl_after_finished="3650d"),
     "training.kubernetes.ttl_after_finished", "at most 30d"),
    ("tuned layers", TUNED, lambda s: s["tuning"]["space"].update(hidden_layers={"choice": [[64], [1_000_000, 8]]}),
     "tuning.space.hidden_layers.choice", "a list of 1 to 64 layer sizes from 1 to 65,536"),
    ("tuned batch size", TUNED, lambda s: s["tuning"]["space"].update(batch_size={"int": [64, 10_000_000_000]}),
     "tuning.space.batch_size.int", "must be <= 4194304"),
]


@pytest.mark.parametrize(("name", "base", "change", "field", "message"), CASES, ids=[c[0] for c in CASES])
def test_a_size_beyond_its_bound_is_refused_at_its_field(
        name: str, base: dict[str, Any], change: Callable[[dict[str, Any]], None], field: str, message: str) -> None:
    spec = copy.deepcopy(base)
    change(spec)
    with pytest.raises(SpecError) as caught:
        validate_loaded(load_yaml_text(yaml.safe_dump(spec, sort_keys=False), "specs/x.yaml"))
    located = [(p.field_path, p.message) for p in caught.value.problems]
    assert any(path == field and message in text for path, text in located), located


def test_sizes_within_the_bounds_pass() -> None:
    spec = copy.deepcopy(FRAUD)
    spec["training"]["model"]["hidden_layers"] = [65_536, 8]
    spec["training"].update(batch_size=4_194_304, preemption={"max_restarts": 100})
    spec["training"]["checkpoint"]["keep_last"] = 1000
    parsed = validate_loaded(load_yaml_text(yaml.safe_dump(spec, sort_keys=False), "specs/x.yaml"))
    assert parsed.training.model.hidden_layers == [65_536, 8] and parsed.training.batch_size == 4_194_304
