"""The evaluate step for a multiclass model: the served model's DataFrame of class probabilities, the
candidate against a champion with the same classes (in any order) or with others, which stops the run at
the gate; per-class F1 on the MLflow run. The MLflow hook is an in-memory stand-in (no store, no model files)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from tests.steps.evaluate.stand_ins import Hook
from trainpipe.plan.model import EvaluationPlan, Gate, RegistrationPlan
from trainpipe.settings import Settings
from trainpipe.spec.sections.evaluation import EvaluationSpec
from trainpipe.steps.evaluate.evaluate import (
    CLASSES_GATE,
    ModelOutputError,
    Predictions,
    class_difference,
    class_probabilities,
    evaluate,
)
from trainpipe.steps.evaluate.gate_table import as_text, gate_table, summary

CANDIDATE_URI = "runs:/candidate/model"
CHAMPION_URI = "models:/zoo@champion"
METRICS = ("accuracy", "balanced_accuracy", "macro_f1", "log_loss")


def served(probabilities: np.ndarray, classes: tuple[str, ...]) -> pd.DataFrame:
    """What a multiclass model's pyfunc returns: the predicted class, then one probability column per class."""
    frame = pd.DataFrame({"label": np.asarray(classes)[probabilities.argmax(axis=1)]})
    for index, name in enumerate(classes):
        frame[f"probability_{name}"] = probabilities[:, index]
    return frame


def _hook(models: dict[str, Any]) -> Hook:
    return Hook(models, champion_uri=CHAMPION_URI, champion_version="3")


def _holdout(rows: int = 300, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"x": rng.normal(size=rows), "region": rng.choice(["north", "south"], rows),
                         "species": rng.choice(["cat", "dog", "owl"], rows, p=[0.5, 0.3, 0.2])})


def _probabilities(labels: pd.Series, classes: tuple[str, ...], right: float, seed: int,
                   wrong_share: float = 0.1) -> np.ndarray:
    """The top class of a row gets ``right`` of the probability: its own class, except on ``wrong_share`` of
    the rows (the next class there)."""
    rng = np.random.default_rng(seed)
    own = np.asarray([classes.index(label) for label in labels])
    wrong = rng.random(own.size) < wrong_share
    top = np.where(wrong, (own + 1) % len(classes), own)
    probabilities = np.full((own.size, len(classes)), (1 - right) / (len(classes) - 1))
    probabilities[np.arange(own.size), top] = right
    return probabilities


def _plan(gates: list[str]) -> EvaluationPlan:
    spec_gates = EvaluationSpec(metrics=list(METRICS), gates=gates).gates
    return EvaluationPlan(task="multiclass_classification", features=("x",), label="species", group_column=None,
                          metrics=METRICS, decision_threshold=0.5, slices=("region",),
                          gates=tuple(Gate(metric=g.metric, op=g.op, threshold=g.threshold, relative=g.relative,
                                           text=str(g), worst_slice=g.worst_slice) for g in spec_gates))


REGISTRATION = RegistrationPlan(model_name="zoo", alias="champion", challenger_alias="challenger",
                                previous_alias="previous_champion", description="")


