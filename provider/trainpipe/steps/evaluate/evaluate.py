"""The ``evaluate`` and ``gate`` steps (``register`` and ``promote``: ``trainpipe.steps.register.model_registry``).

The new model and the current champion are scored on the same holdout of this run's snapshot, so
relative gates compare like with like. A multiclass champion whose classes differ from the candidate's is
not compared at all: a failing check in the gates (``classes_outcome``) stops the run at the gate task.
"""

from __future__ import annotations

import logging
import posixpath
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from trainpipe import storage
from trainpipe.errors import TrainpipeError
from trainpipe.hooks.mlflow import MlflowHook, mlflow_metric_key
from trainpipe.plan.model import EvaluationPlan, Gate, RegistrationPlan
from trainpipe.plan.tracking import GATES_PASSED_TAG
from trainpipe.settings import Settings
from trainpipe.state.datasets import MANIFEST_KIND, read_split
from trainpipe.steps.evaluate import metrics
from trainpipe.steps.evaluate.gate_table import CLASSES_REFERENCE
from trainpipe_trainer.config import (
    PREDICTED_LABEL_COLUMN,
    PROBABILITY_COLUMN_PREFIX,
    TOKEN_SCORE_COLUMNS,
    TOKEN_SCORE_PARAMS,
)

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from trainpipe.state.datasets import SnapshotInfo
    from trainpipe.steps.evaluate.report import ReportInputs

log = logging.getLogger(__name__)

MULTICLASS = "multiclass_classification"
CAUSAL_LM = "causal_lm"

# The evaluation report and its plots sit under this folder of the MLflow run's artifacts.
REPORT_ARTIFACT_DIR = "evaluation"
# A slice column with more distinct values than this in the holdout is refused: its slices would be
# too small to judge and the report unreadable (bucket such a column first).
MAX_SLICE_VALUES = 50
# A manifest version's train rows the baseline is fitted on, at most (its first row groups in manifest order).
BASELINE_MAX_ROWS = 200_000
# Per-class F1 goes to MLflow (holdout_f1.<class>) for at most this many classes: a chart of more series is not
# read, and one log_batch takes at most 1000 metrics. The report's per-class table has every class either way.
MAX_LOGGED_CLASSES = 100
# MLflow's longest metric key.
_MAX_METRIC_KEY_LENGTH = 250
# How many class names a message lists before "and N more".
_SHOWN_CLASSES = 10


class SliceColumnError(TrainpipeError, ValueError):
    """An ``evaluation.slices`` column is missing from the holdout or has too many distinct values."""


