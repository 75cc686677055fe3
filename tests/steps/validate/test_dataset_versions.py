"""Dataset versions, the accepted baseline, and the schema and drift checks of `validate`, on real
storage (file://), real Great Expectations and real MLflow (sqlite), without Airflow's scheduler."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from trainpipe.commands.main import main
from trainpipe.demo.synthetic import drift_feature, generate_transactions
from trainpipe.errors import ValidationFailedError
from trainpipe.hooks.mlflow import MlflowHook
from trainpipe.plan.build import build_plan
from trainpipe.plan.model import PipelinePlan
from trainpipe.plan.tracking import RUN_ID_TAG
from trainpipe.settings import Settings
from trainpipe.spec.loader import load_yaml_text
from trainpipe.spec.validate import validate_loaded
from trainpipe.state.datasets import baseline_version, list_versions
from trainpipe.steps.snapshot import take_snapshot
from trainpipe.steps.validate import drift
from trainpipe.steps.validate.validate import validate_snapshot

END = datetime(2026, 6, 30, tzinfo=UTC)
FEATURES = ["amount", "merchant_risk", "is_foreign"]


def _plan(pipeline_id: str, validation: str) -> PipelinePlan:
    text = f"""
pipeline_id: {pipeline_id}
data: {{uri: demo/{pipeline_id}/data.parquet, time_column: event_time, window: 30d}}
validation:
{validation}
training: {{task: binary_classification, features: {FEATURES}, label: is_fraud}}
evaluation: {{metrics: [auc]}}
registration: {{model_name: {pipeline_id}}}
"""
    return build_plan(validate_loaded(load_yaml_text(text, f"{pipeline_id}.yaml")), spec_file=f"{pipeline_id}.yaml",
                      spec_text=text)


def _write(settings: Settings, plan: PipelinePlan, frame) -> None:
    path = Path(settings.storage_root.removeprefix("file://")) / plan.data.uri
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(path, index=False)


def _day(plan: PipelinePlan, settings: Settings, frame, day: int, **validate_kwargs):
    _write(settings, plan, frame)
    run_id = f"scheduled__day{day}"
    snapshot = take_snapshot(plan.dag_id, plan.data, settings=settings, logical_date=END + timedelta(days=day),
                             dag_id=plan.dag_id, run_id=run_id)
    return snapshot, lambda: validate_snapshot(plan.dag_id, plan.validation, snapshot, settings=settings,
                                               dag_id=plan.dag_id, run_id=run_id, **validate_kwargs)


@pytest.fixture
def settings() -> Settings:
    return Settings.from_env()


def test_a_snapshot_is_a_version_record_stored_once(settings):
    plan = _plan("versions_record", "  max_volume_change: 0.5")
    frame = generate_transactions(rows=3000, days=20, end=END)

    first, _ = _day(plan, settings, frame, 0)
    again = take_snapshot(plan.dag_id, plan.data, settings=settings, logical_date=END, dag_id=plan.dag_id,
                          run_id="manual__again")

    assert again == first  # same content: the first record, with the run that created it
    assert first.name == "versions_record" and first.version == first.digest and len(first.digest) == 64
    assert first.created_by_run_id == "scheduled__day0" and first.created_by_dag_id == "versions_record"
    folder = Path(first.uri.removeprefix("file://"))
    assert first.size_bytes == sum((folder / f).stat().st_size for f in ("train.parquet", "holdout.parquet"))
    assert first.schema == [[str(c), str(t)] for c, t in frame.dtypes.items()]
    expected_hash = hashlib.sha256(json.dumps(first.schema, separators=(",", ":")).encode()).hexdigest()
    assert first.schema_hash == expected_hash
    assert first.split["holdout_fraction"] == 0.2 and first.split["holdout_key"] is None
    assert first.rows == 3000 and first.train_rows + first.holdout_rows == 3000
    assert first.window_end == END.isoformat() and first.source_uri.endswith("demo/versions_record/data.parquet")
    assert json.loads((folder / "manifest.json").read_text()) == first.to_dict()
    assert sorted(p.name for p in folder.parent.iterdir()) == [first.digest[:16]]


def test_accepted_versions_and_the_datasets_command(settings, capsys):
    plan = _plan("versions_cli", "  max_volume_change: 0.5")
    frame = generate_transactions(rows=3000, days=20, end=END)
    first, validate_first = _day(plan, settings, frame, 0)
    validate_first()
    second, _ = _day(plan, settings, generate_transactions(rows=3000, days=20, end=END, seed=8), 1)

    assert baseline_version(settings, plan.dag_id)["digest"] == first.digest
    versions = list_versions(settings, plan.dag_id)
    assert [(v.digest, accepted is not None) for v, accepted in versions] == [(first.digest, True), (second.digest, False)]
    assert versions[0][1]["run_id"] == "scheduled__day0"

    assert main(["datasets", plan.dag_id]) == 0
    out = capsys.readouterr().out
    assert f"versions_cli version {first.digest[:16]}  (baseline, accepted)" in out
    assert f"versions_cli version {second.digest[:16]}  (not accepted)" in out
    for line in (f"schema_hash: {first.schema_hash}", "rows:        3000 (", f"size:        {first.size_bytes} bytes",
                 "split:       holdout 0.2 by hash of each row mod 10000", "by versions_cli run scheduled__day1"):
        assert line in out, line
    assert main(["datasets", plan.dag_id, "--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [(r["version"], r["baseline"]) for r in records] == [(first.digest, True), (second.digest, False)]
    assert main(["datasets", "no_such_pipeline"]) == 1


@pytest.mark.parametrize(
    ("change", "policy", "expected"),
    [
        ("drop_feature", "", "- merchant_risk: float64 (a column the pipeline uses; never allowed)"),
        ("retype_feature", "", "~ is_foreign: float64 -> str (a column the pipeline uses; never allowed)"),
        ("drop_unused", "", "- hour_of_day: float64 (validation.schema.removed_columns: fail)"),
        ("add_column", "    added_columns: fail", "+ channel: str (validation.schema.added_columns: fail)"),
    ],
)
def test_schema_change_fails_validate_with_the_diff(settings, change, policy, expected):
    pipeline_id = f"schema_{change}"
    plan = _plan(pipeline_id, "  schema:\n" + (policy or "    added_columns: allow"))
    frame = generate_transactions(rows=3000, days=20, end=END)
    _day(plan, settings, frame, 0)[1]()
    changed = {
        "drop_feature": lambda f: f.drop(columns=["merchant_risk"]),
        "retype_feature": lambda f: f.assign(is_foreign=f["is_foreign"].map({0.0: "no", 1.0: "yes"}).astype("str")),
        "drop_unused": lambda f: f.drop(columns=["hour_of_day"]),
        "add_column": lambda f: f.assign(channel="web").astype({"channel": "str"}),
    }[change](frame)
    _, validate_next = _day(plan, settings, changed, 1)

    with pytest.raises(ValidationFailedError, match="schema changed vs version") as caught:
        validate_next()

    assert expected in str(caught.value)
    assert baseline_version(settings, plan.dag_id)["schema"] == [[str(c), str(t)] for c, t in frame.dtypes.items()]


def test_allowed_schema_change_passes_and_becomes_the_baseline(settings):
    plan = _plan("schema_allowed", "  schema: {added_columns: allow, removed_columns: allow}")
    frame = generate_transactions(rows=3000, days=20, end=END)
    _day(plan, settings, frame, 0)[1]()
    changed = frame.drop(columns=["hour_of_day"]).assign(channel="web").astype({"channel": "str"})
    snapshot, validate_next = _day(plan, settings, changed, 1)

    result = validate_next()

    assert result["schema_diff"] == {"added": [["channel", "str"]], "removed": [["hour_of_day", "float64"]], "retyped": []}
    assert baseline_version(settings, plan.dag_id)["digest"] == snapshot.digest


DRIFT = "  drift:\n    psi: {warn: 0.1, fail: 0.25}\n    ks: {warn: 0.05, fail: 0.1}"


def test_drift_fails_validate_naming_the_feature_and_logs_to_mlflow(settings):
    plan = _plan("drift_mlflow", DRIFT)
    hook = MlflowHook(settings)
    frame = generate_transactions(rows=4000, days=20, end=END)
    first, validate_first = _day(plan, settings, frame, 0, hook=hook)
    assert validate_first()["drift"] is None  # no baseline yet
    normal, validate_normal = _day(plan, settings, generate_transactions(rows=4000, days=20, end=END, seed=8), 1,
                                   hook=hook)
    passed = validate_normal()
    assert passed["drift"]["verdict"] == "pass" and passed["drift"]["reference_digest"] == first.digest
    drifted, validate_drifted = _day(plan, settings, drift_feature(frame, "merchant_risk"), 2, hook=hook)

    with pytest.raises(ValidationFailedError, match=r"distribution drift vs version [0-9a-f]{16} in merchant_risk \(psi "):
        validate_drifted()

    assert baseline_version(settings, plan.dag_id)["digest"] == normal.digest  # the drifted version was not accepted
    client = hook.client
    [run] = client.search_runs([hook.experiment_id(plan.dag_id)], filter_string=f"tags.`{RUN_ID_TAG}` = 'scheduled__day2'")
    assert run.info.status == "FAILED"
    assert run.data.tags["trainpipe.drift_verdict"] == "fail"
    assert run.data.tags["trainpipe.drift_failed_features"] == "merchant_risk"
    assert run.data.tags["trainpipe.drift_reference"] == normal.digest
    assert run.data.metrics["drift_psi.merchant_risk"] > 0.25
    assert run.data.metrics["drift_ks.merchant_risk"] > 0.1
    assert run.data.metrics["drift_psi.amount"] < 0.01
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "drift")}
    assert artifacts == {"drift/drift_report.html", "drift/drift_report.json"}
    page = Path(client.download_artifacts(run.info.run_id, "drift/drift_report.html")).read_text()
    assert "merchant_risk" in page and "FAIL" in page


def test_pinned_reference_version(settings):
    frame = generate_transactions(rows=3000, days=20, end=END)
    plan = _plan("drift_pinned", DRIFT)
    pinned, validate_pinned = _day(plan, settings, frame, 0)
    validate_pinned()
    _day(plan, settings, drift_feature(frame, "amount"), 1)  # stored, never accepted

    pinned_plan = _plan("drift_pinned", DRIFT + f"\n    reference: {pinned.digest[:20]}")
    _, validate_again = _day(pinned_plan, settings, generate_transactions(rows=3000, days=20, end=END, seed=9), 2)
    assert validate_again()["drift"]["reference_digest"] == pinned.digest

    missing = _plan("drift_pinned", DRIFT + "\n    reference: '" + "0" * 16 + "'")
    _, validate_missing = _day(missing, settings, frame, 3)
    with pytest.raises(ValidationFailedError, match=r"drift reference version 0{16} \(validation.drift.reference\) "
                                                    r"is not stored for drift_pinned; `trainpipe datasets drift_pinned`"):
        validate_missing()


def _with_channel(frame, seed: int):
    """merchant_risk replaced by a categorical (string) feature, 10% missing."""
    import numpy as np

    rng = np.random.default_rng(seed)
    values = rng.choice(["web", "pos", "atm"], len(frame), p=[0.6, 0.3, 0.1]).astype(object)
    values[rng.random(len(frame)) < 0.1] = None
    return frame.assign(merchant_risk=values).astype({"merchant_risk": "str"})


def test_categorical_feature_with_missing_values_drifts(settings):
    frame = _with_channel(generate_transactions(rows=3000, days=20, end=END), seed=5)
    assert drift.is_numeric(frame["merchant_risk"]) is False and frame["merchant_risk"].isna().sum() > 200
    plan = _plan("drift_categorical", DRIFT)
    _day(plan, settings, frame, 0)[1]()
    other_day = _with_channel(generate_transactions(rows=3000, days=20, end=END, seed=8), seed=6)
    _, validate_other_day = _day(plan, settings, other_day, 1)
    result = validate_other_day()["drift"]
    [channel] = [f for f in result["features"] if f["feature"] == "merchant_risk"]
    assert channel["kind"] == "categorical" and channel["ks"] is None and channel["psi"] < 0.01
    assert [b[0] for b in channel["bins"]] == ["atm", "pos", "web", drift.OTHER_BIN, drift.MISSING_BIN]

    _, validate_drifted = _day(plan, settings, drift_feature(other_day, "merchant_risk"), 2)
    with pytest.raises(ValidationFailedError, match=r"in merchant_risk \(psi \d+\.\d+ >= fail 0.25\)$"):
        validate_drifted()
