"""The tuned example's plan: the search between validate and train, its space, and a trial's parameters
applied to the trainer config (a layer-list choice travels through Optuna as JSON text)."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path

import pytest

from trainpipe.factory import compile_directory
from trainpipe.plan import TUNING_TASKS, with_trial_params
from trainpipe_trainer.config import TrainingConfig, TuningTrial
from trainpipe_trainer.tuning import progress_percent, storage_for_config

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def plan():
    return compile_directory(REPO / "dag_configs").plans["fraud_detector_tuned"]


def test_the_search_runs_between_validate_and_train(plan):
    upstream = {t.task_id: t.upstream for t in plan.tasks}
    assert [upstream[t] for t in (*TUNING_TASKS, "train")] == [("validate",), ("create_study",), ("trials",),
                                                               ("pick_best",)]
    trials = plan.task("trials")
    assert (trials.mapped_slots, trials.max_active_per_run) == (12, 2)
    assert plan.task("pick_best").trigger_rule == "all_done"
    assert plan.tuning.timeout == timedelta(hours=2)
    assert {d.name: d.distribution for d in plan.tuning.space} == {
        "learning_rate": "log_uniform", "batch_size": "choice", "warmup_steps": "int", "dropout": "uniform",
        "hidden_layers": "choice"}


def test_a_trials_parameters_land_in_the_trainer_config(plan):
    params = {"learning_rate": 0.01, "batch_size": 128, "warmup_steps": 7, "dropout": 0.2,
              "hidden_layers": "[64, 32]"}
    trainer = with_trial_params(plan, params, trial_epochs=True).trainer
    assert (trainer.learning_rate, trainer.batch_size, trainer.optimization.warmup_steps) == (0.01, 128, 7)
    assert trainer.model.dropout == 0.2 and trainer.model.hidden_layers == (64, 32)
    assert trainer.epochs == plan.tuning.trial_epochs == 2
    # The final training keeps the full budget.
    assert with_trial_params(plan, params).trainer.epochs == plan.trainer.epochs == 6


def test_the_trial_block_round_trips_and_keeps_passwords_out_of_the_config(plan):
    tuning = TuningTrial(storage=storage_for_config("postgresql+psycopg2://airflow:secret@db:5432/optuna"),
                         study_name="s", trial_number=3, pruner="hyperband", pruner_options={"min_resource": 10})
    config = TrainingConfig.from_json(dataclasses.replace(plan.trainer, tuning=tuning).to_json())
    assert config.tuning == tuning and config.tuning.storage == ""
    assert "secret" not in config.to_json()
    # Tuning never changes what a checkpoint records: a trial's resume identity is the training's.
    assert config.resume_identity(world_size=1) == plan.trainer.resume_identity(world_size=1)


def test_trials_report_at_percent_of_their_budget():
    assert [progress_percent(s, 90) for s in (1, 9, 45, 90)] == [1, 10, 50, 100]