class ModelOutputError(TrainpipeError, ValueError):
    """A model's predictions are not what its task's evaluation reads: for multiclass a DataFrame with one
    ``probability_<class>`` column per class, one row per holdout row."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Predictions:
    """A model's output on the holdout: one score per row, or for multiclass the [N, K] probabilities of
    ``classes`` (in the order of the model's columns)."""

    scores: np.ndarray
    classes: tuple[str, ...] = ()


def predict(hook: MlflowHook, model_uri: str, holdout: pd.DataFrame, evaluation: EvaluationPlan) -> Predictions:
    import pandas as pd

    model = hook.load_pyfunc(model_uri)
    if evaluation.task == CAUSAL_LM:
        # The raw text: the feature (the prompt, or the text to learn) and the completion when there is one.
        columns = [*evaluation.features, *([evaluation.label] if evaluation.label else [])]
        output = model.predict(holdout[columns], params=dict(TOKEN_SCORE_PARAMS))
        return Predictions(scores=token_scores(output, model_uri=model_uri, rows=len(holdout)))
    frame = holdout[list(evaluation.features)]
    # A model logged from float samples declares its numeric inputs double, and MLflow refuses int64 there
    # ("can not safely convert"): integer columns of the table are widened to what the signature asks.
    schema = model.metadata.get_input_schema()
    doubles = {spec.name for spec in (schema.inputs if schema is not None else [])
               if getattr(spec, "name", None) and getattr(getattr(spec, "type", None), "name", None) == "double"}
    widen = {name: "float64" for name in frame.columns if name in doubles
             and (pd.api.types.is_integer_dtype(frame[name]) or pd.api.types.is_bool_dtype(frame[name]))}
    output = model.predict(frame.astype(widen) if widen else frame)
    if evaluation.task == MULTICLASS:
        return class_probabilities(output, model_uri=model_uri, rows=len(holdout))
    return Predictions(scores=pd.Series(output).to_numpy(dtype=float).ravel())


def token_scores(output: Any, *, model_uri: str, rows: int) -> np.ndarray:
    """A causal LM's answer to ``TOKEN_SCORE_PARAMS`` as the [N, 3] array the metrics read: per holdout row the
    summed token cross-entropy, the number of target tokens, the number of them predicted right
    (``TOKEN_SCORE_COLUMNS``, the trainer's contract)."""
    import numpy as np
    import pandas as pd

    columns = [c for c in output.columns if isinstance(c, str)] if isinstance(output, pd.DataFrame) else []
    if not set(TOKEN_SCORE_COLUMNS) <= set(columns):
        returned = (f"a DataFrame with columns {', '.join(map(repr, columns[:_SHOWN_CLASSES]))}"
                    if isinstance(output, pd.DataFrame) else f"a {type(output).__name__}")
        raise ModelOutputError(
            f"{model_uri}: a causal language model answers params {TOKEN_SCORE_PARAMS} with a DataFrame of columns "
            f"{', '.join(TOKEN_SCORE_COLUMNS)} per row; it returned {returned} (is it a model of another task?)")
    if len(output) != rows:
        raise ModelOutputError(f"{model_uri}: returned {len(output)} rows for {rows} holdout rows")
    try:
        scores = np.column_stack([output[column].to_numpy(dtype=np.float64) for column in TOKEN_SCORE_COLUMNS])
    except (TypeError, ValueError) as error:
        raise ModelOutputError(f"{model_uri}: token scores that are not numbers ({error})") from None
    if not np.all(np.isfinite(scores)) or np.any(scores < 0) or np.any(scores[:, 2] > scores[:, 1]):
        raise ModelOutputError(f"{model_uri}: token scores must be finite, >= 0, with correct <= tokens per row")
    return scores


def class_probabilities(output: Any, *, model_uri: str, rows: int) -> Predictions:
    """The ``probability_<class>`` columns of a multiclass model's output, in its column order (the class
    order). Its ``label`` column (the predicted class) is not read: the metrics take the most probable class,
    which is what it holds, and the baseline, which has no such column, is judged the same way."""
    import numpy as np
    import pandas as pd

    columns = [c for c in output.columns if isinstance(c, str)] if isinstance(output, pd.DataFrame) else []
    probability_columns = [c for c in columns if c.startswith(PROBABILITY_COLUMN_PREFIX)]
    if len(probability_columns) < 2:
        returned = (f"a DataFrame with columns {', '.join(map(repr, columns[:_SHOWN_CLASSES]))}"
                    if isinstance(output, pd.DataFrame) else f"a {type(output).__name__}")
        raise ModelOutputError(
            f"{model_uri}: a multiclass model returns a DataFrame with a {PREDICTED_LABEL_COLUMN!r} column and one "
            f"'{PROBABILITY_COLUMN_PREFIX}<class>' column per class; it returned {returned} (is it a model of "
            "another task?)")
    if len(output) != rows:
        raise ModelOutputError(f"{model_uri}: returned {len(output)} rows for {rows} holdout rows")
    return Predictions(scores=output[probability_columns].to_numpy(dtype=np.float64),
                       classes=tuple(c.removeprefix(PROBABILITY_COLUMN_PREFIX) for c in probability_columns))


def class_difference(candidate: tuple[str, ...], champion: tuple[str, ...]) -> str | None:
    """None when the two models have the same classes (in any order), else the message that says how they
    differ: ``the candidate's classes differ from the champion's: new 'x'; missing 'y'``."""
    new = [name for name in candidate if name not in set(champion)]
    missing = [name for name in champion if name not in set(candidate)]
    if not new and not missing:
        return None
    parts = [f"{word} {_class_list(names)}" for word, names in (("new", new), ("missing", missing)) if names]
    return "the candidate's classes differ from the champion's: " + "; ".join(parts)


def _class_list(names: list[str]) -> str:
    shown = ", ".join(repr(name) for name in names[:_SHOWN_CLASSES])
    return shown + (f" and {len(names) - _SHOWN_CLASSES} more" if len(names) > _SHOWN_CLASSES else "")


def in_class_order(predictions: Predictions, classes: tuple[str, ...]) -> np.ndarray:
    """``predictions``' probabilities with their columns in the order of ``classes`` (the same set)."""
    position = {name: index for index, name in enumerate(predictions.classes)}
    return predictions.scores[:, [position[name] for name in classes]]


def holdout_labels(evaluation: EvaluationPlan, holdout: pd.DataFrame) -> np.ndarray:
    """The label column as the metrics read it: for multiclass each value's class name."""
    if evaluation.task == CAUSAL_LM:
        import numpy as np

        # The targets are tokens, scored by the model itself (token_scores): no label value per row.
        return np.zeros(len(holdout))
    column = holdout[evaluation.label]
    if evaluation.task != MULTICLASS:
        return column.to_numpy()
    from trainpipe_trainer.errors import TrainerDataError
    from trainpipe_trainer.preprocessing import label_texts

    try:
        return label_texts(column, label=evaluation.label, source="holdout")
    except TrainerDataError as error:
        raise metrics.MetricInputError(str(error)) from None


def holdout_metrics(evaluation: EvaluationPlan, holdout: pd.DataFrame, scores: np.ndarray,
                    classes: tuple[str, ...] = ()) -> dict[str, float]:
    """``scores``: one per row, or for multiclass the [N, K] probabilities of ``classes``."""
    return metrics.compute_metrics(
        evaluation.task,
        list(evaluation.metrics),
        y_true=holdout_labels(evaluation, holdout),
        y_score=scores,
        groups=holdout[evaluation.group_column].to_numpy() if evaluation.group_column else None,
        threshold=evaluation.decision_threshold,
        classes=classes,
    )


def holdout_slices(evaluation: EvaluationPlan, holdout: pd.DataFrame, candidate: np.ndarray,
                   champion: np.ndarray | None, classes: tuple[str, ...] = ()) -> dict[str, list[dict[str, Any]]]:
    """Column -> ``[{"value", "rows", "candidate": {metric: value}, "champion": {...} | None, "undefined": {...}}]``;
    a metric a slice cannot give is None, its reason in ``undefined`` (see ``metrics.slice_metrics``). For
    multiclass both models' scores are the probabilities of ``classes``, in that order."""
    slices: dict[str, list[dict[str, Any]]] = {}
    labels = holdout_labels(evaluation, holdout) if evaluation.slices else None
    for column in evaluation.slices:
        if column not in holdout.columns:
            raise SliceColumnError(f"evaluation.slices: column {column!r} is not in the holdout; its columns are "
                                   f"{', '.join(map(str, holdout.columns))}")
        distinct = holdout[column].nunique(dropna=False)
        if distinct > MAX_SLICE_VALUES:
            raise SliceColumnError(f"evaluation.slices: column {column!r} has {distinct} distinct values in the holdout, "
                                   f"more than {MAX_SLICE_VALUES}; slice by a coarser column (bucket this one first)")
        common = dict(y_true=labels, slice_values=holdout[column].to_numpy(),
                      groups=holdout[evaluation.group_column].to_numpy() if evaluation.group_column else None,
                      threshold=evaluation.decision_threshold, classes=classes)
        per_model = {name: metrics.slice_metrics(evaluation.task, list(evaluation.metrics), y_score=scores, **common)
                     for name, scores in (("candidate", candidate), ("champion", champion)) if scores is not None}
        slices[column] = [
            {"value": entry["value"], "rows": entry["rows"], "candidate": entry["metrics"],
             "champion": per_model["champion"][index]["metrics"] if "champion" in per_model else None,
             "undefined": entry["undefined"]}
            for index, entry in enumerate(per_model["candidate"])
        ]
    return slices


def evaluate(evaluation: EvaluationPlan, registration: RegistrationPlan, *, holdout_uri: str, model_uri: str,
             mlflow_run_id: str, hook: MlflowHook, settings: Settings, snapshot: SnapshotInfo | None = None,
             pipeline_id: str | None = None, train_uri: str | None = None) -> dict[str, Any]:
    """Score the candidate, the champion and the baseline model on the holdout (whole and per slice),
    check the gates, and record it all on the MLflow run: metrics, the verdict tag, the evaluation
    report and, given the ``snapshot``, its splits as dataset inputs.

    The baseline (``trainpipe.steps.evaluate.baseline``) is fitted on the train split: ``train_uri``, else the
    snapshot's; without either there is none, and a gate on it fails saying so.

    Multiclass: the classes are the candidate's (its probability columns); a champion with other classes is
    not compared, and a failing check among the gates says which classes are new and which are missing."""
    # The snapshot's splits live under the storage root: read them with its connection, as every read of it is.
    conn_id = settings.storage_conn_id
    manifest_version = snapshot is not None and snapshot.kind == MANIFEST_KIND and holdout_uri == snapshot.holdout_uri
    # A manifest version's holdout is its held-out row groups, read whole (the metrics need every row).
    holdout = (read_split(snapshot, "holdout", settings=settings) if manifest_version and snapshot is not None
               else storage.read_parquet_uri(holdout_uri, conn_id=conn_id))
    candidate_output = predict(hook, model_uri, holdout, evaluation)
    candidate_scores, classes = candidate_output.scores, candidate_output.classes
    candidate = holdout_metrics(evaluation, holdout, candidate_scores, classes)
    log.info("candidate on holdout: %s", _fmt(candidate))
    baseline_scores = baseline = None
    train_uri = train_uri or (snapshot.train_uri if snapshot is not None else None)
    # A causal LM has no linear baseline (the spec stage refuses a baseline gate for it): the champion is its
    # reference, and the report says there is none.
    if train_uri and evaluation.task != CAUSAL_LM:
        from trainpipe.steps.evaluate.baseline import baseline_scores as fit_baseline

        if snapshot is not None and snapshot.kind == MANIFEST_KIND and train_uri == snapshot.train_uri:
            # A manifest version may be larger than memory: the linear baseline is fitted on its first
            # BASELINE_MAX_ROWS train rows (file order), which is plenty for a reference model.
            train = read_split(snapshot, "train", settings=settings, max_rows=BASELINE_MAX_ROWS)
        else:
            train = storage.read_parquet_uri(train_uri, conn_id=conn_id)
        baseline_scores = fit_baseline(evaluation.task, evaluation.features, evaluation.label, train, holdout, classes,
                                       text_features=evaluation.text_features)
        baseline = holdout_metrics(evaluation, holdout, baseline_scores, classes)
        log.info("baseline (%s, fitted on the train split) on the same holdout: %s",
                 _baseline_model(evaluation), _fmt(baseline))
    below = below_baseline(candidate, baseline)
    if below:
        # INFO, not WARNING: a run is not at fault for it; the run's note says it (and a gate may refuse it).
        log.info("the candidate does worse than the baseline on %s", ", ".join(below))
    champion_version = hook.version_by_alias(registration.model_name, registration.alias)
    champion = champion_scores = classes_differ = None
    if champion_version is not None:
        champion_uri = f"models:/{registration.model_name}@{registration.alias}"
        champion_scores, classes_differ = _champion_scores(hook, champion_uri, holdout, evaluation, classes)
        if champion_scores is not None:
            champion = holdout_metrics(evaluation, holdout, champion_scores, classes)
            log.info("champion (version %s) on the same holdout: %s", champion_version.version, _fmt(champion))
        else:
            log.warning("champion (version %s) not compared: %s", champion_version.version, classes_differ)
    else:
        log.info("no %s of %s yet: relative gates will pass", registration.alias, registration.model_name)
    slices = holdout_slices(evaluation, holdout, candidate_scores, champion_scores, classes)
    for column, entries in slices.items():
        log.info("slices of %s: %s", column, "; ".join(
            f"{entry['value']} ({entry['rows']} rows) {_fmt_optional(entry['candidate'])}" for entry in entries))
    perplexities = None
    if evaluation.task == CAUSAL_LM and champion_scores is not None:
        perplexities = (token_perplexity(candidate_scores), token_perplexity(champion_scores))
    outcomes = check_gates(evaluation.gates, {"candidate": candidate, "champion": champion, "slices": slices,
                                              "baseline": baseline, "classes_differ": classes_differ,
                                              "perplexities": perplexities})
    passed = all(o.passed for o in outcomes)
    from mlflow.entities import RunTag

    # The verdict goes on the MLflow run here, in the same call as the metrics: the gate task then
    # needs no MLflow client (importing MLflow and opening its store cost seconds per task process).
    hook.client.log_batch(
        mlflow_run_id,
        metrics=_metric_entities({f"holdout_{mlflow_metric_key(k)}": v for k, v in candidate.items()}
                                 | {f"champion_holdout_{mlflow_metric_key(k)}": v for k, v in (champion or {}).items()}
                                 | {f"baseline_holdout_{mlflow_metric_key(k)}": v for k, v in (baseline or {}).items()}
                                 | _worst_slice_metrics(evaluation, slices)
                                 | _per_class_f1_metrics(evaluation, holdout, candidate_scores, classes)),
        tags=[RunTag(GATES_PASSED_TAG, str(passed).lower())],
    )
    result = {
        "candidate": candidate,
        "champion": champion,
        "champion_version": champion_version.version if champion_version else None,
        "gates": outcomes_as_dicts(outcomes),
        "gates_passed": passed,
        "slices": slices,
        "baseline": baseline,
        "baseline_model": _baseline_model(evaluation) if baseline is not None else None,
        # The metrics on which the candidate does worse than the baseline (the run's note says so).
        "below_baseline": below,
    }
    report_inputs = _report_inputs(evaluation, registration, holdout, result, candidate_scores, champion_scores,
                                   mlflow_run_id=mlflow_run_id, snapshot=snapshot, pipeline_id=pipeline_id,
                                   baseline_scores=baseline_scores, classes=classes, classes_differ=classes_differ)
    result["report"] = log_report(hook, mlflow_run_id, report_inputs)
    if snapshot is not None and pipeline_id is not None:
        from trainpipe.state.datasets import log_snapshot_inputs

        log_snapshot_inputs(hook, mlflow_run_id, pipeline_id, snapshot, holdout, settings=settings)
    return result


def _champion_scores(hook: MlflowHook, champion_uri: str, holdout: pd.DataFrame, evaluation: EvaluationPlan,
                     classes: tuple[str, ...]) -> tuple[np.ndarray | None, str | None]:
    """The champion's scores on the holdout (for multiclass its probabilities in the candidate's class order),
    or None and why it cannot be compared: other classes, or (multiclass) no class probabilities at all."""
    if evaluation.task == CAUSAL_LM:
        try:
            return predict(hook, champion_uri, holdout, evaluation).scores, None
        except ModelOutputError as error:
            # A champion of another task: not compared, and the run stops at its gate saying why.
            return None, f"the champion gives no token scores to compare: {error}"
    if evaluation.task != MULTICLASS:
        return predict(hook, champion_uri, holdout, evaluation).scores, None
    try:
        output = predict(hook, champion_uri, holdout, evaluation)
    except ModelOutputError as error:
        # A champion of the task before (a binary classifier, say): the run must not crash at every try on it.
        return None, f"the champion has no class probabilities to compare: {error}"
    difference = class_difference(classes, output.classes)
    if difference is not None:
        return None, difference
    return in_class_order(output, classes), None


def _per_class_f1_metrics(evaluation: EvaluationPlan, holdout: pd.DataFrame, scores: np.ndarray,
                          classes: tuple[str, ...]) -> dict[str, float]:
    """``holdout_f1.<class>`` of the candidate, for MLflow's charts across runs. Only a class whose name is a
    valid key as it is: ``mlflow_metric_key`` would rewrite the others, and two classes could then share a key
    (``a@b`` and ``a_at_b``). Those, an F1 that is 0/0 and every class past ``MAX_LOGGED_CLASSES`` are in the
    report's per-class table only."""
    if evaluation.task != MULTICLASS or len(classes) > MAX_LOGGED_CLASSES:
        return {}
    values = {}
    for row in metrics.per_class_metrics(holdout_labels(evaluation, holdout), scores, classes):
        key = f"holdout_f1.{row['class']}"
        valid = (mlflow_metric_key(row["class"]) == row["class"] and len(key) <= _MAX_METRIC_KEY_LENGTH
                 # MLflow also refuses a key that a path would normalise into another ("a/../b", "x/").
                 and posixpath.normpath(key) == key)
        if valid and row["f1"] is not None:
            values[key] = row["f1"]
    return values


def _baseline_model(evaluation: EvaluationPlan) -> str:
    from trainpipe.steps.evaluate.baseline import baseline_model

    return baseline_model(evaluation.task, evaluation.text_features)


def below_baseline(candidate: dict[str, float], baseline: dict[str, float] | None) -> list[str]:
    """The metrics on which the candidate is worse than the baseline (in each metric's good direction)."""
    worse = []
    for name, value in candidate.items():
        reference = (baseline or {}).get(name)
        if reference is None:
            continue
        if (value < reference) if metrics.higher_is_better(name) else (value > reference):
            worse.append(name)
    return worse


def _worst_slice_metrics(evaluation: EvaluationPlan, slices: dict[str, list[dict[str, Any]]]) -> dict[str, float]:
    """``worst_slice_<metric>`` of the candidate, for MLflow's charts across runs."""
    values = {}
    for name in evaluation.metrics if slices else ():
        worst = metrics.worst_slice(name, slices, model="candidate")
        if worst is not None:
            values[f"worst_slice_{mlflow_metric_key(name)}"] = worst[1]["candidate"][name]
    return values


def _report_inputs(evaluation: EvaluationPlan, registration: RegistrationPlan, holdout: pd.DataFrame,
                   result: dict[str, Any], candidate_scores: np.ndarray, champion_scores: np.ndarray | None, *,
                   mlflow_run_id: str, snapshot: SnapshotInfo | None, pipeline_id: str | None,
                   baseline_scores: np.ndarray | None = None, classes: tuple[str, ...] = (),
                   classes_differ: str | None = None) -> ReportInputs:
    from trainpipe.steps.evaluate.report import ModelScores, ReportInputs

    version = result["champion_version"]
    champion_label = f"{registration.alias} (version {version})"
    champion_fact = f"version {version} (alias {registration.alias})" if version else "none yet"
    if classes_differ is not None:
        champion_fact += f"; not compared: {classes_differ}"
    facts = [("registered model", registration.model_name),
             ("champion", champion_fact),
             ("MLflow run", mlflow_run_id),
             ("holdout rows", f"{len(holdout):,}"),
             ("task", evaluation.task)]
    if evaluation.task == "binary_classification":
        facts.append(("decision threshold", f"{evaluation.decision_threshold:g}"))
    if classes:
        facts.append(("classes", f"{len(classes)}: {_class_list(list(classes))}"))
    if snapshot is not None:
        facts.append(("snapshot sha256", snapshot.digest))
        if snapshot.window_start or snapshot.window_end:
            facts.append(("data window", f"{snapshot.window_start} .. {snapshot.window_end}"))
    if evaluation.slices:
        facts.append(("sliced by", ", ".join(evaluation.slices)))
    if evaluation.task == CAUSAL_LM:
        facts.append(("baseline", "none: a causal language model is compared with its champion (perplexity on the "
                                  "same holdout)"))
    if result["baseline"] is not None:
        facts.append(("baseline", f"{result['baseline_model']}, fitted on the train split"))
        if result["below_baseline"]:
            facts.append(("below the baseline on", ", ".join(result["below_baseline"])))
    return ReportInputs(
        title=f"Evaluation of {pipeline_id or registration.model_name}: candidate vs {registration.alias}",
        task=evaluation.task,
        metric_names=evaluation.metrics,
        # Multiclass: the class names (text); every other task: numbers.
        y_true=holdout_labels(evaluation, holdout) if classes or evaluation.task == CAUSAL_LM
        else holdout[evaluation.label].to_numpy(dtype=float),
        candidate=ModelScores(label="candidate", scores=candidate_scores, metrics=result["candidate"]),
        champion=ModelScores(label=champion_label, scores=champion_scores, metrics=result["champion"])
        if champion_scores is not None else None,
        baseline=ModelScores(label=f"baseline ({result['baseline_model']})", scores=baseline_scores,
                             metrics=result["baseline"]) if baseline_scores is not None else None,
        decision_threshold=evaluation.decision_threshold,
        groups=holdout[evaluation.group_column].to_numpy() if evaluation.group_column else None,
        classes=classes,
        without_champion=f"{champion_label}: not compared" if classes_differ is not None else "champion (none yet)",
        slices=result["slices"],
        gates=tuple(result["gates"]),
        facts=tuple(facts),
    )


def log_report(hook: MlflowHook, mlflow_run_id: str, inputs: ReportInputs) -> dict[str, str]:
    """Write the report and its plots, log them under ``evaluation/`` of the run; the XCom's ``report``."""
    import tempfile
    import time
    from pathlib import Path

    from trainpipe.steps.evaluate.report import REPORT_FILE, write_report

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="trainpipe-report-") as folder:
        files = write_report(inputs, Path(folder))
        hook.client.log_artifacts(mlflow_run_id, folder, REPORT_ARTIFACT_DIR)
    run = hook.client.get_run(mlflow_run_id)
    artifact_path = f"{REPORT_ARTIFACT_DIR}/{REPORT_FILE}"
    log.info("evaluation report: %s of MLflow run %s (%d files, %.1f s)", artifact_path, mlflow_run_id, len(files),
             time.monotonic() - started)
    # runs:/ rather than the store's location: it names no machine path and resolves with any client.
    return {"run_id": mlflow_run_id, "experiment_id": run.info.experiment_id, "artifact_path": artifact_path,
            "artifact_uri": f"runs:/{mlflow_run_id}/{artifact_path}"}


