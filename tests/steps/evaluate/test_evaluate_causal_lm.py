"""The evaluate step for a causal language model: the served pyfunc answers ``params={"score": "token_loss"}`` with
per-row token sums, from which perplexity, token accuracy and loss are token-weighted; no linear baseline; a
candidate whose holdout perplexity is worse than the champion's stops at its gate with both values in the note.
The MLflow hook and the models are in-memory stand-ins (fabricated token sums: no transformer is loaded)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from tests.steps.evaluate.stand_ins import Hook, ServedModel
from trainpipe.plan.model import EvaluationPlan, Gate, RegistrationPlan
from trainpipe.settings import Settings
from trainpipe.spec.sections.evaluation import EvaluationSpec
from trainpipe.steps.evaluate import metrics
from trainpipe.steps.evaluate.evaluate import (
    PERPLEXITY_GATE,
    TOKEN_SCORE_PARAMS,
    ModelOutputError,
    check_gates,
    evaluate,
    perplexity_outcome,
    token_scores,
)
from trainpipe.steps.evaluate.gate_table import gate_table, summary

CANDIDATE_URI = "runs:/candidate/model"
CHAMPION_URI = "models:/ticket_answers@champion"
METRICS = ("perplexity", "token_accuracy", "loss")


def served(loss_per_token: float, rows: int, accuracy: float = 0.5, seed: int = 0) -> pd.DataFrame:
    """What a causal LM's pyfunc answers for token scores: per row its target tokens' summed loss, their number
    and how many were predicted right (a mean loss of ``loss_per_token`` over every token)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, 20, size=rows)
    return pd.DataFrame({"loss_sum": tokens * loss_per_token, "tokens": tokens,
                         "correct": np.floor(tokens * accuracy)})


def _hook(models: dict[str, Any]) -> Hook:
    return Hook(models, champion_uri=CHAMPION_URI, champion_version="4")


def _holdout(rows: int = 200) -> pd.DataFrame:
    rng = np.random.default_rng(1)
    return pd.DataFrame({"prompt": [f"ticket {i}: which queue?" for i in range(rows)],
                         "completion": rng.choice([" billing.", " shipping."], rows),
                         "channel": rng.choice(["email", "chat"], rows)})


def _plan(gates: list[str], *, label: str = "completion", slices: tuple[str, ...] = ()) -> EvaluationPlan:
    spec_gates = EvaluationSpec(metrics=list(METRICS), gates=gates).gates
    return EvaluationPlan(task="causal_lm", features=("prompt",), label=label, group_column=None,
                          metrics=METRICS, decision_threshold=0.5, slices=slices, text_features=("prompt",),
                          gates=tuple(Gate(metric=g.metric, op=g.op, threshold=g.threshold, relative=g.relative,
                                           text=str(g), worst_slice=g.worst_slice) for g in spec_gates))


REGISTRATION = RegistrationPlan(model_name="ticket_answers", alias="champion", challenger_alias="challenger",
                                previous_alias="previous_champion", description="")


def _evaluate(tmp_path: Path, hook: Hook, plan: EvaluationPlan, holdout: pd.DataFrame,
              monkeypatch: pytest.MonkeyPatch, *, train: bool = True) -> dict[str, Any]:
    monkeypatch.delenv("TRAINPIPE_STORAGE_CONN_ID", raising=False)
    holdout.to_parquet(tmp_path / "holdout.parquet")
    holdout.to_parquet(tmp_path / "train.parquet")
    return evaluate(plan, REGISTRATION, holdout_uri=str(tmp_path / "holdout.parquet"), model_uri=CANDIDATE_URI,
                    mlflow_run_id="run-1", hook=hook,  # type: ignore[arg-type]
                    settings=Settings.from_env(), train_uri=str(tmp_path / "train.parquet") if train else None)


def test_token_metrics_are_weighted_by_tokens_not_rows():
    # Row 1: 1 token, loss 4; row 2: 9 tokens, loss 0.5 each. Per token: (4 + 4.5) / 10.
    scores = np.asarray([[4.0, 1, 0], [4.5, 9, 9]])

    values = metrics.compute_metrics("causal_lm", list(METRICS), y_true=[], y_score=scores)

    assert values["loss"] == pytest.approx(0.85)
    assert values["perplexity"] == pytest.approx(math.exp(0.85))
    assert values["token_accuracy"] == pytest.approx(0.9)
    assert not metrics.higher_is_better("perplexity") and not metrics.higher_is_better("loss")
    assert metrics.higher_is_better("token_accuracy")


