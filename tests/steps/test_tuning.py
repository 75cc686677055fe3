"""The trial workers without Airflow: real torchrun trainers, a real journal-file study, real MLflow (sqlite).

* Two workers run at the same time (two threads, as two Airflow task processes would): each launches
  its trainer once and runs several trials in that one process; the study ends with exactly n_trials
  finished trials, each with its own child run, and pick_best picks the best complete one. The
  progress (done, pruned, running, best so far) is in the workers' log and the fleet view's row.
* The best trial's weights equal a fresh single run's with the same parameters and seed.
* A worker whose trainer dies mid-trial loses that trial only: it is marked failed, the worker
  launches again, and the study still gets its n_trials; a trial an earlier try left RUNNING is failed.
* tuning.warm_start: champion enqueues the champion's parameters as trial 0 (said in the log); a
  pipeline without a champion starts from the sampler; previous_study enqueues the last study's best.
"""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from tests.support import REPO
from trainpipe.demo.synthetic import generate_transactions
from trainpipe.fleet.collect import FleetReader, PipelineFacts, pipeline_row
from trainpipe.fleet.outcome import RunFacts
from trainpipe.fleet.render import fleet_page
from trainpipe.hooks.mlflow import MlflowHook
from trainpipe.plan.build import build_plan
from trainpipe.plan.params import with_trial_params
from trainpipe.settings import Settings
from trainpipe.spec.loader import load_yaml_text
from trainpipe.spec.validate import validate_loaded
from trainpipe.steps.snapshot import take_snapshot
from trainpipe.steps.train.train import RunContext, run_training
from trainpipe.steps.tuning import create_study, load_study, pick_best, run_worker

pytestmark = [pytest.mark.integration, pytest.mark.slow]

END = datetime(2026, 6, 30, tzinfo=UTC)


def tiny_tuned_spec(pipeline_id: str, *, n_trials: int, max_parallel: int, pruner: str | dict = "hyperband",
                    metric: str = "validation_loss") -> dict:
    """The example tuned spec, shrunk: tiny trials on one process each."""
    spec = yaml.safe_load((REPO / "dag_configs" / "fraud_detector_tuned.yaml").read_text())
    spec["pipeline_id"] = pipeline_id
    spec["registration"]["model_name"] = pipeline_id
    spec["data"]["uri"] = f"demo/{pipeline_id}/transactions.parquet"
    spec["retries"] = 0
    spec["training"].update(epochs=2, batch_size=64)
    spec["training"]["checkpoint"] = {"every_n_steps": 5, "keep_last": 1}
    spec["tuning"].update(n_trials=n_trials, max_parallel=max_parallel, trial_epochs=1, pruner=pruner, seed=3,
                          metric=metric)
    spec["tuning"].pop("direction")  # the metric's own
    # Two epochs on 2,500 rows land near the example's auc >= 0.80 on either side (a coin toss seen in CI):
    # these tests are about the search, so the gate only asks for better than chance.
    spec["evaluation"]["gates"] = ["auc >= 0.5"]
    spec["tuning"]["space"] = {
        # Half the range barely learns in one epoch: the pruner has poor trials to stop.
        "learning_rate": {"log_uniform": [0.00001, 0.03]},
        "hidden_layers": {"choice": [[16], [32, 16]]},
    }
    return spec


def write_data(settings: Settings, pipeline_id: str, rows: int = 2500) -> None:
    folder = Path(settings.storage_root.removeprefix("file://")) / "demo" / pipeline_id
    folder.mkdir(parents=True, exist_ok=True)
    generate_transactions(rows=rows, days=20, end=END).to_parquet(folder / "transactions.parquet", index=False)


def compile_plan(spec: dict):
    text = yaml.safe_dump(spec, sort_keys=False)
    loaded = load_yaml_text(text, f"{spec['pipeline_id']}.yaml")
    return build_plan(validate_loaded(loaded), spec_file=f"{spec['pipeline_id']}.yaml", spec_text=text)


def start(spec: dict, airflow_run_id: str = "manual__runner", on_line=None):
    settings = Settings.from_env()
    write_data(settings, spec["pipeline_id"])
    plan = compile_plan(spec)
    snapshot = take_snapshot(plan.dag_id, plan.data, settings=settings, logical_date=END)
    run = RunContext(dag_id=plan.dag_id, airflow_run_id=airflow_run_id, try_number=1,
                     spec_sha256=plan.spec_sha256, git_commit="test")
    hook = MlflowHook(settings)
    study = create_study(plan, settings=settings, run=run, hook=hook, on_line=on_line)
    return plan, snapshot, settings, run, hook, study