@dataclass(frozen=True, slots=True, kw_only=True)
class GateOutcome:
    gate: str
    metric: str
    value: float
    baseline: float | None
    compared: float
    threshold: float
    passed: bool
    note: str
    # What ``baseline`` is the value of: the champion's (relative and worst_slice gates) or the baseline model's;
    # CLASSES_REFERENCE: the check of the champion's classes, which has no value.
    reference: str = "champion"


_OPS = {">=": lambda a, b: a >= b, ">": lambda a, b: a > b, "<=": lambda a, b: a <= b, "<": lambda a, b: a < b}


def check_gate(gate: Gate, candidate: dict[str, float], champion: dict[str, float] | None,
               slices: dict[str, list[dict[str, Any]]] | None = None,
               baseline: dict[str, float] | None = None) -> GateOutcome:
    """``slices`` (as ``holdout_slices`` returns them) is needed by a worst_slice gate only, ``baseline``
    (the baseline model's metrics) by a baseline gate only."""
    if gate.baseline:
        return _check_baseline_gate(gate, candidate[gate.metric], (baseline or {}).get(gate.metric))
    if gate.worst_slice:
        return _check_worst_slice_gate(gate, slices or {}, has_champion=champion is not None)
    return _compare(gate, candidate[gate.metric], champion[gate.metric] if champion is not None else None,
                    has_champion=champion is not None)


