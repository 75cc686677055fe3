"""`validate` on a manifest dataset version (files listed, not copied): one streamed pass decides the exact
expectations, the type checks and the sample the distribution checks see; the same rows as a copy version
stop the run with the same words. Real parquet files, real Great Expectations, file:// storage."""

from __future__ import annotations

import hashlib
import json
import logging
import re
from pathlib import Path

import fsspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainpipe import storage
from trainpipe.errors import ValidationFailedError
from trainpipe.plan.build import build_plan
from trainpipe.plan.model import PipelinePlan
from trainpipe.settings import Settings
from trainpipe.spec.loader import load_yaml_text
from trainpipe.spec.validate import validate_loaded
from trainpipe.state.datasets import SnapshotInfo, baseline_version, version_folder
from trainpipe.steps.validate import quality
from trainpipe.steps.validate.validate import _Sample, validate_snapshot
from trainpipe_trainer.data.manifest import MANIFEST_FILE, DataManifest, ManifestFile, holdout_row_groups

FEATURES = ["amount", "merchant_risk", "channel"]
# Below the rows of every version here: the distribution checks of a manifest version see a sample.
BOUND = 1500
FILES, GROUPS, GROUP_ROWS = 4, 3, 500
DRIFT = "  drift:\n    psi: {warn: 0.1, fail: 0.25}\n    ks: {warn: 0.05, fail: 0.1}"


def _plan(pipeline_id: str, validation: str = DRIFT, training: str = "") -> PipelinePlan:
    text = f"""
pipeline_id: {pipeline_id}
data: {{uri: demo/{pipeline_id}/data.parquet}}
validation:
{validation}
training: {{task: binary_classification, features: {FEATURES}, label: is_fraud{training}}}
evaluation: {{metrics: [auc]}}
registration: {{model_name: {pipeline_id}}}
"""
    return build_plan(validate_loaded(load_yaml_text(text, f"{pipeline_id}.yaml")), spec_file=f"{pipeline_id}.yaml",
                      spec_text=text)


def _rows(seed: int, rows: int = FILES * GROUPS * GROUP_ROWS) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "amount": rng.gamma(2.0, 30.0, rows),
        "merchant_risk": rng.beta(2, 5, rows),
        "channel": rng.choice(["web", "pos", "atm"], rows, p=[0.6, 0.3, 0.1]).astype(object),
        "is_fraud": (rng.random(rows) < 0.1).astype("int64"),
    })


def _manifest_version(settings: Settings, pipeline_id: str, frame: pd.DataFrame, name: str, *,
                      retyped_file: int | None = None) -> SnapshotInfo:
    """The frame as FILES parquet files of GROUPS row groups each, listed by a manifest version (the file
    ``retyped_file`` with its label as float64: a type the manifest's schema, taken from the first, does not have)."""
    root = Path(settings.storage_root.removeprefix("file://")).resolve()
    source = root / "demo" / pipeline_id / name
    source.mkdir(parents=True)
    per_file = len(frame) // FILES
    local = fsspec.filesystem("file")
    written = []
    for index in range(FILES):
        path = source / f"part-{index}.parquet"
        part = frame.iloc[index * per_file:(index + 1) * per_file]
        if index == retyped_file:
            part = part.astype({"is_fraud": "float64"})
        pq.write_table(pa.Table.from_pandas(part, preserve_index=False), path, row_group_size=GROUP_ROWS)
        meta = pq.ParquetFile(path).metadata
        written.append((path, tuple(meta.row_group(g).num_rows for g in range(meta.num_row_groups))))
    held = holdout_row_groups([(p.name, len(groups)) for p, groups in written], 0.2)
    schema = pq.read_schema(written[0][0])
    files = tuple(
        ManifestFile(uri=path.as_uri(), path=path.name, size=local.info(str(path))["size"], rows=sum(groups),
                     row_groups=groups, holdout_row_groups=holdout, mtime=local.info(str(path))["mtime"],
                     schema_hash=hashlib.sha256(str(schema).encode()).hexdigest())
        for (path, groups), holdout in zip(written, held, strict=True))
    manifest = DataManifest(source_uri=source.as_uri(), files=files, holdout_fraction=0.2,
                            schema=tuple((field.name, str(field.type)) for field in schema))
    folder = version_folder(settings, pipeline_id, manifest.digest)
    manifest_path = folder / MANIFEST_FILE
    manifest_path.parent.mkdir(parents=True, exist_ok=True)
    manifest_path.write_bytes(manifest.dumps())
    uri = storage.fsspec_uri(manifest_path)
    info = SnapshotInfo(digest=manifest.digest, uri=storage.fsspec_uri(folder), train_uri=uri, holdout_uri=uri,
                        rows=manifest.rows(), train_rows=manifest.rows("train"),
                        holdout_rows=manifest.rows("holdout"), window_start=None, window_end=None,
                        source_uri=manifest.source_uri, name=pipeline_id, size_bytes=manifest.size_bytes,
                        schema=[[str(c), str(t)] for c, t in frame.dtypes.items()], kind="manifest", manifest_uri=uri)
    storage.write_json(folder / "manifest.json", info.to_dict())
    return info