@pytest.fixture
def tuned(state_dir: Path):
    # Asynchronous successive halving on the validation AUC (maximised): the parallel trials' pruner,
    # on a metric other than the loss.
    return start(tiny_tuned_spec("tuning_runner", n_trials=6, max_parallel=2, metric="validation_auc",
                                 pruner={"type": "successive_halving", "min_resource": 20, "reduction_factor": 2}))


def test_two_workers_run_the_study_each_several_trials_in_one_process(tuned):
    plan, snapshot, settings, run, hook, study = tuned
    outcomes: dict[int, dict] = {}
    lines: dict[int, list[str]] = {0: [], 1: []}
    errors: list[BaseException] = []

    def worker(number: int) -> None:
        try:
            outcomes[number] = run_worker(plan, number, snapshot, settings=settings, run=run, study=study,
                                          hook=hook, on_line=lines[number].append)
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(n,)) for n in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=1500)
    assert not errors, errors
    live = load_study(plan.tuning, settings, study["study_name"])
    finished = [t for t in live.trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert len(finished) == 6, [(t.number, t.state.name) for t in live.trials]
    assert all(t.state.is_finished() for t in live.trials)
    by_worker = {w: [t for t in finished if t.user_attrs["worker"] == w] for w in (0, 1)}
    # Each worker trained: one launch each (one process for all its trials), several trials in some launch.
    assert all(by_worker.values()), by_worker
    assert max(len(trials) for trials in by_worker.values()) >= 3
    for w, trials in by_worker.items():
        assert len({t.user_attrs["worker_pid"] for t in trials}) == 1
        assert sum("ran" in line and "trials in this launch" in line for line in lines[w]) == 1
        assert sorted(t["number"] for t in outcomes[w]["trials"] if t["state"] != "failed") == sorted(
            t.number for t in trials)
    # Both workers were training at the same time.
    first, second = (min(trials, key=lambda t: t.number) for trials in by_worker.values())
    assert max(first.datetime_start, second.datetime_start) < min(first.datetime_complete, second.datetime_complete)
    # Progress in the log after each trial: done, pruned, running, the best so far.
    progress = [line for w in (0, 1) for line in lines[w] if "trials done" in line]
    assert len(progress) >= 6 and any("best validation_auc" in line for line in progress), progress
    assert f"study {study['study_name']}: 6 of 6 trials done" in lines[0][-1] + lines[1][-1]
    for trial in finished:
        # Reported by the trainer at its checkpoints, at percent-of-trial steps: the AUC, not the loss.
        assert trial.intermediate_values and max(trial.intermediate_values) <= 100
        assert all(0 <= v <= 1 for v in trial.intermediate_values.values())
        assert trial.user_attrs["trainer_seconds"] > 0
    assert live.direction.name == "MAXIMIZE"

    # The fleet view's row of the pipeline, its DAG run still searching: the study's progress from its parent run.
    pipeline = PipelineFacts(pipeline_id=plan.dag_id, owner="ml", team="ml", schedule=None, is_paused=False,
                             last_run=RunFacts(run_id=run.airflow_run_id, state="running", logical_date=END,
                                               start_date=datetime.now(UTC), end_date=None, note=None))
    facts = FleetReader(hook.client).facts([pipeline], wait=True)[plan.dag_id]
    row = pipeline_row(pipeline, facts, now=datetime.now(UTC))
    pruned = sum(t.state.name == "PRUNED" for t in live.trials)
    best_so_far = max(t.value for t in live.trials if t.state.name == "COMPLETE")
    assert row["study"] == {"trials_done": 6.0, "trials_pruned": float(pruned), "trials_running": 0.0,
                            "trials_failed": 0.0, "best_value": pytest.approx(best_so_far), "n_trials": 6,
                            "metric": "validation_auc"}
    page = fleet_page([row], teams=["ml"], team=None, outcome=None, base="/trainpipe")
    assert (f"tuning: 6 of 6 trials done ({pruned} pruned), 0 running; best validation_auc {best_so_far:.4g}"
            in page)

    best = pick_best(plan, settings=settings, study=study, hook=hook)
    assert best["number"] == live.best_trial.number and best["params"] == live.best_trial.params
    client = hook.client
    parent = client.get_run(study["parent_run_id"])
    assert parent.info.status == "FINISHED"
    assert parent.data.metrics["best_value"] == pytest.approx(best["value"])
    assert parent.data.params["tuning.max_parallel"] == "2"
    assert (parent.data.params["tuning.pruner"], parent.data.params["tuning.metric"]) == (
        "successive_halving", "validation_auc")
    assert best["value"] == max(t.value for t in live.trials if t.state.name == "COMPLETE")
    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert sorted(int(c.data.tags["trainpipe.trial_number"]) for c in children) == sorted(t.number for t in finished)
    for child in children:
        number = int(child.data.tags["trainpipe.trial_number"])
        assert child.data.tags["trainpipe.trial_state"] == {"COMPLETE": "complete", "PRUNED": "pruned"}[
            live.trials[number].state.name]
        assert child.data.tags["trainpipe.trial_worker"] == str(live.trials[number].user_attrs["worker"])
        assert json.loads(child.data.tags["trainpipe.trial_params"]) == live.trials[number].params
        assert "trainpipe.airflow_run_id" not in child.data.tags  # the final training's run is found by it
        # The trial's compute as its trainer counted it: the same in the study (what pruning saves is
        # measured by) and in its run, pruned trials too.
        assert live.trials[number].user_attrs["compute_seconds"] == pytest.approx(
            child.data.metrics["trainer_cpu_hours"] * 3600, abs=2e-3)
        assert live.trials[number].user_attrs["compute_seconds"] > 0
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id, "study")}
    assert {"study/optimization_history.png", "study/intermediate_values.png"} <= artifacts
    # No trial logs a model (the final training logs the winner's); the trials' hashes are in the study.
    logged = client.search_logged_models([parent.info.experiment_id])
    assert not {m.source_run_id for m in logged} & {c.info.run_id for c in children}
    assert all(t.user_attrs["weights_sha256"] for t in finished if t.state.name == "COMPLETE")

    # The best trial, trained again by a fresh single launch with the same parameters and seed: same weights.
    fresh = run_training(with_trial_params(plan, best["params"], trial_epochs=True), snapshot, settings=settings,
                         run=RunContext(dag_id=plan.dag_id, airflow_run_id="manual__fresh", try_number=1,
                                        spec_sha256=plan.spec_sha256, git_commit="test"), hook=hook)
    assert fresh.weights_sha256 == live.best_trial.user_attrs["weights_sha256"]
    assert fresh.model_uri and client.get_logged_model(fresh.model_uri.removeprefix("models:/")).source_run_id == (
        fresh.mlflow_run_id)