def _compare(gate: Gate, value: float, baseline: float | None, *, has_champion: bool, where: str = "") -> GateOutcome:
    if not gate.relative:
        passed = _OPS[gate.op](value, gate.threshold)
        return GateOutcome(gate=str(gate), metric=gate.metric, value=value, baseline=None, compared=value,
                           threshold=gate.threshold, passed=passed, note=f"absolute{where}")
    if not has_champion:
        return GateOutcome(gate=str(gate), metric=gate.metric, value=value, baseline=None, compared=0.0,
                           threshold=gate.threshold, passed=True, note=f"no champion yet{where}")
    if baseline is None:
        return GateOutcome(gate=str(gate), metric=gate.metric, value=value, baseline=None, compared=0.0,
                           threshold=gate.threshold, passed=True, note=f"no slice of the champion has {gate.metric}{where}")
    # Improvement in the metric's good direction, relative to the champion.
    change = (value - baseline) / abs(baseline) if baseline else (value - baseline)
    if not metrics.higher_is_better(gate.metric):
        change = -change
    passed = _OPS[gate.op](change, gate.threshold)
    return GateOutcome(gate=str(gate), metric=gate.metric, value=value, baseline=baseline, compared=change,
                       threshold=gate.threshold, passed=passed, note=f"{change * 100:+.3f}% vs champion{where}")


