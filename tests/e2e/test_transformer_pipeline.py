"""The transformer examples end to end: real dag.test(), torchrun with 2 processes, the tiny GPT-2 that
`trainpipe demo-data` writes (nothing downloads), MLflow.

- `dag_configs/ticket_assistant.yaml` (task: causal_lm, DeepSpeed ZeRO-3): a first train try killed after a
  checkpoint (training.testing.crash_first_try_after_step) and its Airflow retry register the weights of an
  uninterrupted run of the same spec, bit for bit; the champion generates a completion for a prompt and scores
  token losses. A worse candidate of the same pipeline stops at the perplexity gate against the champion, which
  does not move.
- `dag_configs/ticket_intent.yaml` (a sequence classifier, DDP): the same kill and retry resumes to the
  uninterrupted weights, and the champion takes raw text.

Smaller than the examples (1,500 tickets, shorter sequences, fewer epochs) so the module runs in minutes on CPU.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.support import REPO, edited_spec, load_dag, run_dag, task_result

pytestmark = [pytest.mark.integration, pytest.mark.slow]
pytest.importorskip("transformers", reason="pip install 'trainpipe-trainer[transformers]'")
pytest.importorskip("deepspeed", reason="pip install 'trainpipe-trainer[deepspeed]'")

END = datetime(2026, 10, 1, tzinfo=UTC)
FOLDER = "transformer_e2e"  # under the storage root: the tickets, the instructions and the tiny model
ROWS = 1500
LM_CRASH_AFTER = 13  # mid-epoch: the retry resumes inside an epoch
INTENT_CRASH_AFTER = 13
QUEUES = ("account", "billing", "shipping", "technical")


@pytest.fixture(scope="module")
def configs(state_dir: Path, airflow_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The module's data and model (written once) and its specs: for each example an uninterrupted pipeline
    and one whose first train try is killed."""
    from trainpipe.demo.synthetic import generate_tickets, instructions_from_tickets, tiny_model_files

    root = state_dir / "storage" / FOLDER
    (root / "tiny-lm").mkdir(parents=True, exist_ok=True)
    tickets = generate_tickets(rows=ROWS, end=END)
    instructions = instructions_from_tickets(tickets)
    tickets.to_parquet(root / "tickets.parquet", index=False)
    instructions.to_parquet(root / "instructions.parquet", index=False)
    # The demo's model, its tokenizer trained on this module's texts (as `trainpipe demo-data` trains it on its own).
    model = tiny_model_files([*tickets["subject"], *tickets["body"], *instructions["prompt"],
                              *instructions["completion"]])
    assert model is not None
    for name, data in model.items():
        (root / "tiny-lm" / name).write_bytes(data)

    folder = tmp_path_factory.mktemp("transformer_configs")
    for pipeline, crash in (("lm_steady", None), ("lm_resumed", LM_CRASH_AFTER)):
        (folder / f"{pipeline}.yaml").write_text(_assistant_spec(pipeline, crash=crash))
    for pipeline, crash in (("intent_steady", None), ("intent_resumed", INTENT_CRASH_AFTER)):
        (folder / f"{pipeline}.yaml").write_text(_intent_spec(pipeline, crash=crash))
    return folder


def _common(example: str, pipeline: str, crash: int | None) -> tuple[tuple[str, str], ...]:
    edits = (
        (f"pipeline_id: {example}", f"pipeline_id: {pipeline}"), (f"model_name: {example}", f"model_name: {pipeline}"),
        ("pretrained: demo/models/tiny-lm", f"pretrained: {FOLDER}/tiny-lm"),
        ("retry_delay: 1m", "retry_delay: 1"),  # dag.test() waits it out
        ("{min_value: 1000}", "{min_value: 500}"),
    )
    if crash is not None:
        edits += (("  checkpoint:\n", f"  testing:\n    crash_first_try_after_step: {crash}\n  checkpoint:\n"),)
    return edits


def _assistant_spec(pipeline: str, *, crash: int | None = None, extra: tuple[tuple[str, str], ...] = ()) -> str:
    # The longest prompt and its completion are 34 tokens of the tiny model's tokenizer: 40 cuts none.
    return edited_spec(REPO / "dag_configs" / "ticket_assistant.yaml", (
        *_common("ticket_assistant", pipeline, crash),
        ("uri: demo/instructions/instructions.parquet", f"uri: {FOLDER}/instructions.parquet"),
        ("max_length: 64 ", "max_length: 40 "), ("  epochs: 6\n", "  epochs: 3\n"), *extra))


