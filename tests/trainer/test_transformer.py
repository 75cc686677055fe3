"""The transformer family under the harness, from a tiny GPT-2 written by the test (nothing downloads): a
sequence classifier (two text columns, 3 classes) under DDP and a causal LM (prompt -> completion) under
DeepSpeed ZeRO-3, each with 2 CPU ranks under torchrun; a rank SIGKILLed after a commit resumes to the
uninterrupted run's weights bit for bit; the logged models answer raw text.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from trainpipe_trainer.outcomes import PREEMPTED_EXIT_CODE, preempted_step

from .helpers import Launch, committed_steps, launch, resumes_to, start, wait_until

pytestmark = pytest.mark.integration
pytest.importorskip("transformers", reason="pip install 'trainpipe-trainer[transformers]'")

QUEUES = ("billing", "tech", "account")
WORDS = {"billing": ["refund", "invoice", "charge", "bill", "payment", "price"],
         "tech": ["crash", "error", "screen", "update", "slow", "bug"],
         "account": ["login", "password", "email", "profile", "locked", "name"]}
CHECKPOINT_EVERY = 5
MAX_LENGTH = 24


@dataclass(frozen=True)
class Tables:
    tickets: Path
    prompts: Path
    pretrained: Path


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> Tables:
    from trainpipe_trainer.models.transformer.tiny import write_tiny_model

    rng = np.random.default_rng(0)
    rows = []
    for index in range(300):
        queue = QUEUES[index % 3]
        words = rng.choice(WORDS[queue], size=5)
        rows.append({"subject": " ".join(words[:2]), "body": "please help: " + " ".join(words[2:]), "label": queue,
                     "prompt": "route " + " ".join(words[:3]) + " to", "answer": f" {queue}"})
    frame = pd.DataFrame(rows)
    root = tmp_path_factory.mktemp("transformer-data")
    paths = Tables(tickets=root / "tickets.parquet", prompts=root / "prompts.parquet", pretrained=root / "tiny-gpt2")
    frame[["subject", "body", "label"]].to_parquet(paths.tickets)
    frame[["prompt", "answer"]].to_parquet(paths.prompts)
    texts = [*(frame["subject"] + " " + frame["body"]), *(frame["prompt"] + frame["answer"])]
    write_tiny_model(paths.pretrained, texts, seed=0, vocab_size=512, n_positions=64)
    return paths


def _classifier(make_config: Callable[..., Any], workdir: Path, tables: Tables) -> dict[str, Any]:
    return make_config(
        workdir, train_data=tables.tickets, features=("subject", "body"), task="multiclass_classification",
        label_classes=list(QUEUES), transforms=[{"feature": "subject", "type": "text"}, {"feature": "body", "type": "text"}],
        model={"type": "transformer", "params": {"max_length": MAX_LENGTH}, "pretrained_uri": tables.pretrained.as_uri()},
        epochs=3, batch_size=16, learning_rate=0.003, checkpoint={"every_n_steps": CHECKPOINT_EVERY})


def _causal_lm(make_config: Callable[..., Any], workdir: Path, tables: Tables) -> dict[str, Any]:
    return make_config(
        workdir, train_data=tables.prompts, features=("prompt",), task="causal_lm", label="answer",
        transforms=[{"feature": "prompt", "type": "text"}],
        model={"type": "transformer", "params": {"max_length": MAX_LENGTH, "max_new_tokens": 4},
               "pretrained_uri": tables.pretrained.as_uri()},
        epochs=3, batch_size=16, learning_rate=0.003, checkpoint={"every_n_steps": CHECKPOINT_EVERY},
        strategy="deepspeed", deepspeed={"zero_stage": 3})


def _ok(run: Launch) -> dict[str, Any]:
    assert run.returncode == 0, run.describe()
    return run.result()


def _resumes_to(reference: Launch, config: dict[str, Any], workdir: Path) -> None:
    resumes_to(reference, config, workdir, checkpoint_every=CHECKPOINT_EVERY, step_delay_seconds=0.3)


@pytest.fixture(scope="module")
def classifier_run(tmp_path_factory: pytest.TempPathFactory, tables: Tables, make_config: Callable[..., Any]) -> Launch:
    workdir = tmp_path_factory.mktemp("transformer-ddp")
    return launch(_classifier(make_config, workdir, tables), workdir, nproc=2)


@pytest.fixture(scope="module")
def causal_lm_run(tmp_path_factory: pytest.TempPathFactory, tables: Tables, make_config: Callable[..., Any]) -> Launch:
    pytest.importorskip("deepspeed", reason="pip install 'trainpipe-trainer[deepspeed]'")
    workdir = tmp_path_factory.mktemp("transformer-zero3")
    return launch(_causal_lm(make_config, workdir, tables), workdir, nproc=2)


def test_the_classifier_serves_class_probabilities_for_raw_text_and_records_its_weights(
        classifier_run: Launch, tables: Tables, tracking: Any, use_tracking: str) -> None:
    import mlflow
    from mlflow import MlflowClient

    from trainpipe_trainer.models.transformer.pretrained import folder_sha256

    result = _ok(classifier_run)
    # The task log is the trainer's: no load report, progress bar or library warning.
    assert "LOAD REPORT" not in classifier_run.stdout + classifier_run.stderr
    assert "Warning" not in classifier_run.stderr, classifier_run.stderr[-3000:]
    model = mlflow.pyfunc.load_model(result["model_uri"])
    probe = pd.DataFrame({"subject": ["refund invoice", "crash bug", "password locked"],
                          "body": ["please help: charge bill price", "please help: screen update slow",
                                   "please help: login email profile"]})
    served = model.predict(probe)
    assert list(served.columns) == ["label", *(f"probability_{q}" for q in QUEUES)]
    np.testing.assert_allclose(served.iloc[:, 1:].sum(axis=1), 1.0, rtol=1e-6)
    assert served["label"].tolist() == list(QUEUES)
    run = MlflowClient(tracking.uri).get_run(result["mlflow_run_id"])
    assert run.data.tags["trainpipe.model_family"] == "transformer"
    assert run.data.tags["trainpipe.pretrained_uri"] == tables.pretrained.as_uri()
    assert run.data.tags["trainpipe.pretrained_sha256"] == folder_sha256(tables.pretrained)
    assert run.data.metrics["validation_accuracy"] > 0.9


def test_a_classifier_rank_killed_after_a_commit_resumes_to_the_uninterrupted_weights(
        classifier_run: Launch, tmp_path: Path, tables: Tables, make_config: Callable[..., Any]) -> None:
    _resumes_to(classifier_run, _classifier(make_config, tmp_path, tables), tmp_path)


def test_sigterm_to_every_classifier_rank_commits_its_step_and_the_rerun_ends_on_the_uninterrupted_weights(
        classifier_run: Launch, tmp_path: Path, tables: Tables, make_config: Callable[..., Any]) -> None:
    """What a preempted pod gets: every rank finishes the step in progress, commits it and exits preempted; the
    rerun resumes from that step and ends bit for bit where the uninterrupted run did."""
    import os
    import re
    import signal

    config = _classifier(make_config, tmp_path, tables)
    running = start({**config, "fault_injection": {"step_delay_seconds": 0.3}}, tmp_path, nproc=2,
                    runner="trainpipe_trainer.elastic")
    try:
        wait_until(lambda: max(map(int, re.findall(r"^step (\d+)/", running.stdout_so_far(), re.MULTILINE)),
                               default=0) >= 10, timeout=300, what="step 10", running=running)
        for rank in (0, 1):
            os.kill(running.rank_pid(rank), signal.SIGTERM)
        stopped = running.wait(timeout=300)
    finally:
        running.stop()
    assert stopped.returncode == PREEMPTED_EXIT_CODE, stopped.describe()
    [step] = [preempted_step(line) for line in stopped.stdout.splitlines() if preempted_step(line) is not None]
    assert committed_steps(tmp_path / "checkpoints")[-1] == step
    assert not (tmp_path / "output" / "result.json").exists()
    rerun = launch(config, tmp_path, nproc=2)
    result = _ok(rerun)
    assert f"resumed from step {step}" in rerun.stdout
    assert result["weights_sha256"] == _ok(classifier_run)["weights_sha256"]


def test_a_causal_lm_checkpoint_of_two_ranks_resumes_on_one_and_sees_every_remaining_row_once(
        tmp_path: Path, tables: Tables, make_config: Callable[..., Any]) -> None:
    """Elastic resume, as after losing a node: a causal LM under DDP crashed at step 7 on 2 ranks continues on 1; its
    model and optimizer state are resharded and the epoch goes on at the row it stopped at. (DeepSpeed's ZeRO
    state resumes at its own world size only, and says so: the harness's rule for every family.)"""
    import math
    import re

    config = {**_causal_lm(make_config, tmp_path, tables), "strategy": "ddp", "deepspeed": None,
              "fault_injection": {"crash_after_step": 7}}
    crashed = launch(config, tmp_path, nproc=2)
    assert committed_steps(tmp_path / "checkpoints")[-1] == 7, crashed.describe()

    config["fault_injection"] = None
    resumed = launch(config, tmp_path, nproc=1)
    result = _ok(resumed)
    rows = int(re.search(r"of (\d+) \(nothing skipped or repeated\)", resumed.stdout)[1])
    batch, done = config["batch_size"], 7 * 2 * config["batch_size"]
    assert (f"resharded: checkpoint step-7 was written by 2 processes, this run has 1; model and optimizer state "
            f"loaded across them, and epoch 1 continues at its row {done} of {rows} (nothing skipped or repeated)"
            in resumed.stdout.splitlines()), resumed.describe()
    # The rest of epoch 1 on one rank, then epochs 2 and 3 whole: every row once per epoch.
    assert result["global_step"] == 7 + math.ceil((rows - done) / batch) + 2 * math.ceil(rows / batch)
    assert result["world_size_history"] == [[0, 2], [7, 1]]


def test_the_causal_lm_under_zero3_serves_a_completion_and_token_losses(
        causal_lm_run: Launch, tables: Tables, tracking: Any, use_tracking: str) -> None:
    import mlflow
    from mlflow import MlflowClient

    result = _ok(causal_lm_run)
    run = MlflowClient(tracking.uri).get_run(result["mlflow_run_id"])
    metrics = run.data.metrics
    assert metrics["validation_perplexity"] == pytest.approx(np.exp(metrics["validation_loss"]))
    assert 0 < metrics["validation_token_accuracy"] <= 1
    model = mlflow.pyfunc.load_model(result["model_uri"])
    prompts = pd.DataFrame({"prompt": ["route refund invoice charge to", "route crash error bug to"]})
    generated = model.predict(prompts)
    assert list(generated.columns) == ["completion"]
    assert all(isinstance(text, str) for text in generated["completion"])
    pd.testing.assert_frame_equal(model.predict(prompts), generated)  # greedy: the same every time
    rows = prompts.assign(answer=[" billing", " tech"])
    scored = model.predict(rows, params={"score": "token_loss"})
    assert list(scored.columns) == ["loss_sum", "tokens", "correct"]
    assert (scored["loss_sum"] > 0).all() and (scored["correct"] <= scored["tokens"]).all()
    # The completion's tokens and the end token are the targets.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tables.pretrained)
    expected = [len(tokenizer(a, add_special_tokens=False)["input_ids"]) + 1 for a in rows["answer"]]
    assert scored["tokens"].tolist() == expected


def test_a_zero3_causal_lm_rank_killed_after_a_commit_resumes_to_the_uninterrupted_weights(
        causal_lm_run: Launch, tmp_path: Path, tables: Tables, make_config: Callable[..., Any]) -> None:
    _resumes_to(causal_lm_run, _causal_lm(make_config, tmp_path, tables), tmp_path)


def test_lora_under_zero2_in_bf16_trains_a_binary_classifier_served_without_peft(
        tmp_path: Path, tables: Tables, make_config: Callable[..., Any], use_tracking: str) -> None:
    pytest.importorskip("deepspeed", reason="pip install 'trainpipe-trainer[deepspeed]'")
    import mlflow

    frame = pd.read_parquet(tables.tickets)
    binary = tmp_path / "binary.parquet"
    frame.assign(label=(frame["label"] == "billing").astype("int64")).to_parquet(binary)
    config = {**_classifier(make_config, tmp_path, tables), "task": "binary_classification",
              "train_data_uri": str(binary), "strategy": "deepspeed", "deepspeed": {"zero_stage": 2},
              "optimization": {"precision": "bf16"}, "learning_rate": 0.01,
              "model": {"type": "transformer", "pretrained_uri": tables.pretrained.as_uri(),
                        "params": {"max_length": MAX_LENGTH, "trainable": "lora", "lora": {"r": 4}}}}
    del config["label_classes"]
    result = _ok(launch(config, tmp_path, nproc=2))
    model = mlflow.pyfunc.load_model(result["model_uri"])
    served = model.predict(frame[["subject", "body"]].head(30))
    assert served.shape == (30,) and ((served > 0) & (served < 1)).all()
    # The adapters are merged: the served folder is a plain model, no adapter files.
    folder = Path(mlflow.artifacts.download_artifacts(result["model_uri"])) / "artifacts" / "model"
    assert (folder / "model.safetensors").is_file() and not list(folder.glob("adapter_*"))


def test_a_zero2_classifier_rank_killed_after_a_commit_resumes_to_the_uninterrupted_weights(
        tmp_path: Path, tables: Tables, make_config: Callable[..., Any]) -> None:
    """ZeRO-2 (gradients and optimizer state sharded), as for every family: the classifier's config under
    DeepSpeed, its uninterrupted run the reference."""
    pytest.importorskip("deepspeed", reason="pip install 'trainpipe-trainer[deepspeed]'")

    def zero2(workdir: Path) -> dict[str, Any]:
        workdir.mkdir()
        return {**_classifier(make_config, workdir, tables), "strategy": "deepspeed", "deepspeed": {"zero_stage": 2}}

    reference = launch(zero2(tmp_path / "steady"), tmp_path / "steady", nproc=2)
    _resumes_to(reference, zero2(tmp_path / "killed"), tmp_path / "killed")