def _copy_version(settings: Settings, pipeline_id: str, frame: pd.DataFrame) -> SnapshotInfo:
    """The same rows as a copy version: train.parquet and holdout.parquet in the version's folder."""
    digest = hashlib.sha256(pd.util.hash_pandas_object(frame).to_numpy().tobytes()).hexdigest()
    folder = version_folder(settings, pipeline_id, digest)
    cut = int(len(frame) * 0.8)
    storage.write_parquet_once(folder / "train.parquet", frame.iloc[:cut])
    storage.write_parquet_once(folder / "holdout.parquet", frame.iloc[cut:])
    info = SnapshotInfo(digest=digest, uri=storage.fsspec_uri(folder),
                        train_uri=storage.fsspec_uri(folder / "train.parquet"),
                        holdout_uri=storage.fsspec_uri(folder / "holdout.parquet"), rows=len(frame), train_rows=cut,
                        holdout_rows=len(frame) - cut, window_start=None, window_end=None, source_uri="", name=pipeline_id,
                        schema=[[str(c), str(t)] for c, t in frame.dtypes.items()])
    storage.write_json(folder / "manifest.json", info.to_dict())
    return info


def _version(kind: str, settings: Settings, pipeline_id: str, frame: pd.DataFrame, name: str) -> SnapshotInfo:
    if kind == "copy":
        return _copy_version(settings, pipeline_id, frame)
    return _manifest_version(settings, pipeline_id, frame, name)


def _validate(plan: PipelinePlan, snapshot: SnapshotInfo, settings: Settings, **kwargs):
    return validate_snapshot(plan.dag_id, plan.validation, snapshot, settings=settings, dag_id=plan.dag_id,
                             run_id="manual__1", sample_rows=BOUND, **kwargs)


def _failure(plan: PipelinePlan, snapshot: SnapshotInfo, settings: Settings) -> ValidationFailedError:
    with pytest.raises(ValidationFailedError, match="failed validation") as caught:
        _validate(plan, snapshot, settings)
    return caught.value


def _words(text: str) -> str:
    """A note without what differs between a whole version and its sample: digests and measured values."""
    return re.sub(r"(PSI|KS) \d+(\.\d+)?", r"\1 <n>", re.sub(r"[0-9a-f]{16}", "<version>", text))


@pytest.fixture
def settings() -> Settings:
    return Settings.from_env()