def _intent_spec(pipeline: str, *, crash: int | None = None) -> str:
    return edited_spec(REPO / "dag_configs" / "ticket_intent.yaml", (
        *_common("ticket_intent", pipeline, crash),
        ("uri: demo/tickets/tickets.parquet", f"uri: {FOLDER}/tickets.parquet"),
        ("max_length: 64 ", "max_length: 32 "), ("  epochs: 8\n", "  epochs: 3\n")))


def _run(configs: Path, pipeline: str, logical_date: datetime = END) -> tuple[Any, dict[str, str]]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TRAINPIPE_ALLOW_FAULT_INJECTION", "1")  # training.testing (ADR 0014)
        return run_dag(load_dag(configs, pipeline, env), logical_date=logical_date)


def _note(dag_run: Any) -> str:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        return DagRun.find(dag_id=dag_run.dag_id, run_id=dag_run.run_id, session=session)[0].note or ""


def _try_numbers(dag_run: Any) -> dict[str, int]:
    return {ti.task_id: ti.try_number for ti in dag_run.get_task_instances()}


def _assert_resumed_to_the_uninterrupted_weights(configs: Path, steady: str, resumed: str, crash_after: int):
    """Both pipelines run; the killed one's retry resumed from ``crash_after`` and registered the uninterrupted
    run's weights, and both became their model's champion. Returns both DAG runs (uninterrupted, resumed)."""
    import mlflow

    from trainpipe.settings import Settings
    from trainpipe.state.run_folder import run_dir_for

    client = mlflow.MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
    steady_run, states = _run(configs, steady)
    assert steady_run.state == "success" and states["promote"] == "success", (states, _note(steady_run))
    assert _try_numbers(steady_run)["train"] == 1
    resumed_run, states = _run(configs, resumed)
    assert resumed_run.state == "success" and states["promote"] == "success", (states, _note(resumed_run))
    assert _try_numbers(resumed_run)["train"] == 2
    assert states["watch_checkpoints"] == "success", states

    steady_trained, resumed_trained = task_result(steady_run, "train"), task_result(resumed_run, "train")
    assert resumed_trained["global_step"] == steady_trained["global_step"] > crash_after, (steady_trained,
                                                                                          resumed_trained)
    result = json.loads((run_dir_for(resumed, Settings.from_env(), resumed_run.run_id) / "output" / "result.json")
                        .read_text())
    assert result["resumed_from_step"] == crash_after
    (run,) = client.search_runs([client.get_experiment_by_name(f"trainpipe/{resumed}").experiment_id],
                                filter_string=f"tags.`trainpipe.airflow_run_id` = '{resumed_run.run_id}'")
    assert run.data.tags["resumed_from_step"] == str(crash_after)
    assert run.data.tags["trainpipe.model_family"] == "transformer"

    steady_version = client.get_model_version_by_alias(steady, "champion")
    resumed_version = client.get_model_version_by_alias(resumed, "champion")
    assert resumed_version.tags["weights_sha256"] == resumed_trained["weights_sha256"]
    assert resumed_version.tags["weights_sha256"] == steady_version.tags["weights_sha256"]
    return steady_run, resumed_run


@pytest.fixture(scope="module")
def causal_lm_runs(configs: Path) -> tuple[Any, Any]:
    """ticket_assistant run uninterrupted (``lm_steady``) and killed after step LM_CRASH_AFTER then retried
    (``lm_resumed``), both checked to end on the same registered weights."""
    return _assert_resumed_to_the_uninterrupted_weights(configs, "lm_steady", "lm_resumed", LM_CRASH_AFTER)


def test_a_zero3_causal_lm_killed_after_a_checkpoint_resumes_to_the_uninterrupted_weights_and_serves(
        causal_lm_runs: tuple[Any, Any], state_dir: Path) -> None:
    import mlflow
    import pandas as pd

    steady_run, resumed_run = causal_lm_runs
    evaluation = task_result(resumed_run, "evaluate")
    candidate = evaluation["candidate"]
    # No linear baseline for a language model, and no champion before the first version.
    assert evaluation["baseline"] is None and evaluation["champion"] is None, evaluation
    assert set(candidate) >= {"perplexity", "token_accuracy", "loss"}, candidate
    assert candidate["perplexity"] <= 20, candidate
    # Each completion is three targets (" queue", "." and the end token); the last two are learnt first, so
    # above 2/3 some rows' queue is named right too.
    assert candidate["token_accuracy"] >= TOKEN_ACCURACY_FLOOR, candidate
    # The same weights score the same holdout the same way.
    assert task_result(steady_run, "evaluate")["candidate"] == candidate

    model = mlflow.pyfunc.load_model("models:/lm_resumed@champion")
    rows = pd.read_parquet(state_dir / "storage" / FOLDER / "instructions.parquet").tail(8)
    generated = model.predict(rows[["prompt"]])
    assert list(generated.columns) == ["completion"]
    completions = generated["completion"].tolist()
    assert all(isinstance(text, str) and text.strip() for text in completions), completions
    # The fine-tune taught the answer's form: a queue and a full stop (3 epochs do not yet pick the right one).
    assert {text.strip() for text in completions} <= {f"{queue}." for queue in QUEUES}, completions
    scored = model.predict(rows[["prompt", "completion"]], params={"score": "token_loss"})
    assert list(scored.columns) == ["loss_sum", "tokens", "correct"]
    assert (scored["tokens"] == 3).all() and (scored["loss_sum"] > 0).all(), scored
    assert ((0 <= scored["correct"]) & (scored["correct"] <= scored["tokens"])).all(), scored


