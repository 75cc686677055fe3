"""OpenLineage (issue 33): with the OpenLineage provider installed, a real `airflow dags test` of a small spec emits,
through the provider's file transport, the graph source data -> snapshot -> model version: snapshot reads the source
(with its schema) and writes the snapshot (digest, rows), validate reads it with the data-quality and drift results,
register writes `mlflow://<model>/<version>`, promote reads it.

The first run of the pipeline is the session's (``small_run``): its version 1 and its dataset version, the validation
baseline, are in this test's copy of its stores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from tests.e2e.scenarios import SMALL, SMALL_END, SMALL_VALIDATION, small_data, small_spec

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PIPELINE = SMALL
# A day after the first run: a run for the past would be a backtest (tests/e2e/test_backtest.py).
END = SMALL_END + timedelta(days=1)
VALIDATION = SMALL_VALIDATION + "  drift: {}\n"


def _completed(events: list[dict], task: str) -> dict:
    found = [e for e in events if e["eventType"] == "COMPLETE" and e["job"]["name"] == f"{PIPELINE}.{task}"]
    assert len(found) == 1, [(e["eventType"], e["job"]["name"]) for e in events]
    return found[0]


def _run(day: datetime, env: dict[str, str], events_file: Path) -> list[dict]:
    """One `airflow dags test`; the OpenLineage events it emitted."""
    events_file.unlink(missing_ok=True)
    done = subprocess.run([str(Path(sys.executable).with_name("airflow")), "dags", "test", PIPELINE,
                           day.date().isoformat()], capture_output=True, text=True, env=env, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads(line) for line in events_file.read_text().splitlines() if line.strip()]


def test_a_run_emits_source_to_snapshot_to_model_version(small_run, small_stores: Path, tmp_path: Path):
    pytest.importorskip("airflow.providers.openlineage", reason="the [lineage] extra")
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / f"{PIPELINE}.yaml").write_text(small_spec(validation=VALIDATION))
    events_file = tmp_path / "openlineage.jsonl"
    env = {**os.environ, "TRAINPIPE_DAG_CONFIGS": str(configs),
           "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": str(events_file),
                                                          "append": True}),
           "AIRFLOW__OPENLINEAGE__NAMESPACE": "trainpipe-test"}
    # The first run's version is the validation baseline: the second run (new rows, so it trains) has drift results.
    # (The first run's spec has no `drift:`: a first run has no baseline to compare with either way.)
    assert small_run.logical_date < END and small_run.states["promote"] == "success", small_run.states
    source = small_data(small_stores, end=END, seed=11)
    events = _run(END, env, events_file)

    snapshot = _completed(events, "snapshot")
    [read] = snapshot["inputs"]
    assert (read["namespace"], read["name"]) == ("file", str(source))
    assert {"event_time", "amount", "merchant_risk", "is_fraud"} <= {f["name"] for f in read["facets"]["schema"]["fields"]}
    [written] = snapshot["outputs"]
    digest = written["facets"]["version"]["datasetVersion"]
    assert len(digest) == 64
    rows = written["outputFacets"]["outputStatistics"]["rowCount"]
    assert rows > 0

    [checked] = _completed(events, "validate")["inputs"]
    assert (checked["namespace"], checked["name"]) == (written["namespace"], written["name"])
    assertions = checked["inputFacets"]["dataQualityAssertions"]["assertions"]
    assert any(a["assertion"] == "expect_column_values_to_be_between" and a["success"] for a in assertions), assertions
    assert any(a["assertion"] == "drift" and a["column"] == "amount" for a in assertions), assertions

    register = _completed(events, "register")
    [trained_on] = register["inputs"]
    assert trained_on["name"] == written["name"] and trained_on["facets"]["version"]["datasetVersion"] == digest
    [model] = register["outputs"]
    assert f"{model['namespace']}/{model['name']}" == f"mlflow://{PIPELINE}/2"
    [promoted] = _completed(events, "promote")["inputs"]
    assert (promoted["namespace"], promoted["name"]) == (model["namespace"], model["name"])
