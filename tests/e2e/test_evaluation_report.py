"""The demo pipeline's evaluation report and dataset inputs, end to end: real `dag.test()`, real
torchrun, real MLflow (sqlite). The run's artifacts hold evaluation/report.html and its PNGs, the
report shows the region slices, and the run's dataset inputs carry the snapshot digest.

The run is the session's run of the shipped fraud_detector spec (it slices by region; ``fraud_run``), inspected
on a copy of its stores."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.support import REPO
from trainpipe.demo.synthetic import TRANSACTION_REGIONS

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PIPELINE = "fraud_detector"
BINARY_PLOTS = {"roc.png", "precision_recall.png", "calibration.png", "confusion_matrix.png", "slices_region.png"}


class _Headings(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.headings: list[str] = []
        self.cells: list[str] = []
        self.images = 0
        self._open: str | None = None
        self._text = ""

    def handle_starttag(self, tag, attrs):
        if tag in ("h2", "h3", "td"):
            self._open, self._text = tag, ""
        elif tag == "img" and dict(attrs)["src"].startswith("data:image/png;base64,"):
            self.images += 1

    def handle_data(self, data):
        if self._open:
            self._text += data

    def handle_endtag(self, tag):
        if tag == self._open:
            (self.cells if tag == "td" else self.headings).append(self._text.strip())
            self._open = None


@pytest.fixture(scope="module")
def report_run(fraud_run, fraud_stores: Path):
    """The session's fraud_detector run, its MLflow run and evaluate XCom, read from this module's copy."""
    import mlflow

    assert fraud_run.dag_id == PIPELINE
    spec = (fraud_run.configs / f"{PIPELINE}.yaml").read_text()
    assert spec == (REPO / "dag_configs" / f"{PIPELINE}.yaml").read_text()  # the shipped spec, as shipped
    assert "slices: [region]" in spec and "worst_slice(auc)" in spec
    assert fraud_run.states["evaluate"] == "success", fraud_run.states
    client = mlflow.MlflowClient()
    [run] = client.search_runs([client.get_experiment_by_name(f"trainpipe/{PIPELINE}").experiment_id],
                               filter_string=f"tags.`trainpipe.airflow_run_id` = '{fraud_run.run_id}'")
    assert run.info.artifact_uri.startswith(f"file://{fraud_stores}/")  # the copy's artifacts, not the shared ones
    return client, run, fraud_run.states, fraud_run.evaluation


def test_the_run_holds_the_report_and_its_plots(report_run, fraud_run, fraud_stores, state_dir, tmp_path):
    client, run, states, evaluation = report_run

    assert states["register"] == "success"  # the demo's gates, the worst-slice one included, pass
    files = {Path(a.path).name for a in client.list_artifacts(run.info.run_id, "evaluation")}
    assert files == {"report.html", *BINARY_PLOTS}
    assert evaluation["report"] == {"run_id": run.info.run_id, "experiment_id": run.info.experiment_id,
                                    "artifact_path": "evaluation/report.html",
                                    "artifact_uri": f"runs:/{run.info.run_id}/evaluation/report.html"}
    import mlflow.artifacts

    local = mlflow.artifacts.download_artifacts(evaluation["report"]["artifact_uri"], dst_path=str(tmp_path))
    page = _Headings()
    page.feed(Path(local).read_text(encoding="utf-8"))
    assert page.headings[:5] == ["Summary", "Gates", "Metrics on the holdout", "Plots", "Slices"]
    assert "region" in page.headings
    assert page.images == len(BINARY_PLOTS)
    assert set(TRANSACTION_REGIONS) <= set(page.cells)
    assert "worst_slice(auc) >= 0.75" in page.cells
    text = Path(local).read_text(encoding="utf-8")
    # No path of this machine: the session's state, the stores the run wrote, this copy of them, the checkout.
    assert all(str(path) not in text for path in (state_dir, fraud_run.home, fraud_stores, REPO))


def test_the_evaluate_xcom_keeps_its_keys_and_adds_the_slices_and_the_baseline(report_run):
    _, run, _, evaluation = report_run

    assert set(evaluation) == {"candidate", "champion", "champion_version", "gates", "gates_passed", "slices", "report",
                               "baseline", "baseline_model", "below_baseline"}
    # The baseline (logistic regression on the same train split) is scored on every metric of the candidate.
    assert evaluation["baseline_model"] == "logistic regression"
    assert set(evaluation["baseline"]) == set(evaluation["candidate"])
    regions = {entry["value"]: entry for entry in evaluation["slices"]["region"]}
    assert set(regions) == set(TRANSACTION_REGIONS)
    assert set(regions["north"]["candidate"]) == set(evaluation["candidate"])
    worst = min(entry["candidate"]["auc"] for entry in regions.values())
    [gate] = [g for g in evaluation["gates"] if g["gate"] == "worst_slice(auc) >= 0.75"]
    assert gate["value"] == worst and gate["passed"]
    assert run.data.metrics["worst_slice_auc"] == pytest.approx(worst)


def test_the_dataset_inputs_carry_the_snapshot_digest(report_run):
    client, run, _, _ = report_run
    from trainpipe.state.datasets import MLFLOW_DIGEST_LENGTH

    digest = run.data.tags["trainpipe.dataset_digest"]
    inputs = {d.dataset.name: d for d in client.get_run(run.info.run_id).inputs.dataset_inputs}
    assert set(inputs) == {"fraud_detector-train", "fraud_detector-holdout"}
    contexts = {name: {t.key: t.value for t in d.tags}["mlflow.data.context"] for name, d in inputs.items()}
    assert contexts == {"fraud_detector-train": "training", "fraud_detector-holdout": "evaluation"}
    rows = {}
    for name, dataset_input in inputs.items():
        dataset = dataset_input.dataset
        assert dataset.digest == digest[:MLFLOW_DIGEST_LENGTH]
        profile = json.loads(dataset.profile)
        assert profile["snapshot_sha256"] == digest
        rows[name] = profile["num_rows"]
        split = name.removeprefix("fraud_detector-")
        assert json.loads(dataset.source) == {"uri": f"snapshots/fraud_detector/{digest[:16]}/{split}.parquet"}
        columns = {c["name"] for c in json.loads(dataset.schema)["mlflow_colspec"]}
        assert {"amount", "region", "is_fraud", "event_time"} <= columns
    assert rows["fraud_detector-train"] > rows["fraud_detector-holdout"] > 0