def test_a_worker_that_dies_mid_trial_loses_only_that_trial(state_dir: Path):
    spec = tiny_tuned_spec("tuning_killed", n_trials=3, max_parallel=1, pruner="none")
    # The first launch's trainer exits abruptly (os._exit) after step 10's checkpoint of its first trial.
    spec["training"]["testing"] = {"crash_first_try_after_step": 10}
    plan, snapshot, settings, run, hook, study = start(spec)
    live = load_study(plan.tuning, settings, study["study_name"])
    # A trial an earlier try of worker 0's task left RUNNING (its process died with the task).
    orphan = live.ask()
    orphan.set_user_attr("worker", 0)
    lines: list[str] = []
    outcome = run_worker(plan, 0, snapshot, settings=settings, run=run, study=study, hook=hook, on_line=lines.append)

    live = load_study(plan.tuning, settings, study["study_name"])
    states = {t.number: t.state.name for t in live.trials}
    assert states[orphan.number] == "FAIL"
    assert "earlier try" in live.trials[orphan.number].user_attrs["fail_reason"]
    killed = [t for t in live.trials if t.number != orphan.number and t.state.name == "FAIL"]
    assert len(killed) == 1, states
    assert "died during it" in killed[0].user_attrs["fail_reason"]
    # The killed trial had reported before it died; the study still completes its n_trials.
    assert killed[0].intermediate_values
    assert sum(s == "COMPLETE" for s in states.values()) == 3
    assert any(f"trial {killed[0].number} of worker 0: lost" in line for line in lines)
    assert any("launching the trainer again" in line for line in lines)
    # Two launches: the killed one and the one that ran the rest.
    assert len({t.user_attrs["worker_pid"] for t in live.trials if "worker_pid" in t.user_attrs}) == 2
    assert [t["state"] for t in outcome["trials"]].count("complete") == 3