def test_hidden_drift_and_a_removed_column_stop_a_manifest_version_as_they_stop_a_copy(settings):
    accepted, today = _rows(1), _rows(2)
    drifted = today.assign(amount=today["amount"] * 8)
    removed = today.drop(columns=["merchant_risk"])
    notes = {}
    for kind in ("copy", "manifest"):
        plan = _plan(f"streamed_drift_{kind}")
        first = _version(kind, settings, plan.dag_id, accepted, "day0")
        assert _validate(plan, first, settings)["drift"] is None
        assert baseline_version(settings, plan.dag_id)["digest"] == first.digest
        normal = _version(kind, settings, plan.dag_id, today, "day1")
        passed = _validate(plan, normal, settings)
        # Another day of the same distribution: a warning at most (a sample of BOUND rows moves KS by ~0.05).
        assert passed["drift"]["verdict"] != "fail"

        drift_error = _failure(plan, _version(kind, settings, plan.dag_id, drifted, "day2"), settings)
        schema_error = _failure(plan, _version(kind, settings, plan.dag_id, removed, "day3"), settings)
        notes[kind] = (drift_error.note_parts, schema_error.note_parts)
        assert str(drift_error).startswith("snapshot ")
        assert re.search(r"distribution drift vs version [0-9a-f]{16} in amount \(psi \d+\.\d+ >= fail 0.25; "
                         r"ks \d+\.\d+ >= fail 0.1\)", str(drift_error))
        assert "- merchant_risk: float64 (a column the pipeline uses; never allowed)" in str(schema_error)
        assert baseline_version(settings, plan.dag_id)["digest"] == normal.digest  # neither was accepted
        if kind == "manifest":
            # On samples of BOUND rows each side, stated with the KS critical value at these sizes.
            assert passed["drift"]["reference_rows"] == passed["drift"]["current_rows"] == BOUND
            assert passed["drift"]["sample"]["current_total_rows"] == len(today)
            assert passed["drift"]["sample"]["ks_critical"] == pytest.approx(1.36 * (2 / BOUND) ** 0.5)
            assert f"KS 95% critical value at these sizes {1.36 * (2 / BOUND) ** 0.5:.4f}" in str(drift_error)
        else:
            assert "sample" not in passed["drift"]  # a copy version's report is as it always was

    assert [_words(n) for n in notes["manifest"][0]] == [_words(n) for n in notes["copy"][0]] == [
        "drift in amount (PSI <n> >= 0.25, KS <n> >= 0.1)"]
    assert [_words(n) for n in notes["manifest"][1]] == [_words(n) for n in notes["copy"][1]] == [
        "expect_column_to_exist(merchant_risk): column 'merchant_risk' is missing (3 columns present)",
        "schema changed vs version <version>: - merchant_risk: float64"]


EXACT = """  expectations:
    - expect_column_values_to_not_be_null: {column: amount}
    - expect_column_values_to_be_between: {column: merchant_risk, min_value: 0, max_value: 1}
    - expect_column_values_to_be_in_set: {column: channel, value_set: [web, pos, atm]}
    - expect_column_values_to_not_be_null: {column: channel, mostly: 0.99}
    - expect_column_max_to_be_between: {column: amount, max_value: 100000}
    - expect_table_row_count_to_be_between: {min_value: 1000}
    - expect_column_mean_to_be_between: {column: merchant_risk, min_value: 0.2, max_value: 0.4}"""


def test_one_offending_row_fails_its_expectation_exactly_with_the_words_of_a_copy(settings):
    frame = _rows(3)
    frame.loc[4321, "amount"] = None
    frame.loc[987, "merchant_risk"] = 1.5
    frame.loc[5555, "channel"] = "phone"
    summaries = {}
    for kind in ("copy", "manifest"):
        plan = _plan(f"streamed_exact_{kind}", EXACT)
        snapshot = _version(kind, settings, plan.dag_id, frame, "day0")
        error = _failure(plan, snapshot, settings)
        summaries[kind] = error.note_parts

    expected = ["expect_column_values_to_not_be_null(amount): 1 of 6000 values null (0.0167%)",
                "expect_column_values_to_be_between(merchant_risk): 1 of 6000 values unexpected (0.0167%)",
                "expect_column_values_to_be_in_set(channel): 1 of 6000 values unexpected (0.0167%)"]
    assert list(summaries["copy"]) == list(summaries["manifest"]) == expected