def _evaluate(tmp_path: Path, hook: Hook, gates: list[str], holdout: pd.DataFrame,
              monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.delenv("TRAINPIPE_STORAGE_CONN_ID", raising=False)
    holdout.to_parquet(tmp_path / "holdout.parquet")
    return evaluate(_plan(gates), REGISTRATION, holdout_uri=str(tmp_path / "holdout.parquet"),
                    model_uri=CANDIDATE_URI, mlflow_run_id="run-1", hook=hook,  # type: ignore[arg-type]
                    settings=Settings.from_env())


def test_the_served_frame_gives_the_probabilities_and_classes_in_column_order():
    frame = served(np.asarray([[0.2, 0.8], [0.9, 0.1]]), ("yes", "no"))

    predictions = class_probabilities(frame, model_uri=CANDIDATE_URI, rows=2)

    assert predictions.classes == ("yes", "no")
    assert predictions.scores.tolist() == [[0.2, 0.8], [0.9, 0.1]]


def test_an_output_without_class_probabilities_is_refused_naming_the_model():
    with pytest.raises(ModelOutputError, match=r"runs:/candidate/model: a multiclass model returns a DataFrame "
                                               r"with a 'label' column and one 'probability_<class>' column per "
                                               r"class; it returned a ndarray \(is it a model of another task\?\)"):
        class_probabilities(np.zeros(3), model_uri=CANDIDATE_URI, rows=3)
    with pytest.raises(ModelOutputError, match="returned 2 rows for 3 holdout rows"):
        class_probabilities(served(np.eye(2), ("a", "b")), model_uri=CANDIDATE_URI, rows=3)


def test_class_difference_names_the_new_and_the_missing_classes():
    assert class_difference(("a", "b", "c"), ("c", "a", "b")) is None  # the same classes, another order
    assert class_difference(("a", "x"), ("a", "y")) == (
        "the candidate's classes differ from the champion's: new 'x'; missing 'y'")
    assert class_difference(("a", "b", "x"), ("a", "b")) == "the candidate's classes differ from the champion's: new 'x'"
    many = tuple(f"c{i}" for i in range(13))
    assert class_difference(("a", "b"), ("a", "b", *many)).endswith("missing 'c0', 'c1', 'c2', 'c3', 'c4', 'c5', 'c6', "
                                                                    "'c7', 'c8', 'c9' and 3 more")


def test_candidate_and_champion_with_the_same_classes_in_another_order_are_compared(tmp_path, monkeypatch):
    holdout = _holdout()
    classes = ("cat", "dog", "owl")
    candidate = _probabilities(holdout["species"], classes, right=0.8, seed=1, wrong_share=0.05)
    champion = _probabilities(holdout["species"], classes, right=0.6, seed=2, wrong_share=0.2)
    # The champion's columns come in another order: owl, cat, dog.
    hook = _hook({CANDIDATE_URI: served(candidate, classes),
                  CHAMPION_URI: served(champion[:, [2, 0, 1]], ("owl", "cat", "dog"))})

    result = _evaluate(tmp_path, hook, ["macro_f1 >= -1%", "accuracy >= 0.5", "worst_slice(macro_f1) >= 0.5"],
                       holdout, monkeypatch)

    from trainpipe.steps.evaluate import metrics

    expected = metrics.compute_metrics("multiclass_classification", list(METRICS), y_true=holdout["species"],
                                       y_score=champion, classes=classes)
    assert result["champion"] == pytest.approx(expected)
    assert result["candidate"]["log_loss"] < result["champion"]["log_loss"]
    assert result["gates_passed"], result["gates"]
    assert [entry["value"] for entry in result["slices"]["region"]] == ["north", "south"]
    assert all(entry["champion"] is not None for entry in result["slices"]["region"])
    logged = hook.client.metrics
    assert logged["holdout_macro_f1"] == result["candidate"]["macro_f1"]
    assert logged["champion_holdout_log_loss"] == pytest.approx(expected["log_loss"])
    per_class = {row["class"]: row["f1"] for row in metrics.per_class_metrics(holdout["species"], candidate, classes)}
    assert {key: value for key, value in logged.items() if key.startswith("holdout_f1.")} == {
        f"holdout_f1.{name}": pytest.approx(value) for name, value in per_class.items()}
    assert hook.client.tags["trainpipe.gates_passed"] == "true"


def test_a_champion_with_other_classes_is_not_compared_and_the_gate_stops_the_run(tmp_path, monkeypatch):
    holdout = _holdout()
    classes = ("cat", "dog", "owl")
    candidate = _probabilities(holdout["species"], classes, right=0.8, seed=1)
    champion = served(np.tile([0.5, 0.3, 0.2], (len(holdout), 1)), ("cat", "dog", "emu"))
    hook = _hook({CANDIDATE_URI: served(candidate, classes), CHAMPION_URI: champion})

    result = _evaluate(tmp_path, hook, ["macro_f1 >= -1%", "accuracy >= 0.5"], holdout, monkeypatch)

    difference = "the candidate's classes differ from the champion's: new 'owl'; missing 'emu'"
    assert not result["gates_passed"] and result["champion"] is None and result["champion_version"] == "3"
    first, relative, absolute = result["gates"]
    assert (first["gate"], first["passed"], first["note"]) == (CLASSES_GATE, False, difference)
    assert not relative["passed"] and relative["note"].startswith("not compared")
    assert absolute["passed"]  # an absolute gate is still judged: the table shows what the candidate is worth
    assert all(entry["champion"] is None for entry in result["slices"]["region"])
    assert hook.client.tags["trainpipe.gates_passed"] == "false"
    assert not any(key.startswith("champion_holdout_") for key in hook.client.metrics)

    # What the gate task makes of it: the table's row and the run's note name the classes.
    table = gate_table(result)
    assert f"FAIL {CLASSES_GATE} ({difference})" in as_text(table)
    assert summary(table, consequence="nothing registered").startswith(
        f"gates failed (2 of 3): {CLASSES_GATE} ({difference}); macro_f1 >= -1% vs champion (got ")
    report = hook.client.artifacts["evaluation/report.html"].decode()
    assert "not compared: the candidate&#x27;s classes differ from the champion&#x27;s: new &#x27;owl&#x27;" in report
    assert "<th>champion (version 3): not compared</th>" in report
    # Its row in the report's gates has no value.
    assert (f'<td>{CLASSES_GATE}</td><td class="fail">FAIL</td><td class="num muted"></td>') in report


def test_a_champion_of_another_task_is_not_compared_either(tmp_path, monkeypatch):
    holdout = _holdout()
    classes = ("cat", "dog", "owl")
    hook = _hook({CANDIDATE_URI: served(_probabilities(holdout["species"], classes, right=0.8, seed=1), classes),
                  CHAMPION_URI: np.full(len(holdout), 0.5)})  # a binary classifier's P(1)

    result = _evaluate(tmp_path, hook, [], holdout, monkeypatch)

    assert not result["gates_passed"]
    assert result["gates"][0]["note"].startswith("the champion has no class probabilities to compare: "
                                                 "models:/zoo@champion: a multiclass model returns a DataFrame")


def test_a_class_name_mlflow_cannot_take_as_a_key_stays_in_the_report(tmp_path, monkeypatch):
    holdout = _holdout().replace({"species": {"owl": "owl@night", "dog": "dog/../cat"}})
    classes = ("cat", "dog/../cat", "owl@night")
    hook = _hook({CANDIDATE_URI: served(_probabilities(holdout["species"], classes, right=0.8, seed=1), classes)})

    result = _evaluate(tmp_path, hook, [], holdout, monkeypatch)

    assert result["gates_passed"] and result["champion"] is None
    assert [key for key in hook.client.metrics if key.startswith("holdout_f1.")] == ["holdout_f1.cat"]
    report = hook.client.artifacts["evaluation/report.html"].decode()
    assert "<td>owl@night</td>" in report and "<td>dog/../cat</td>" in report


def test_predictions_are_plain_scores_for_other_tasks(tmp_path, monkeypatch):
    from trainpipe.steps.evaluate.evaluate import predict

    hook = _hook({CANDIDATE_URI: np.asarray([0.1, 0.9])})
    plan = EvaluationPlan(task="binary_classification", features=("x",), label="y", group_column=None,
                          metrics=("auc",), decision_threshold=0.5, gates=())

    predictions = predict(hook, CANDIDATE_URI, pd.DataFrame({"x": [1.0, 2.0]}), plan)  # type: ignore[arg-type]

    assert isinstance(predictions, Predictions) and predictions.classes == ()
    assert predictions.scores.tolist() == [0.1, 0.9]