def _check_baseline_gate(gate: Gate, value: float, reference: float | None) -> GateOutcome:
    """``value OP reference + threshold``; with no baseline (no train split to fit it on) the gate fails:
    nothing shows the candidate beats it."""
    if reference is None:
        return GateOutcome(gate=str(gate), metric=gate.metric, value=value, baseline=None, compared=value,
                           threshold=gate.threshold, passed=False, note="no baseline was fitted (no train split)",
                           reference="baseline")
    bound = reference + gate.threshold
    return GateOutcome(gate=str(gate), metric=gate.metric, value=value, baseline=reference, compared=value,
                       threshold=bound, passed=_OPS[gate.op](value, bound),
                       note=f"{value - reference:+.6f} vs baseline", reference="baseline")


def _check_worst_slice_gate(gate: Gate, slices: dict[str, list[dict[str, Any]]], *, has_champion: bool) -> GateOutcome:
    """The candidate's worst slice against the threshold, or (relative) against the champion's own worst slice."""
    worst = metrics.worst_slice(gate.metric, slices, model="candidate")
    if worst is None:
        # No slice can give the metric (e.g. every slice holds one class): nothing shows the model is fit.
        # 0.0 stands for "no value": the outcome travels as JSON, which has no NaN.
        return GateOutcome(gate=str(gate), metric=gate.metric, value=0.0, baseline=None, compared=0.0,
                           threshold=gate.threshold, passed=False,
                           note=f"no slice has a value of {gate.metric}" + ("" if slices else " (no slices computed)"))
    column, entry = worst
    where = f"; worst slice {column}={entry['value']} ({entry['rows']} rows)"
    champion_worst = metrics.worst_slice(gate.metric, slices, model="champion") if has_champion else None
    baseline = champion_worst[1]["champion"][gate.metric] if champion_worst else None
    if gate.relative and champion_worst is not None:
        where += f", champion's worst {champion_worst[0]}={champion_worst[1]['value']}"
    return _compare(gate, entry["candidate"][gate.metric], baseline, has_champion=has_champion, where=where)


