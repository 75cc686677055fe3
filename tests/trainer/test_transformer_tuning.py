"""Tuning the transformer's own parameters in the trainer (issue 53): a trial's ``max_length`` and ``lora_r``
land in ``model.params`` (created where the config leaves them out) and nothing else changes; a trial worker
reuses its data only for a trial with the ``max_length`` it was read with, and a trial with another one reads
its own tokenised splits (kept beside the snapshot, so a later trial with that length reads them back)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from trainpipe_trainer.config import (
    CheckpointConfig,
    FeatureTransform,
    ModelConfig,
    SearchDimension,
    TrainingConfig,
    TuningTrial,
    apply_trial_params,
)

SPACE = (
    SearchDimension(name="max_length", target=("model", "params", "max_length"), distribution="choice",
                    choices=("16", "24")),
    SearchDimension(name="lora_r", target=("model", "params", "lora", "r"), distribution="int", low=1, high=16),
    SearchDimension(name="learning_rate", target=("learning_rate",), distribution="log_uniform", low=1e-4, high=1e-2),
)


def _config(root: Path, **params: object) -> TrainingConfig:
    return TrainingConfig(
        pipeline_id="p", task="multiclass_classification", train_data_uri=str(root / "snapshot" / "train.parquet"),
        dataset_digest="d" * 64, features=("subject", "body"), label="label", label_classes=("billing", "tech"),
        transforms=(FeatureTransform(feature="subject", type="text"), FeatureTransform(feature="body", type="text")),
        model=ModelConfig(type="transformer", params=dict(params), pretrained_uri=(root / "tiny-gpt2").as_uri()),
        checkpoint=CheckpointConfig(root_uri=str(root / "ckpt"), validation_fraction=0.2),
        output_uri=str(root / "out"))


@pytest.mark.parametrize("lora", [{}, {"lora": None}, {"lora": {"r": 4, "alpha": 8}}])
def test_a_trials_max_length_and_lora_rank_land_in_model_params(tmp_path, lora):
    config = _config(tmp_path, max_length=64, trainable="lora", **lora)
    before = config.to_json()

    trial = apply_trial_params(config, SPACE, {"max_length": "24", "lora_r": 12, "learning_rate": 0.001})

    kept = lora.get("lora") or {}
    assert trial.model.params == {"max_length": 24, "trainable": "lora", "lora": {**kept, "r": 12}}
    assert trial.learning_rate == 0.001
    # The config it came from is as it was, and the trial's differs in those three values only.
    assert config.to_json() == before
    assert dataclasses.replace(trial, model=config.model, learning_rate=config.learning_rate) == config
    assert TrainingConfig.from_json(trial.to_json()) == trial


def test_a_trial_without_the_family_names_leaves_params_as_they_are(tmp_path):
    config = _config(tmp_path, max_length=64)

    assert apply_trial_params(config, SPACE, {"learning_rate": 0.002}).model == config.model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers", reason="pip install 'trainpipe-trainer[transformers]'")
    from trainpipe_trainer.models.transformer.tiny import write_tiny_model

    root = tmp_path_factory.mktemp("tuned-transformer")
    rng = np.random.default_rng(0)
    words = ["refund", "invoice", "charge", "crash", "error", "screen", "update", "slow", "please", "help"]
    frame = pd.DataFrame({"subject": [" ".join(rng.choice(words, 3)) for _ in range(40)],
                          "body": [" ".join(rng.choice(words, 30)) for _ in range(40)],
                          "label": ["billing", "tech"] * 20})
    (root / "snapshot").mkdir()
    frame.to_parquet(root / "snapshot" / "train.parquet")
    write_tiny_model(root / "tiny-gpt2", [*frame["subject"], *frame["body"]], seed=0, vocab_size=128, n_positions=64)
    return root


def test_a_trial_worker_reads_again_only_for_another_max_length(tiny, capsys):
    from trainpipe_trainer.data.memory import load_training_data
    from trainpipe_trainer.data.splits import read_in_background
    from trainpipe_trainer.trial_worker import Assignment, TrialData, data_read_with, trial_config

    worker = dataclasses.replace(_config(tiny, max_length=16, trainable="lora"), tuning=TuningTrial(
        storage="journal.log", study_name="s", trial_number=-1, metric="validation_loss", direction="minimize", pruner="none",
        pruner_options={}, worker=_worker(tiny)))
    from trainpipe_trainer.models import text_tokenizer_of

    held = TrialData(read_with=data_read_with(worker), pending=read_in_background(worker, text_tokenizer_of))
    trials = [trial_config(worker, Assignment(number=n, params=params, mlflow_run_id=None), first=n == 0)
              for n, params in enumerate([{"max_length": "24", "lora_r": 2}, {"max_length": "24", "lora_r": 8},
                                          {"max_length": "16", "lora_r": 8}, {"max_length": "24", "lora_r": 4}])]

    # Trial 0 draws 24: the background read (16 tokens per column) is not its data; it reads and tokenises its own.
    data, pending = held.for_trial(trials[0])
    assert (data, pending) == (None, None)
    first = load_training_data(trials[0], pending)
    assert first.dataset.tensors[0].shape[1] == 2 * 24
    held.keep(first)
    # Trial 1 has the same max_length (another LoRA rank): the very same tensors.
    data, pending = held.for_trial(trials[1])
    assert data is first and pending is None
    # Trial 2 draws 16: read again, from the cache the worker's background read wrote.
    capsys.readouterr()
    data, pending = held.for_trial(trials[2])
    assert (data, pending) == (None, None)
    second = load_training_data(trials[2], pending)
    assert second.dataset.tensors[0].shape[1] == 2 * 16
    assert "tokenised splits read from" in capsys.readouterr().out
    held.keep(second)
    # Trial 3 draws 24 again: not trial 2's data; the tokenised splits trial 0 kept are read back.
    data, pending = held.for_trial(trials[3])
    assert (data, pending) == (None, None)
    third = load_training_data(trials[3], pending)
    assert "tokenised splits read from" in capsys.readouterr().out
    assert all(np.array_equal(a, b) for a, b in zip(third.split.train, first.split.train, strict=True))


def test_a_trial_that_stopped_before_its_read_leaves_the_background_read_to_the_next(tmp_path):
    from trainpipe_trainer.trial_worker import TrialData

    config = _config(tmp_path, max_length=16)
    pending = object()  # what the launch's background read returned: handed on untouched
    held = TrialData(read_with=16, pending=pending)  # type: ignore[arg-type]
    assert held.for_trial(config) == (None, pending)
    held.keep(None)
    assert held.for_trial(config) == (None, pending)


def _worker(root: Path):
    from trainpipe_trainer.config import TrialWorker

    return TrialWorker(worker=0, n_trials=4, sampler="random", seed=0, space=SPACE,
                       trials_root_uri=str(root / "trials"), parent_run_id="r", experiment_id="0")