def test_rows_without_a_target_token_give_no_metric():
    with pytest.raises(metrics.MetricInputError, match="no target token"):
        metrics.compute_metrics("causal_lm", ["perplexity"], y_true=[], y_score=np.zeros((3, 3)))


@pytest.mark.parametrize("output", [
    pd.DataFrame({"loss": [1.0], "tokens": [2]}),                 # a renamed column
    pd.Series([0.5]),                                             # a classifier's scores
    pd.DataFrame({"loss_sum": [1.0], "tokens": [2], "correct": [3]}),  # more right than there are tokens
    pd.DataFrame({"loss_sum": [float("nan")], "tokens": [2], "correct": [1]}),
])
def test_an_answer_without_token_scores_is_refused_naming_the_columns(output):
    with pytest.raises(ModelOutputError, match=CANDIDATE_URI):
        token_scores(output, model_uri=CANDIDATE_URI, rows=1)


def test_the_candidate_is_asked_for_token_scores_of_the_raw_text_and_has_no_baseline(tmp_path, monkeypatch):
    holdout = _holdout()
    hook = _hook({CANDIDATE_URI: served(1.0, len(holdout), accuracy=0.6)})

    result = _evaluate(tmp_path, hook, _plan(["perplexity <= 3"]), holdout, monkeypatch)

    [(columns, params)] = hook.models[CANDIDATE_URI].calls
    assert columns == ["prompt", "completion"] and params == TOKEN_SCORE_PARAMS
    assert result["candidate"]["perplexity"] == pytest.approx(math.e)
    assert result["candidate"]["loss"] == pytest.approx(1.0)
    assert result["baseline"] is None and result["baseline_model"] is None
    assert result["gates_passed"] is True
    assert hook.client.metrics["holdout_perplexity"] == pytest.approx(math.e)
    assert not any(key.startswith("baseline_") for key in hook.client.metrics)
    page = hook.client.artifacts["evaluation/report.html"].decode()
    assert "none: a causal language model is compared with its champion" in page
    assert "Plots" not in page  # no empty section: a language model's report is its metrics


def test_a_plain_language_model_is_asked_with_its_text_column_only(tmp_path, monkeypatch):
    holdout = _holdout()
    hook = _hook({CANDIDATE_URI: served(2.0, len(holdout))})

    result = _evaluate(tmp_path, hook, _plan([], label=""), holdout, monkeypatch)

    [(columns, _)] = hook.models[CANDIDATE_URI].calls
    assert columns == ["prompt"]
    assert result["candidate"]["perplexity"] == pytest.approx(math.exp(2.0))


def test_a_candidate_worse_than_the_champion_stops_at_its_gate_with_both_perplexities(tmp_path, monkeypatch):
    holdout = _holdout()
    hook = _hook({CANDIDATE_URI: served(1.5, len(holdout)), CHAMPION_URI: served(1.0, len(holdout))})

    # The spec's own gates pass: the champion's perplexity is the bar all the same.
    result = _evaluate(tmp_path, hook, _plan(["perplexity <= 100"]), holdout, monkeypatch)

    assert result["gates_passed"] is False
    first = result["gates"][0]
    assert first["gate"] == PERPLEXITY_GATE and first["passed"] is False
    assert first["value"] == pytest.approx(math.exp(1.5)) and first["baseline"] == pytest.approx(math.e)
    assert first["note"] == (f"the candidate's holdout perplexity {math.exp(1.5):.4f} is worse than the champion's "
                             f"{math.e:.4f}")
    assert result["gates"][1]["passed"] is True  # perplexity <= 100
    line = summary(gate_table(result), consequence="not registered")
    assert line.startswith("gates failed (1 of 2)") and f"{math.exp(1.5):.4f}" in line and f"{math.e:.4f}" in line
    assert hook.client.tags["trainpipe.gates_passed"] == "false"


def test_a_candidate_at_least_as_good_as_the_champion_passes_that_check(tmp_path, monkeypatch):
    holdout = _holdout()
    hook = _hook({CANDIDATE_URI: served(1.0, len(holdout)), CHAMPION_URI: served(1.0, len(holdout))})

    result = _evaluate(tmp_path, hook, _plan(["perplexity >= -1%"]), holdout, monkeypatch)

    assert result["gates_passed"] is True
    assert [g["gate"] for g in result["gates"]] == [PERPLEXITY_GATE, "perplexity >= -1% vs champion"]