def check_gates(gates: tuple[Gate, ...], evaluation: dict[str, Any]) -> list[GateOutcome]:
    """Every gate's outcome. With ``classes_differ`` (the champion's classes are not the candidate's) the
    first outcome is that check, failed, and the gates that compare with the champion fail uncompared."""
    classes_differ = evaluation.get("classes_differ")
    perplexities = evaluation.get("perplexities")
    if classes_differ is None:
        outcomes = [check_gate(g, evaluation["candidate"], evaluation["champion"], evaluation.get("slices"),
                               evaluation.get("baseline")) for g in gates]
    else:
        outcomes = [classes_outcome(classes_differ)] + [
            _not_compared(g, evaluation["candidate"], evaluation.get("slices") or {}) if g.relative
            else check_gate(g, evaluation["candidate"], None, evaluation.get("slices"), evaluation.get("baseline"))
            for g in gates]
    if perplexities is not None:
        outcomes.insert(0, perplexity_outcome(*perplexities))
    for outcome in outcomes:
        log_gate(asdict(outcome))
    return outcomes


# The check that stands first among a causal LM's gates when it has a champion.
PERPLEXITY_GATE = "perplexity no worse than the champion's"


def token_perplexity(scores: np.ndarray) -> float:
    """exp(summed token loss / tokens) of ``token_scores``' array (the holdout's perplexity)."""
    return metrics.compute_metrics(CAUSAL_LM, ["perplexity"], y_true=[], y_score=scores)["perplexity"]


