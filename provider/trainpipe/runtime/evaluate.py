"""The ``evaluate`` and ``gate`` steps (``register`` and ``promote``: ``trainpipe.registry``).

The new model and the current champion are scored on the same holdout of this run's snapshot, so
relative gates compare like with like.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

from trainpipe import metrics, storage
from trainpipe.hooks.mlflow import MlflowHook, mlflow_metric_key
from trainpipe.plan import EvaluationPlan, Gate, RegistrationPlan

log = logging.getLogger(__name__)

# Tag of the MLflow run: "true" when every gate passed (the gate task then lets register run).
GATES_PASSED_TAG = "trainpipe.gates_passed"


def score_model(model_uri: str, evaluation: EvaluationPlan, holdout_uri: str) -> dict[str, float]:
    import mlflow.pyfunc
    import pandas as pd

    holdout = storage.read_parquet_uri(holdout_uri)
    # No check of the model's pip requirements against this worker: it reads the metadata of every
    # installed distribution (seconds per task), and the serving environment is decided elsewhere.
    model = mlflow.pyfunc.load_model(model_uri, suppress_warnings=True)
    scores = model.predict(holdout[list(evaluation.features)])
    return metrics.compute_metrics(
        evaluation.task,
        list(evaluation.metrics),
        y_true=holdout[evaluation.label].to_numpy(),
        y_score=pd.Series(scores).to_numpy(dtype=float).ravel(),
        groups=holdout[evaluation.group_column].to_numpy() if evaluation.group_column else None,
        threshold=evaluation.decision_threshold,
    )


def evaluate(evaluation: EvaluationPlan, registration: RegistrationPlan, *, holdout_uri: str, model_uri: str,
             mlflow_run_id: str, hook: MlflowHook) -> dict[str, Any]:
    candidate = score_model(model_uri, evaluation, holdout_uri)
    log.info("candidate on holdout: %s", _fmt(candidate))
    champion_version = hook.version_by_alias(registration.model_name, registration.alias)
    champion = None
    if champion_version is not None:
        champion_uri = f"models:/{registration.model_name}@{registration.alias}"
        champion = score_model(champion_uri, evaluation, holdout_uri)
        log.info("champion (version %s) on the same holdout: %s", champion_version.version, _fmt(champion))
    else:
        log.info("no %s of %s yet: relative gates will pass", registration.alias, registration.model_name)
    outcomes = check_gates(evaluation.gates, {"candidate": candidate, "champion": champion})
    passed = all(o.passed for o in outcomes)
    from mlflow.entities import RunTag

    # The verdict goes on the MLflow run here, in the same call as the metrics: the gate task then
    # needs no MLflow client (importing MLflow and opening its store cost seconds per task process).
    hook.client.log_batch(
        mlflow_run_id,
        metrics=_metric_entities({f"holdout_{mlflow_metric_key(k)}": v for k, v in candidate.items()}
                                 | {f"champion_holdout_{mlflow_metric_key(k)}": v for k, v in (champion or {}).items()}),
        tags=[RunTag(GATES_PASSED_TAG, str(passed).lower())],
    )
    return {
        "candidate": candidate,
        "champion": champion,
        "champion_version": champion_version.version if champion_version else None,
        "gates": outcomes_as_dicts(outcomes),
        "gates_passed": passed,
    }


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


_OPS = {">=": lambda a, b: a >= b, ">": lambda a, b: a > b, "<=": lambda a, b: a <= b, "<": lambda a, b: a < b}


def check_gate(gate: Gate, candidate: dict[str, float], champion: dict[str, float] | None) -> GateOutcome:
    value = candidate[gate.metric]
    if not gate.relative:
        passed = _OPS[gate.op](value, gate.threshold)
        return GateOutcome(gate=str(gate), metric=gate.metric, value=value, baseline=None, compared=value,
                           threshold=gate.threshold, passed=passed, note="absolute")
    if champion is None:
        return GateOutcome(gate=str(gate), metric=gate.metric, value=value, baseline=None, compared=0.0,
                           threshold=gate.threshold, passed=True, note="no champion yet")
    baseline = champion[gate.metric]
    # Improvement in the metric's good direction, relative to the champion.
    change = (value - baseline) / abs(baseline) if baseline else (value - baseline)
    if not metrics.higher_is_better(gate.metric):
        change = -change
    passed = _OPS[gate.op](change, gate.threshold)
    return GateOutcome(gate=str(gate), metric=gate.metric, value=value, baseline=baseline, compared=change,
                       threshold=gate.threshold, passed=passed, note=f"{change * 100:+.3f}% vs champion")


def check_gates(gates: tuple[Gate, ...], evaluation: dict[str, Any]) -> list[GateOutcome]:
    outcomes = [check_gate(g, evaluation["candidate"], evaluation["champion"]) for g in gates]
    for outcome in outcomes:
        log_gate(asdict(outcome))
    return outcomes


def log_gate(outcome: dict[str, Any], logger: logging.Logger | None = None) -> None:
    """One line per gate: verdict, value, the champion's value when compared (a ``GateOutcome`` as a dict).
    A failed gate is a WARNING."""
    baseline = outcome["baseline"]
    (logger or log).log(logging.INFO if outcome["passed"] else logging.WARNING, "gate %-4s %s: value %.6f%s (%s)",
                        "PASS" if outcome["passed"] else "FAIL", outcome["gate"], outcome["value"],
                        f", champion {baseline:.6f}" if baseline is not None else "", outcome["note"])


def _metric_entities(values: dict[str, float]) -> list[Any]:
    import time

    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    return [Metric(key=k, value=float(v), timestamp=now, step=0) for k, v in values.items()]


def _fmt(values: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.4f}" for k, v in values.items())


def outcomes_as_dicts(outcomes: list[GateOutcome]) -> list[dict[str, Any]]:
    return [asdict(o) for o in outcomes]