# Measured 0.760 (torch 2 on CPU, 3 epochs): 2/3 is the answer's form alone.
TOKEN_ACCURACY_FLOOR = 0.7


def test_a_worse_causal_lm_stops_at_the_perplexity_gate_and_the_champion_stays(
        causal_lm_runs: tuple[Any, Any], configs: Path) -> None:
    import mlflow

    from trainpipe.steps.evaluate.evaluate import PERPLEXITY_GATE

    client = mlflow.MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
    champion = client.get_model_version_by_alias("lm_steady", "champion")
    # One epoch at a thousandth of the learning rate: the random model barely moves. Without the absolute gate
    # the champion's perplexity is what stops it.
    (configs / "lm_steady.yaml").write_text(_assistant_spec("lm_steady", extra=(
        ("  epochs: 3\n", "  epochs: 1\n"), ("learning_rate: 0.002", "learning_rate: 0.000002"),
        ("    - perplexity <= 20\n", ""))))
    worse, states = _run(configs, "lm_steady", END + timedelta(hours=1))
    assert states["gate"] == "success" and states["register"] == "skipped", states
    assert states["promote"] == "skipped", states

    evaluation = task_result(worse, "evaluate")
    assert not evaluation["gates_passed"]
    first = evaluation["gates"][0]
    assert first["gate"] == PERPLEXITY_GATE and not first["passed"], evaluation["gates"]
    candidate, bar = first["value"], first["baseline"]
    assert candidate > bar * 2, first
    assert candidate == pytest.approx(evaluation["candidate"]["perplexity"])
    assert bar == pytest.approx(evaluation["champion"]["perplexity"])
    assert first["note"] == (f"the candidate's holdout perplexity {candidate:.4f} is worse than the champion's "
                             f"{bar:.4f}"), first
    # The bar is the champion's own holdout perplexity: the window holds the same rows, so the same snapshot.
    assert bar == pytest.approx(task_result(causal_lm_runs[0], "evaluate")["candidate"]["perplexity"])
    gates_line = _note(worse).splitlines()[0]
    assert gates_line.startswith("gates failed (") and gates_line.endswith("; nothing registered"), gates_line
    assert f"{candidate:.4f}" in gates_line and f"{bar:.4f}" in gates_line, gates_line
    assert client.get_model_version_by_alias("lm_steady", "champion").version == champion.version
    assert len(client.search_model_versions("name = 'lm_steady'")) == 1


def test_a_ddp_transformer_classifier_killed_after_a_checkpoint_resumes_to_the_uninterrupted_weights_and_serves(
        configs: Path, state_dir: Path) -> None:
    import mlflow
    import pandas as pd

    _, resumed_run = _assert_resumed_to_the_uninterrupted_weights(configs, "intent_steady", "intent_resumed",
                                                                  INTENT_CRASH_AFTER)
    evaluation = task_result(resumed_run, "evaluate")
    assert evaluation["candidate"]["accuracy"] >= INTENT_ACCURACY_FLOOR, evaluation["candidate"]

    model = mlflow.pyfunc.load_model("models:/intent_resumed@champion")
    rows = pd.read_parquet(state_dir / "storage" / FOLDER / "tickets.parquet").tail(200)
    served = model.predict(rows[["subject", "body"]])
    assert list(served.columns) == ["label", *(f"probability_{queue}" for queue in QUEUES)]
    assert set(served["label"]) <= set(QUEUES)
    assert served.filter(like="probability_").sum(axis=1).round(5).eq(1.0).all()
    assert (served["label"] == rows["queue"].to_numpy()).mean() >= INTENT_ACCURACY_FLOOR
    typed = model.predict(pd.DataFrame({"subject": ["I was CHARGED TWICE!!"],
                                        "body": ["My card was charged twice for one invoice, refund please."]}))
    assert typed["label"].iloc[0] == typed.filter(like="probability_").idxmax(axis=1).iloc[0].removeprefix(
        "probability_"), typed


# Measured 0.940 on the holdout and 0.955 served on the last 200 tickets (3 epochs).
INTENT_ACCURACY_FLOOR = 0.85
