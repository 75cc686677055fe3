"""A tuned pipeline end to end under Airflow's dag.test(): the study, its trial workers (mapped), the best
trial's parameters and weights in the final training, MLflow's parent and child runs, a re-run worker task."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.steps.test_tuning import END, tiny_tuned_spec, write_data

pytestmark = [pytest.mark.integration, pytest.mark.slow]

N_TRIALS = 6  # enough draws that one lands in the range that barely learns (a pruned trial, every time)
WORKERS = 2


@pytest.fixture(scope="module")
def tuned_configs(state_dir: Path, airflow_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainpipe.settings import Settings

    # The median pruner: with trials run one after another (dag.test), it judges trials 3-5 against the
    # first two at every rung, so a slow learner is stopped whatever Hyperband's brackets would decide.
    spec = tiny_tuned_spec("fraud_tuned_e2e", n_trials=N_TRIALS, max_parallel=WORKERS, pruner="median")
    # Trials as long as the final training: the final training is a fresh single run of the best trial's point.
    spec["tuning"]["trial_epochs"] = spec["training"]["epochs"]
    write_data(Settings.from_env(), spec["pipeline_id"])
    configs = tmp_path_factory.mktemp("tuned_configs")
    (configs / "fraud_tuned_e2e.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return configs


def test_tuned_pipeline_trains_with_the_best_trial(tuned_configs, dag_from):
    import mlflow

    from trainpipe.compile.compiler import compile_directory
    from trainpipe.plan.params import with_trial_params
    from trainpipe.settings import Settings
    from trainpipe.steps.tuning import load_study
    from trainpipe.steps.tuning import study_name as study_name_of

    dag = dag_from(tuned_configs, "fraud_tuned_e2e")
    assert dag.get_task("trials").max_active_tis_per_dagrun == WORKERS
    dag_run = dag.test(logical_date=END)

    tis = dag_run.get_task_instances()
    workers = sorted((ti for ti in tis if ti.task_id == "trials"), key=lambda ti: ti.map_index)
    # The grid shows the workers (one task instance each), not the trials.
    assert [ti.map_index for ti in workers] == list(range(WORKERS))
    assert {ti.task_id: ti.state for ti in tis if ti.task_id != "trials"} == {
        t: "success" for t in ("snapshot", "validate", "create_study", "pick_best", "train", "watch_checkpoints",
                               "evaluate", "gate", "register", "promote")}
    assert all(ti.state == "success" for ti in workers)

    settings = Settings.from_env()
    (plan,) = compile_directory(tuned_configs, settings=Settings.from_env()).plans.values()
    study_name = study_name_of("fraud_tuned_e2e", dag_run.run_id)
    study = load_study(plan.tuning, settings, study_name)
    # n_trials finished trials; at least one pruned; a worker ran several of them in one trainer process.
    assert len(study.trials) == N_TRIALS
    assert all(t.state.is_finished() for t in study.trials)
    states = [t.state.name for t in study.trials]
    assert "PRUNED" in states and "COMPLETE" in states, states
    per_worker = {w: [t for t in study.trials if t.user_attrs["worker"] == w] for w in range(WORKERS)}
    busiest = max(per_worker.values(), key=len)
    assert len(busiest) >= 2 and len({t.user_attrs["worker_pid"] for t in busiest}) == 1
    pruned = [t for t in study.trials if t.state.name == "PRUNED"]
    assert all(t.user_attrs["trainer_seconds"] > 0 for t in pruned)  # compute of pruned trials is recorded
    best = study.best_trial

    # The final training ran with the best trial's parameters and says which trial it came from.
    client = mlflow.MlflowClient()
    champion = client.get_model_version_by_alias("fraud_tuned_e2e", "champion")
    final = client.get_run(champion.run_id)
    assert final.data.tags["trainpipe.tuning.best_trial"] == str(best.number)
    assert json.loads(final.data.tags["trainpipe.tuning.best_params"]) == best.params
    expected = with_trial_params(plan, best.params).trainer
    assert float(final.data.params["learning_rate"]) == pytest.approx(expected.learning_rate)
    assert json.loads(final.data.params["model.hidden_layers"]) == list(expected.model.hidden_layers)
    assert final.data.params["epochs"] == str(plan.trainer.epochs)
    # ... and, a fresh single run with the same parameters and seed, has the best trial's very weights.
    assert champion.tags["weights_sha256"] == best.user_attrs["weights_sha256"]

    # MLflow: the study's parent run with one child per trial, marked with its state and worker.
    parent_id = final.data.tags["trainpipe.tuning.parent_run_id"]
    children = client.search_runs([final.info.experiment_id],
                                  filter_string=f"tags.`mlflow.parentRunId` = '{parent_id}'")
    assert sorted(int(c.data.tags["trainpipe.trial_number"]) for c in children) == [t.number for t in study.trials]
    for child in children:
        trial = study.trials[int(child.data.tags["trainpipe.trial_number"])]
        assert child.data.tags["trainpipe.trial_state"] == {"COMPLETE": "complete", "PRUNED": "pruned"}[
            trial.state.name]
        assert child.data.tags["trainpipe.trial_worker"] == str(trial.user_attrs["worker"])
    assert client.get_run(parent_id).data.metrics["trials_pruned"] == len(pruned)

    # `trainpipe reproduce` of the tuned model trains it again with the best trial's parameters: same weights.
    from trainpipe.steps.train.reproduce import reproduce

    again = reproduce("fraud_tuned_e2e@champion", configs_root=tuned_configs, settings=Settings.from_env())
    assert again.matches, (again.weights_sha256, again.lineage.weights_sha256)

    # Re-running a worker task (worker 1) through Airflow: the study has its trials, nothing is launched.
    import os
    import subprocess
    import sys

    airflow = Path(sys.executable).with_name("airflow")
    rerun = subprocess.run(
        [str(airflow), "tasks", "test", "fraud_tuned_e2e", "trials", dag_run.run_id, "--map-index", "1"],
        capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "TRAINPIPE_DAG_CONFIGS": str(tuned_configs)})
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert f"worker 1: the study already has {N_TRIALS} finished trials of {N_TRIALS}; nothing to run" in (
        rerun.stdout + rerun.stderr)
    assert len(load_study(plan.tuning, settings, study_name).trials) == N_TRIALS