def perplexity_outcome(candidate: float, champion: float) -> GateOutcome:
    """A causal LM never replaces a champion it is worse than, whatever the spec's gates say: the champion's
    perplexity on the same holdout is the bar (a tie passes). The note gives both values."""
    passed = candidate <= champion
    verdict = "no worse than" if passed else "worse than"
    return GateOutcome(gate=PERPLEXITY_GATE, metric="perplexity", value=candidate, baseline=champion,
                       compared=candidate, threshold=champion, passed=passed,
                       note=f"the candidate's holdout perplexity {candidate:.4f} is {verdict} the champion's "
                            f"{champion:.4f}")


# The check that stands first among the gates when the champion's classes are not the candidate's.
CLASSES_GATE = "same classes as the champion"


def classes_outcome(difference: str) -> GateOutcome:
    """The failed check of a champion with other classes. It has no value: 0.0 stands for none (the outcome
    travels as JSON), and ``reference`` tells the gate table and the log to show its note alone."""
    return GateOutcome(gate=CLASSES_GATE, metric="classes", value=0.0, baseline=None, compared=0.0, threshold=0.0,
                       passed=False, note=difference, reference=CLASSES_REFERENCE)


def _not_compared(gate: Gate, candidate: dict[str, float], slices: dict[str, list[dict[str, Any]]]) -> GateOutcome:
    """A relative gate when the champion's classes differ: nothing shows the candidate is at least as good."""
    value = candidate[gate.metric]
    if gate.worst_slice:
        worst = metrics.worst_slice(gate.metric, slices, model="candidate")
        value = worst[1]["candidate"][gate.metric] if worst is not None else 0.0
    return GateOutcome(gate=str(gate), metric=gate.metric, value=value, baseline=None, compared=0.0,
                       threshold=gate.threshold, passed=False,
                       note="not compared: the champion's classes differ from the candidate's")