def test_warm_start_from_the_champion_enqueues_its_parameters_as_trial_0(state_dir: Path):
    spec = tiny_tuned_spec("tuning_warm", n_trials=2, max_parallel=1, pruner="none")
    spec["tuning"]["warm_start"] = "champion"
    # No champion yet: the search starts from the sampler, as without a warm start.
    lines: list[str] = []
    plan, snapshot, settings, run, hook, study = start(spec, "manual__first", on_line=lines.append)
    assert load_study(plan.tuning, settings, study["study_name"]).trials == []
    assert any("has no champion yet; the search starts from the sampler" in line for line in lines), lines

    # A champion: the registered version of a run trained with these parameters.
    client = hook.client
    trained = client.create_run(hook.experiment_id(plan.dag_id)).info.run_id
    client.log_param(trained, "learning_rate", "0.0042")
    client.log_param(trained, "model.hidden_layers", "[32, 16]")
    client.set_terminated(trained)
    client.create_registered_model(plan.registration.model_name)
    version = client.create_model_version(plan.registration.model_name, f"runs:/{trained}/model", run_id=trained)
    client.set_registered_model_alias(plan.registration.model_name, "champion", version.version)

    lines = []
    plan, snapshot, settings, run, hook, study = start(spec, "manual__second", on_line=lines.append)
    assert (f"warm start (champion): trial 0 enqueued with the parameters of {plan.registration.model_name} version "
            f"{version.version} (champion): " + json.dumps({"hidden_layers": "[32, 16]", "learning_rate": 0.0042},
                                                          sort_keys=True)) in lines
    worker_lines: list[str] = []
    run_worker(plan, 0, snapshot, settings=settings, run=run, study=study, hook=hook, on_line=worker_lines.append)
    live = load_study(plan.tuning, settings, study["study_name"])
    assert live.trials[0].params == {"learning_rate": 0.0042, "hidden_layers": "[32, 16]"}
    assert live.trials[0].state.name == "COMPLETE" and len(live.trials) == 2
    assert any("trial 0 with" in line and "(warm start:" in line for line in worker_lines), worker_lines

    # previous_study: the next run's study starts with this one's complete trials, best first.
    spec["tuning"]["warm_start"] = "previous_study"
    lines = []
    plan, snapshot, settings, run, hook, study = start(spec, "manual__third", on_line=lines.append)
    best_first = sorted((t for t in live.trials if t.state.name == "COMPLETE"), key=lambda t: t.value)
    enqueued = load_study(plan.tuning, settings, study["study_name"]).trials
    # An enqueued trial's parameters are fixed for the worker that asks it (Optuna keeps them as fixed_params).
    assert [t.system_attrs["fixed_params"] for t in enqueued] == [t.params for t in best_first]
    assert [t.state.name for t in enqueued] == ["WAITING"] * len(best_first)
    assert lines[0].startswith(f"warm start (previous_study): trial 0 enqueued with the parameters of trial "
                               f"{best_first[0].number} of study {live.study_name}")


def test_study_plots_rank_parameters_only_with_enough_trials_and_warn_about_nothing(tmp_path: Path):
    """The study's plots land on the MLflow parent run. With one complete trial Optuna can only draw every
    importance equal (and warns, a foreign line in the task log): the run gets no such chart and the task
    log says why; with varied complete trials the importance chart is there. No warning either way."""
    import gc
    import types
    import warnings

    import mlflow
    import optuna

    from trainpipe.steps.tuning import _log_plots

    def objective(trial: optuna.Trial) -> float:
        rate, width = trial.suggest_float("lr", 1e-4, 1e-1, log=True), trial.suggest_int("width", 4, 64)
        for step in range(3):
            trial.report(rate * step + width / 100, step)
        return rate + width / 100

    client = mlflow.MlflowClient()
    experiment = client.create_experiment(f"study-plots-{tmp_path.name}")
    hook = types.SimpleNamespace(client=client)
    for complete, importances in ((1, False), (8, True)):
        study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=1))
        study.optimize(objective, n_trials=complete)
        run_id = client.create_run(experiment).info.run_id
        said: list[str] = []
        # Earlier tests in this worker leave garbage (files, event loops) whose finalizers warn when the
        # collector happens to run: collect it first and hold the collector, so only _log_plots' own
        # warnings land here.
        gc.collect()
        gc.disable()
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                _log_plots(hook, run_id, study, said.append)
        finally:
            gc.enable()
        assert [str(w.message) for w in caught] == []
        plots = {Path(a.path).name for a in client.list_artifacts(run_id, "study")}
        assert {"optimization_history.png", "intermediate_values.png"} <= plots
        assert ("param_importances.png" in plots) is importances
        assert said == ([] if importances else [
            "study plot param_importances skipped: too few complete trials to rank the parameters (1 complete)"])


