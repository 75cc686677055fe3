"""OpenLineage facets of the step operators (issue 33), built from what a step kept: dataset naming as catalogs
expect it, the model version's `mlflow://<model>/<version>` URI, and a failed step reporting what it had read."""

from __future__ import annotations

import pytest

from trainpipe.operators.openlineage import dataset_name, lineage_of

pytest.importorskip("airflow.providers.openlineage", reason="the [lineage] extra")

SNAPSHOT = {"digest": "d" * 64, "uri": "s3://ml-data/trainpipe/versions/fraud/dddd", "rows": 1200, "size_bytes": 4096,
            "source_uri": "s3://raw/transactions.parquet", "schema": [["amount", "float64"], ["is_fraud", "int64"]]}


def test_storage_locations_are_named_as_openlineage_names_them():
    assert dataset_name("s3://raw/a/transactions.parquet") == ("s3://raw", "a/transactions.parquet")
    assert dataset_name("file:///data/t.parquet") == ("file", "/data/t.parquet")
    assert dataset_name("/data/t.parquet") == ("file", "/data/t.parquet")


def test_register_reads_the_snapshot_version_and_writes_the_model_version_uri():
    lineage = lineage_of("register", {"snapshot": SNAPSHOT, "registered": {"model_name": "fraud", "version": 3}})
    [read], [model] = lineage.inputs, lineage.outputs
    assert (read.namespace, read.name, read.facets["version"].datasetVersion) == ("s3://ml-data",
                                                                                    "trainpipe/versions/fraud/dddd",
                                                                                    "d" * 64)
    assert f"{model.namespace}/{model.name}" == "mlflow://fraud/3"


def test_snapshot_writes_its_rows_and_reads_the_source_schema():
    lineage = lineage_of("snapshot", {"snapshot": SNAPSHOT})
    [source], [written] = lineage.inputs, lineage.outputs
    assert (source.namespace, source.name) == ("s3://raw", "transactions.parquet")
    assert [(f.name, f.type) for f in source.facets["schema"].fields] == [("amount", "float64"), ("is_fraud", "int64")]
    assert (written.outputFacets["outputStatistics"].rowCount, written.outputFacets["outputStatistics"].size) == (1200,
                                                                                                               4096)


def test_a_failed_validation_reports_the_snapshot_it_read_and_results_when_there_are_some():
    failed = lineage_of("validate", {"snapshot": SNAPSHOT})
    [read] = failed.inputs
    assert read.name == "trainpipe/versions/fraud/dddd" and read.inputFacets == {}

    validation = {"expectations": [{"name": "expect_column_values_to_be_between", "success": True, "observed": 0}],
                  "drift": {"features": [{"feature": "amount", "verdict": "warn", "psi": 0.12, "ks": None}]}}
    [read] = lineage_of("validate", {"snapshot": SNAPSHOT, "validation": validation}).inputs
    assertions = read.inputFacets["dataQualityAssertions"].assertions
    assert [(a.assertion, a.column, a.success, a.severity) for a in assertions] == [
        ("expect_column_values_to_be_between", None, True, None), ("drift", "amount", True, "warn")]


def test_a_step_that_kept_nothing_reports_no_dataset():
    lineage = lineage_of("train", {})
    assert (lineage.inputs, lineage.outputs) == ([], [])