def log_gate(outcome: dict[str, Any], logger: logging.Logger | None = None) -> None:
    """One line per gate: verdict, value, the champion's value when compared (a ``GateOutcome`` as a dict).
    A failed gate is a WARNING."""
    level = logging.INFO if outcome["passed"] else logging.WARNING
    if outcome.get("reference") == CLASSES_REFERENCE:
        (logger or log).log(level, "gate %-4s %s (%s)", "PASS" if outcome["passed"] else "FAIL", outcome["gate"],
                            outcome["note"])
        return
    baseline = outcome["baseline"]
    (logger or log).log(logging.INFO if outcome["passed"] else logging.WARNING, "gate %-4s %s: value %.6f%s (%s)",
                        "PASS" if outcome["passed"] else "FAIL", outcome["gate"], outcome["value"],
                        f", {outcome.get('reference', 'champion')} {baseline:.6f}" if baseline is not None else "",
                        outcome["note"])


def _metric_entities(values: dict[str, float]) -> list[Any]:
    import time

    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    return [Metric(key=k, value=float(v), timestamp=now, step=0) for k, v in values.items()]


def _fmt(values: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.4f}" for k, v in values.items())


def _fmt_optional(values: dict[str, float | None]) -> str:
    return ", ".join(f"{k}={v:.4f}" if v is not None else f"{k}=n/a" for k, v in values.items())


def outcomes_as_dicts(outcomes: list[GateOutcome]) -> list[dict[str, Any]]:
    return [asdict(o) for o in outcomes]

