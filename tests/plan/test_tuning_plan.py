"""The tuned example's plan: the search between validate and train, its space, and a trial's parameters
applied to the trainer config (a layer-list choice travels through Optuna as JSON text); the pruner's
forms and the tuned metric carried from the spec through the plan to the trainer's config."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from tests.support import REPO
from trainpipe.compile.compiler import compile_directory
from trainpipe.plan.params import with_trial_params
from trainpipe.plan.steps import TUNING_TASKS
from trainpipe.settings import Settings
from trainpipe.spec.sections.tuning import DEFAULT_PRUNER, PRUNER_DEFAULTS
from trainpipe_trainer.config import CHECKPOINT_METRICS, TrainingConfig, TuningTrial
from trainpipe_trainer.resume import resume_identity
from trainpipe_trainer.tuning import make_pruner, progress_percent, storage_for_config


@pytest.fixture(scope="module")
def plan():
    return compile_directory(REPO / "dag_configs", settings=Settings.from_env()).plans["fraud_detector_tuned"]


def test_the_search_runs_between_validate_and_train(plan):
    upstream = {t.task_id: t.upstream for t in plan.tasks}
    assert [upstream[t] for t in (*TUNING_TASKS, "train")] == [("validate",), ("create_study",), ("trials",),
                                                               ("pick_best",)]
    trials = plan.task("trials")
    # One trial worker per parallel trial (max_parallel 2), not one task per trial (n_trials 12).
    assert (trials.mapped_slots, trials.max_active_per_run) == (2, 2)
    assert plan.tuning.n_trials == 12
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
    assert resume_identity(config, world_size=1) == resume_identity(plan.trainer, world_size=1)


def test_trials_report_at_percent_of_their_budget():
    assert [progress_percent(s, 90) for s in (1, 9, 45, 90)] == [1, 10, 50, 100]


def _tuned(tuning: dict, *, task: str = "binary_classification") -> dict:
    import yaml

    spec = yaml.safe_load((REPO / "dag_configs" / "fraud_detector_tuned.yaml").read_text())
    spec["tuning"] = {"n_trials": 8, "space": {"learning_rate": {"log_uniform": [0.0001, 0.1]}}, **tuning}
    if task == "regression":
        spec["training"]["task"] = "regression"
        spec["training"]["label"] = "amount"
        spec["training"]["features"].remove("amount")
        spec["evaluation"] = {"metrics": ["rmse"], "gates": ["rmse <= 100"]}
    return spec


def _plan_of(spec: dict):
    import yaml

    from trainpipe.plan.build import build_plan
    from trainpipe.spec.loader import load_yaml_text
    from trainpipe.spec.validate import validate_loaded

    text = yaml.safe_dump(spec, sort_keys=False)
    return build_plan(validate_loaded(load_yaml_text(text, "tuned.yaml")), spec_file="tuned.yaml", spec_text=text)


@pytest.mark.parametrize(("pruner", "name", "arguments"), [
    # Today's short forms: a bare name (or nothing) is that pruner with its measured defaults.
    (None, DEFAULT_PRUNER, PRUNER_DEFAULTS[DEFAULT_PRUNER]),
    ("none", "none", {}),
    ("successive_halving", "successive_halving", PRUNER_DEFAULTS["successive_halving"]),
    # The mapping: given options over the defaults; median's warm-up is Optuna's n_warmup_steps.
    ({"type": "successive_halving", "min_resource": 5, "reduction_factor": 4},
     "successive_halving", {**PRUNER_DEFAULTS["successive_halving"], "min_resource": 5, "reduction_factor": 4}),
    ({"type": "hyperband", "min_resource": 20}, "hyperband", {**PRUNER_DEFAULTS["hyperband"], "min_resource": 20}),
    ({"type": "median", "min_resource": 20}, "median",
     {"n_startup_trials": PRUNER_DEFAULTS["median"]["n_startup_trials"], "n_warmup_steps": 20}),
])
def test_pruner_forms_reach_the_trainer_as_optuna_arguments(pruner, name, arguments):
    spec = _tuned({} if pruner is None else {"pruner": pruner})
    plan = _plan_of(spec)
    assert (plan.tuning.pruner, plan.tuning.pruner_options) == (name, arguments)
    # The trainer's config carries them (a trial rebuilds the same pruner from it) and builds that pruner.
    trial = TuningTrial(storage="journal.log", study_name="s", trial_number=0, metric=plan.tuning.metric,
                        direction=plan.tuning.direction, pruner=plan.tuning.pruner,
                        pruner_options=dict(plan.tuning.pruner_options))
    config = TrainingConfig.from_json(dataclasses.replace(plan.trainer, tuning=trial).to_json())
    assert (config.tuning.pruner, config.tuning.pruner_options) == (name, arguments)
    optuna_pruner = make_pruner(config.tuning.pruner, config.tuning.pruner_options)
    expected = {"hyperband": "HyperbandPruner", "successive_halving": "SuccessiveHalvingPruner",
                "median": "MedianPruner", "none": "NopPruner"}[name]
    assert type(optuna_pruner).__name__ == expected


def test_successive_halving_judges_each_trial_against_those_that_reached_the_rung():
    """Asynchronous: a trial is judged when it reaches a rung, against the trials that reached it so far,
    while every trial is still running (none waits for the others); with fewer than reduction_factor
    there, only the best goes on."""
    import optuna

    study = optuna.create_study(pruner=make_pruner("successive_halving", {
        "min_resource": 10, "reduction_factor": 3, "min_early_stopping_rate": 0}))
    running = [study.ask() for _ in range(3)]
    for trial, value in zip(running, (0.2, 0.3, 0.9), strict=True):
        trial.report(value, 10)
    assert [t.should_prune() for t in running] == [False, True, True]
    assert all(t.state.name == "RUNNING" for t in study.get_trials())


@pytest.mark.parametrize(("metric", "task", "direction"), [
    ("validation_loss", "binary_classification", "minimize"),
    ("validation_auc", "binary_classification", "maximize"),
    ("validation_accuracy", "binary_classification", "maximize"),
    ("validation_rmse", "regression", "minimize"),
    ("validation_mae", "regression", "minimize"),
])
def test_the_direction_is_the_metrics_own_when_left_out(metric, task, direction):
    plan = _plan_of(_tuned({"metric": metric}, task=task))
    assert (plan.tuning.metric, plan.tuning.direction) == (metric, direction)
    assert CHECKPOINT_METRICS[task][metric] == direction


def test_the_trainer_contract_refuses_what_the_spec_stage_refuses():
    # A hand-written config is checked too: a metric this task's trainer never computes, a pruner
    # argument Optuna's pruner does not take.
    plan = _plan_of(_tuned({}))
    with pytest.raises(ValueError, match=r"tuning.metric: a binary_classification trainer reports .* got 'validation_rmse'"):
        dataclasses.replace(plan.trainer, tuning=TuningTrial(storage="j", study_name="s", trial_number=0,
                                                             metric="validation_rmse"))
    with pytest.raises(ValueError, match=r"tuning.pruner_options: median takes .* got \['reduction_factor'\]"):
        TuningTrial(storage="j", study_name="s", trial_number=0, pruner="median", pruner_options={"reduction_factor": 3})
    with pytest.raises(ValueError, match=r"tuning.pruner_options: whole numbers >= 0"):
        TuningTrial(storage="j", study_name="s", trial_number=0, pruner="hyperband", pruner_options={"min_resource": -1})


def test_a_worker_config_round_trips_and_changes_no_checkpoint(plan):
    from trainpipe_trainer.config import TrialWorker

    worker = TrialWorker(worker=1, n_trials=12, sampler="tpe", seed=7, space=plan.tuning.space,
                         trials_root_uri="file:///runs/p/r/trials", parent_run_id="parent", experiment_id="3",
                         child_tags={"trainpipe.study": "p.r"}, timeout_seconds=7200.0)
    tuning = TuningTrial(storage="journal.log", study_name="p.r", trial_number=-1, worker=worker)
    config = TrainingConfig.from_json(dataclasses.replace(plan.trainer, tuning=tuning).to_json())
    assert config.tuning.worker == worker
    assert resume_identity(config, world_size=1) == resume_identity(plan.trainer, world_size=1)
    # Only a worker has no trial number of its own.
    with pytest.raises(ValueError, match=r"tuning.trial_number: must be >= 0 \(-1 for a trial worker\)"):
        TuningTrial(storage="journal.log", study_name="p.r", trial_number=-1)


def test_a_warm_start_keeps_only_what_todays_space_can_take(plan):
    from trainpipe_trainer.tuning import fits_space

    # The example's space: learning_rate log_uniform [0.0001, 0.1], batch_size {32, 64, 128}, warmup_steps
    # int [0, 200], dropout uniform [0, 0.5], hidden_layers {[32], [64, 32]}.
    champion = {"learning_rate": 0.5, "batch_size": 64, "warmup_steps": 50, "dropout": 0.1,
                "hidden_layers": [64, 32], "weight_decay": 0.01}
    assert fits_space(champion, plan.tuning.space) == {
        "batch_size": 64, "warmup_steps": 50, "dropout": 0.1, "hidden_layers": "[64, 32]"}
    # As Optuna stored them in an earlier study (a layer list as its JSON text): kept as they are.
    assert fits_space({"hidden_layers": "[32]", "batch_size": 48}, plan.tuning.space) == {"hidden_layers": "[32]"}


def test_an_unknown_warm_start_is_a_located_error():
    from trainpipe.errors import SpecError
    from trainpipe.spec.loader import load_yaml_text
    from trainpipe.spec.validate import validate_loaded

    text = (REPO / "dag_configs" / "fraud_detector_tuned.yaml").read_text()
    text = text.replace("tuning:\n", "tuning:\n  warm_start: yesterday\n", 1)
    loaded = load_yaml_text(text, "tuned.yaml")
    with pytest.raises(SpecError) as caught:
        validate_loaded(loaded)
    (problem,) = [p for p in caught.value.problems if p.field_path == "tuning.warm_start"]
    assert problem.line == loaded.location_of(("tuning", "warm_start"))[1]
    assert "champion" in problem.message and "previous_study" in problem.message
