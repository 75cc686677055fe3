"""evaluation.slices and worst_slice gates, from the spec to the plan (the located mistakes are
fixtures in tests/fixtures/bad_specs: slice_*.yaml, min_slice_gate.yaml, duplicate_slice.yaml)."""

from __future__ import annotations

import jsonschema
import pytest

from tests.support import REPO
from trainpipe.compile.compiler import compile_file
from trainpipe.settings import Settings
from trainpipe.spec.schema import spec_json_schema
from trainpipe.spec.sections.evaluation import EvaluationSpec


def test_the_fraud_example_slices_by_region_and_gates_the_worst_slice():
    plan = compile_file(REPO / "dag_configs" / "fraud_detector.yaml", "dag_configs/fraud_detector.yaml",
                        settings=Settings.from_env())

    assert plan.evaluation.slices == ("region",)
    [gate] = [g for g in plan.evaluation.gates if g.worst_slice]
    assert (gate.metric, gate.op, gate.threshold, gate.relative) == ("auc", ">=", 0.75, False)
    assert str(gate) == "worst_slice(auc) >= 0.75"
    # Validation requires the slice column, so a snapshot without it stops before training.
    assert plan.validation.required_columns[-1] == "region"
    assert len(set(plan.validation.required_columns)) == len(plan.validation.required_columns)


@pytest.mark.parametrize(("text", "metric", "relative", "threshold", "shown"), [
    ("worst_slice(auc) >= 0.75", "auc", False, 0.75, "worst_slice(auc) >= 0.75"),
    ("worst_slice( ndcg@10 )>=-1%", "ndcg@10", True, -0.01, "worst_slice(ndcg@10) >= -1% vs champion"),
    ("worst_slice(rmse) <= 2.5", "rmse", False, 2.5, "worst_slice(rmse) <= 2.5"),
])
def test_worst_slice_gates_read(text, metric, relative, threshold, shown):
    [gate] = EvaluationSpec(metrics=[metric], gates=[text], slices=["region"]).gates

    assert (gate.metric, gate.relative, gate.worst_slice) == (metric, relative, True)
    assert gate.threshold == pytest.approx(threshold)
    assert str(gate) == shown


def test_one_slice_column_may_be_written_without_a_list():
    assert EvaluationSpec(metrics=["auc"], slices="region").slices == ["region"]
    assert EvaluationSpec(metrics=["auc"]).slices == []


def test_the_json_schema_takes_worst_slice_gates_and_slices():
    schema = spec_json_schema()
    evaluation = {"metrics": ["auc"], "slices": ["region"], "gates": ["worst_slice(auc) >= 0.75", "auc >= +1%"]}
    spec = {"pipeline_id": "a", "data": {"uri": "x.parquet"},
            "training": {"task": "binary_classification", "features": ["x"], "label": "y"},
            "evaluation": evaluation, "registration": {"model_name": "m"}}

    jsonschema.validate(spec, schema)
    with pytest.raises(jsonschema.ValidationError, match="min_slice"):
        jsonschema.validate({**spec, "evaluation": {**evaluation, "gates": ["min_slice(auc) >= 0.75"]}}, schema)