def test_a_champion_of_another_task_is_not_compared_and_the_run_stops_saying_why(tmp_path, monkeypatch):
    holdout = _holdout()
    hook = _hook({CANDIDATE_URI: served(1.0, len(holdout)), CHAMPION_URI: pd.Series(np.zeros(len(holdout)))})

    result = _evaluate(tmp_path, hook, _plan([]), holdout, monkeypatch)

    assert result["gates_passed"] is False and result["champion"] is None
    assert "the champion gives no token scores to compare" in result["gates"][0]["note"]


def test_slices_are_token_weighted_per_value(tmp_path, monkeypatch):
    holdout = _holdout(rows=100)
    output = served(1.0, len(holdout))
    output.loc[holdout["channel"] == "chat", "loss_sum"] *= 2  # chat rows: loss 2 per token
    hook = _hook({CANDIDATE_URI: output})

    result = _evaluate(tmp_path, hook, _plan(["worst_slice(perplexity) <= 10"], slices=("channel",)), holdout,
                       monkeypatch)

    by_value = {entry["value"]: entry["candidate"] for entry in result["slices"]["channel"]}
    assert by_value["chat"]["loss"] == pytest.approx(2.0) and by_value["email"]["loss"] == pytest.approx(1.0)
    assert result["gates"][0]["passed"] is True and "channel=chat" in result["gates"][0]["note"]


def test_the_perplexity_check_is_a_gate_outcome_like_the_others():
    [outcome] = [o for o in check_gates((), {"candidate": {"perplexity": 9.0}, "champion": {"perplexity": 8.0},
                                              "perplexities": (9.0, 8.0)})]
    assert outcome == perplexity_outcome(9.0, 8.0) and not outcome.passed
    assert perplexity_outcome(8.0, 8.0).passed  # a tie keeps the run going


def test_an_answer_without_the_right_token_count_is_refused_naming_the_columns(tmp_path, monkeypatch):
    """Every served causal LM answers loss_sum, tokens and correct (trainpipe_trainer.config.TOKEN_SCORE_COLUMNS):
    one without the right-token count is not a model of this trainer, and the run stops saying what it lacks."""
    holdout = _holdout()
    output = served(1.0, len(holdout)).drop(columns="correct")

    with pytest.raises(ModelOutputError, match="columns loss_sum, tokens, correct per row"):
        _evaluate(tmp_path, _hook({CANDIDATE_URI: output}), _plan([]), holdout, monkeypatch)


@pytest.mark.integration  # imports transformers and loads a model: ~10 s
def test_the_trainer_s_own_served_causal_lm_is_evaluated(tmp_path, monkeypatch):
    """The trainer's served model (models.transformer.served) over a tiny GPT-2 written here, untrained: the
    evaluation asks it for token scores of the raw text and gets its perplexity, loss and token accuracy."""
    pytest.importorskip("transformers")
    import json as jsonlib

    from trainpipe_trainer.models.transformer.served import FORMAT_VERSION, TransformerScorer
    from trainpipe_trainer.models.transformer.tiny import write_tiny_model

    holdout = _holdout(rows=12)
    folder = write_tiny_model(tmp_path / "tiny", [*holdout["prompt"], *holdout["completion"]], seed=0,
                              vocab_size=300, n_positions=64)
    meta = tmp_path / "trainpipe.json"
    meta.write_text(jsonlib.dumps({
        "format_version": FORMAT_VERSION, "task": "causal_lm", "features": ["prompt"], "label": "completion",
        "classes": [], "target": None, "max_length": 16, "max_new_tokens": 4, "trainable": "all",
        "pretrained": {"uri": folder.as_uri(), "sha256": ""}}))
    scorer = TransformerScorer.from_artifacts({"model": str(folder), "meta": str(meta)})

    class _Served(ServedModel):
        def predict(self, frame: pd.DataFrame, params: dict[str, Any] | None = None) -> Any:
            self.calls.append((list(frame.columns), params))
            return scorer.prediction(frame, params)

    hook = _hook({})
    hook.models[CANDIDATE_URI] = _Served(None)
    plan = EvaluationPlan(task="causal_lm", features=("prompt",), label="completion", group_column=None,
                          metrics=("perplexity", "loss", "token_accuracy"), decision_threshold=0.5,
                          text_features=("prompt",), gates=())

    result = _evaluate(tmp_path, hook, plan, holdout, monkeypatch)

    # Untrained over a vocabulary of ~300: about as perplexed as a uniform guess, and exp(loss) either way.
    assert 10 < result["candidate"]["perplexity"] < 2000
    assert result["candidate"]["perplexity"] == pytest.approx(math.exp(result["candidate"]["loss"]))
    assert 0 <= result["candidate"]["token_accuracy"] < 0.5