def test_a_worker_of_two_processes_runs_its_trials_as_one_training_of_two(state_dir: Path):
    """Rank 0 asks and tells, the other rank learns each trial from it: the two train every trial together, and
    a trial's weights equal a fresh two-process run's with its parameters."""
    spec = tiny_tuned_spec("tuning_two_ranks", n_trials=3, max_parallel=1, pruner="none")
    spec["training"]["distributed"] = {"nproc_per_node": 2}
    plan, snapshot, settings, run, hook, study = start(spec)
    lines: list[str] = []
    run_worker(plan, 0, snapshot, settings=settings, run=run, study=study, hook=hook, on_line=lines.append)
    live = load_study(plan.tuning, settings, study["study_name"])
    assert [t.state.name for t in live.trials] == ["COMPLETE"] * 3
    assert len({t.user_attrs["worker_pid"] for t in live.trials}) == 1
    assert sum("ran 3 trials in this launch" in line for line in lines) == 1
    for trial in live.trials:
        assert hook.client.get_run(trial.user_attrs["mlflow_run_id"]).data.params["world_size"] == "2"
    last = live.trials[-1]
    fresh = run_training(with_trial_params(plan, last.params, trial_epochs=True), snapshot, settings=settings,
                         run=RunContext(dag_id=plan.dag_id, airflow_run_id="manual__fresh2", try_number=1,
                                        spec_sha256=plan.spec_sha256, git_commit="test"), hook=hook)
    assert fresh.weights_sha256 == last.user_attrs["weights_sha256"]


def test_a_diverged_trial_fails_alone_and_the_worker_goes_on(state_dir: Path):
    spec = tiny_tuned_spec("tuning_diverged", n_trials=2, max_parallel=1, pruner="none")
    # The launch's first trial gets a non-finite loss at step 3 (test-only fault, first trial of a launch only).
    spec["training"]["testing"] = {"inject_nan_at_step": 3}
    plan, snapshot, settings, run, hook, study = start(spec)
    lines: list[str] = []
    run_worker(plan, 0, snapshot, settings=settings, run=run, study=study, hook=hook, on_line=lines.append)
    live = load_study(plan.tuning, settings, study["study_name"])
    assert [t.state.name for t in live.trials] == ["FAIL", "COMPLETE", "COMPLETE"]
    assert live.trials[0].user_attrs["fail_reason"].startswith("non-finite loss (nan) at step 3: training stopped")
    # One launch ran all three: the failure cost its trial, not the worker.
    assert len({t.user_attrs["worker_pid"] for t in live.trials}) == 1
    assert not any("launching the trainer again" in line for line in lines)
    assert hook.client.get_run(live.trials[0].user_attrs["mlflow_run_id"]).data.tags["trainpipe.trial_state"] == "failed"


def test_no_trial_starts_once_the_study_is_older_than_its_timeout(state_dir: Path):
    from datetime import timedelta

    spec = tiny_tuned_spec("tuning_timeout", n_trials=2, max_parallel=1, pruner="none")
    spec["tuning"]["timeout"] = "1h"
    plan, snapshot, settings, run, hook, study = start(spec)
    live = load_study(plan.tuning, settings, study["study_name"])
    live.set_user_attr("started_at", (datetime.now(UTC) - timedelta(hours=2)).isoformat())
    lines: list[str] = []
    outcome = run_worker(plan, 0, snapshot, settings=settings, run=run, study=study, hook=hook, on_line=lines.append)
    assert outcome["trials"] == [] and load_study(plan.tuning, settings, study["study_name"]).trials == []
    assert any("worker 0: the study is older than its timeout (3600 s): no trial started" in line for line in lines)