def test_streamed_outcomes_equal_great_expectations_on_the_whole_frame(settings):
    """Every exact expectation, passing and failing, with nulls and mostly: the same records as GE's."""
    frame = _rows(4)
    frame.loc[frame.index[::700], "merchant_risk"] = np.nan
    frame.loc[frame.index[5::900], "channel"] = None
    frame.loc[[10, 20, 4000], "amount"] = [-1.0, 0.0, 2e6]  # 0.0: unexpected only under strict_min
    expectations = [
        ("expect_column_values_to_not_be_null", {"column": "merchant_risk"}),
        ("expect_column_values_to_not_be_null", {"column": "channel", "mostly": 0.99}),
        ("expect_column_values_to_be_between", {"column": "amount", "min_value": 0, "strict_min": True}),
        ("expect_column_values_to_be_between", {"column": "merchant_risk", "max_value": 0.9, "mostly": 0.5}),
        ("expect_column_values_to_be_in_set", {"column": "channel", "value_set": ["web", "pos"]}),
        ("expect_column_values_to_not_be_in_set", {"column": "is_fraud", "value_set": [2, 3]}),
        ("expect_column_values_to_be_in_set", {"column": "is_fraud", "value_set": [0]}),
        ("expect_column_min_to_be_between", {"column": "amount", "min_value": 0}),
        ("expect_column_max_to_be_between", {"column": "merchant_risk", "min_value": 0.5, "max_value": 2}),
        ("expect_table_row_count_to_equal", {"value": len(frame)}),
        ("expect_table_row_count_to_be_between", {"max_value": 10}),
        ("expect_column_values_to_be_between", {"column": "no_such_column", "min_value": 0}),
    ]
    whole = quality.validate_dataframe(frame, expectations=expectations, required_columns=["amount", "gone"])
    suite = quality.StreamedSuite(expectations=expectations, required_columns=["amount", "gone"])
    for start in range(0, len(frame), 500):
        suite.update(frame.iloc[start:start + 500])
    streamed = suite.report(frame.sample(n=800, random_state=1))

    # Only the missing column (GE's own error text) went to the sample.
    assert suite.sampled == ["expect_column_values_to_be_between"]
    assert [(o.name, o.kwargs, o.success) for o in streamed.outcomes] == [
        (o.name, o.kwargs, o.success) for o in whole.outcomes]
    assert [o.observed for o in streamed.outcomes[:-1]] == [o.observed for o in whole.outcomes[:-1]]
    assert streamed.outcomes[-1].observed == "sample of 800 of 6000 rows: " + whole.outcomes[-1].observed
    assert streamed.summary().splitlines()[0] == whole.summary().splitlines()[0]
    assert [quality.note_text(o) for o in streamed.failures[:-1]] == [quality.note_text(o) for o in whole.failures[:-1]]


def test_the_sample_is_bounded_uniform_and_the_same_on_every_read():
    frame = pd.DataFrame({"x": np.arange(40_000)})
    units = [(frame.iloc[i:i + 1000], f"part#{i}") for i in range(0, len(frame), 1000)]
    samples = []
    for order in (units, units[::-1]):
        sample = _Sample(BOUND, "d" * 64)
        for unit, key in order:
            sample.offer(unit, key)
            assert sample._pending_rows < BOUND and (sample._frame is None or len(sample._frame) <= BOUND)
        samples.append(sample.frame(frame.head(0)))
    assert len(samples[0]) == BOUND
    pd.testing.assert_frame_equal(samples[0], samples[1])  # reading order does not change it
    # Uniform: each quarter of the rows holds about a quarter of the sample (binomial sd ~17 rows).
    quarters = np.bincount(samples[0]["x"] // 10_000, minlength=4)
    assert all(abs(q - BOUND / 4) < 100 for q in quarters), quarters
    other = _Sample(BOUND, "e" * 64)
    for unit, key in units:
        other.offer(unit, key)
    assert not other.frame(frame.head(0))["x"].equals(samples[0]["x"])  # another version, another draw


def test_the_frame_checked_never_exceeds_the_bound_and_a_rerun_gives_the_same_verdict(settings):
    plan = _plan("streamed_bound", DRIFT + "\n  expectations:\n"
                 "    - expect_column_median_to_be_between: {column: amount, min_value: 0, max_value: 1000}")
    first = _manifest_version(settings, plan.dag_id, _rows(5), "day0")
    _validate(plan, first, settings)
    second = _manifest_version(settings, plan.dag_id, _rows(6), "day1")

    # A backtest's call: the baseline stays the first version, so the rerun compares the same two versions.
    results = [_validate(plan, second, settings, move_baseline=False) for _ in range(2)]

    assert second.rows == 6000 > BOUND
    assert results[0]["sample_rows"] == BOUND and results[0]["sampled_expectations"] == [
        "expect_column_median_to_be_between"]
    [median] = [e for e in results[0]["expectations"] if e["name"] == "expect_column_median_to_be_between"]
    assert median["observed"].startswith(f"sample of {BOUND} of 6000 rows: observed ")
    assert results[0]["drift"]["current_rows"] == results[0]["drift"]["reference_rows"] == BOUND
    assert results[0]["drift"] == results[1]["drift"] and results[0]["expectations"] == results[1]["expectations"]
    profile = results[0]["profile"]
    assert profile["channel"] == {"nulls": 0, "min": None, "max": None, "values": ["atm", "pos", "web"],
                                  "more_than": None}
    assert profile["amount"]["values"] is None and profile["amount"]["more_than"] == 50
    assert profile["amount"]["max"] == pytest.approx(_rows(6)["amount"].max())


def test_a_file_changed_after_the_snapshot_fails_validation_naming_it(settings):
    plan = _plan("streamed_changed")
    snapshot = _manifest_version(settings, plan.dag_id, _rows(7), "day0")
    manifest = DataManifest.loads(Path(snapshot.manifest_uri.removeprefix("file://")).read_bytes())
    changed = manifest.files[2]
    pq.write_table(pa.Table.from_pandas(_rows(8, 100), preserve_index=False), changed.uri.removeprefix("file://"))

    with pytest.raises(ValidationFailedError, match=re.escape(changed.uri) + r": changed since dataset version "
                       + snapshot.digest[:16] + r" listed it \(size \d+ -> \d+ bytes.*restore the file") as caught:
        _validate(plan, snapshot, settings)

    assert caught.value.note_parts == (f"data changed since the snapshot: {changed.uri}",)
    assert baseline_version(settings, plan.dag_id) is None


def test_the_train_split_statistics_are_written_beside_the_manifest(settings):
    from trainpipe_trainer.data.reading import iter_units
    from trainpipe_trainer.data.statistics import StatisticsPass, statistics_uri

    plan = _plan("streamed_statistics", training=", transforms: {channel: {type: categorical}}")
    snapshot = _manifest_version(settings, plan.dag_id, _rows(9), "day0")

    result = _validate(plan, snapshot, settings, trainer=plan.trainer)

    manifest = DataManifest.loads(Path(snapshot.manifest_uri.removeprefix("file://")).read_bytes())
    config = plan.trainer.__class__(**{**{f: getattr(plan.trainer, f) for f in plan.trainer.__dataclass_fields__},
                                       "train_data_uri": snapshot.train_uri, "dataset_digest": snapshot.digest})
    assert result["statistics_uri"] == statistics_uri(snapshot.train_uri, config)
    written = json.loads(Path(result["statistics_uri"].removeprefix("file://")).read_text())
    # The same pass over the train split alone gives the same record: no holdout row is in it.
    alone = StatisticsPass(config, source=snapshot.train_uri)
    for _, table in iter_units(fsspec.filesystem("file"), manifest, "train"):
        alone.update(table.to_pandas())
    assert written == json.loads(json.dumps(alone.result(), sort_keys=True))
    assert written["rows"] == snapshot.train_rows < snapshot.rows
    # Without the trainer's config (a direct call) nothing is written.
    assert _validate(plan, snapshot, settings)["statistics_uri"] is None


def test_a_file_whose_column_type_differs_from_the_manifest_fails_naming_it(settings):
    plan = _plan("streamed_retyped", "  max_volume_change: 0.5")
    snapshot = _manifest_version(settings, plan.dag_id, _rows(10), "day0", retyped_file=2)
    manifest = DataManifest.loads(Path(snapshot.manifest_uri.removeprefix("file://")).read_bytes())
    retyped = manifest.files[2].uri

    error = _failure(plan, snapshot, settings)

    # One line per row group of the file, each naming it, the column and both types.
    for group in range(GROUPS):
        assert (f"{retyped}: row group {group}: column is_fraud is double, not int64 (dataset version "
                f"{snapshot.digest[:16]} records its schema") in str(error)
    assert error.note_parts == tuple(f"{retyped}: row group {group}: column is_fraud is double, not int64"
                                     for group in range(GROUPS))


def test_a_copy_baseline_is_cut_to_the_bound_when_the_new_version_is_a_manifest(settings):
    """A pipeline that moves from copies to manifests: the copy it accepted last is the drift reference."""
    plan = _plan("streamed_after_copy")
    _validate(plan, _copy_version(settings, plan.dag_id, _rows(11)), settings)
    after = _validate(plan, _manifest_version(settings, plan.dag_id, _rows(12), "day1"), settings)["drift"]
    assert (after["reference_rows"], after["current_rows"]) == (BOUND, BOUND)
    assert (after["sample"]["reference_total_rows"], after["sample"]["current_total_rows"]) == (6000, 6000)
    assert baseline_version(settings, plan.dag_id)["kind"] == "manifest"

    drifted = _rows(13).assign(merchant_risk=lambda f: f["merchant_risk"] * 8)
    with pytest.raises(ValidationFailedError, match=r"in merchant_risk \(psi .*compared on seeded uniform samples: "
                       rf"reference {BOUND} of 6000 rows, current {BOUND} of 6000 rows; PSI over 10 bins"):
        _validate(plan, _manifest_version(settings, plan.dag_id, drifted, "day2"), settings)


def test_a_snapshot_step_manifest_is_validated_and_its_statistics_are_what_the_trainer_reads(settings):
    """The snapshot step's own manifest version (data.snapshot: manifest), end to end to the trainer's lookup."""
    import dataclasses
    from datetime import UTC, datetime

    from trainpipe.steps.snapshot import take_snapshot
    from trainpipe_trainer.data.statistics import read_statistics

    text = f"""
pipeline_id: streamed_lake
data: {{uri: demo/streamed_lake/lake, snapshot: manifest}}
validation:
  expectations:
    - expect_column_values_to_be_in_set: {{column: is_fraud, value_set: [0, 1]}}
{DRIFT}
training: {{task: binary_classification, features: {FEATURES}, label: is_fraud,
           transforms: {{channel: {{type: categorical}}}}}}
evaluation: {{metrics: [auc]}}
registration: {{model_name: streamed_lake}}
"""
    plan = build_plan(validate_loaded(load_yaml_text(text, "streamed_lake.yaml")), spec_file="streamed_lake.yaml",
                      spec_text=text)
    lake = Path(settings.storage_root.removeprefix("file://")) / "demo" / "streamed_lake" / "lake"
    lake.mkdir(parents=True)
    frame = _rows(14)
    for index in range(3):
        pq.write_table(pa.Table.from_pandas(frame.iloc[index * 2000:(index + 1) * 2000], preserve_index=False),
                       lake / f"part-{index}.parquet", row_group_size=400)
    snapshot = take_snapshot(plan.dag_id, plan.data, settings=settings, logical_date=datetime(2026, 6, 30, tzinfo=UTC),
                             dag_id=plan.dag_id, run_id="manual__lake")
    assert snapshot.kind == "manifest"

    result = _validate(plan, snapshot, settings, trainer=plan.trainer)

    assert result["success"] and result["sample_rows"] == BOUND
    assert result["expectations"][-1]["observed"] == "0 of 6000 values unexpected (0%)"
    run_config = dataclasses.replace(plan.trainer, train_data_uri=snapshot.train_uri, dataset_digest=snapshot.digest)
    stored = read_statistics(run_config.train_data_uri, run_config, run_config.storage_options)
    assert stored is not None and stored["rows"] == snapshot.train_rows
    assert result["statistics_uri"].startswith(snapshot.uri)


def test_a_baseline_whose_file_changed_is_compared_on_its_other_files_and_the_log_names_it(settings, caplog):
    plan = _plan("streamed_reference_changed")
    baseline = _manifest_version(settings, plan.dag_id, _rows(7), "day0")
    _validate(plan, baseline, settings)
    manifest = DataManifest.loads(Path(baseline.manifest_uri.removeprefix("file://")).read_bytes())
    changed = manifest.files[1]
    Path(changed.uri.removeprefix("file://")).unlink()
    current = _manifest_version(settings, plan.dag_id, _rows(9), "day1")

    # Not a failure of the new version: the baseline moves only when a validation passes, so failing here would
    # fail every later run.
    with caplog.at_level(logging.WARNING, logger="trainpipe.steps.validate.validate"):
        result = _validate(plan, current, settings)
    assert result["success"] and baseline_version(settings, plan.dag_id)["digest"] == current.digest
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and changed.uri in r.getMessage()]
    assert len(warned) == 1 and "gone from the store" in warned[0] and "its other files are compared" in warned[0]
    assert result["drift"]["reference_digest"] == baseline.digest
