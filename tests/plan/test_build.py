"""The plan: the contract every later stage reads (tasks and edges, launch, sensor timings, the
trainer config template, run parameters applied without going back to the spec)."""

from __future__ import annotations

import dataclasses
import hashlib
from datetime import timedelta

import pytest

from tests.support import REPO, spec_with
from trainpipe.compile.compiler import compile_file
from trainpipe.errors import SpecError
from trainpipe.plan.launch import LaunchValues, resolve
from trainpipe.plan.model import (
    ApprovalPlan,
    KubernetesPlan,
    NotifyChannel,
    NotifyPlan,
    checkpoint_poll_seconds,
    run_key,
)
from trainpipe.plan.params import apply_run_params
from trainpipe.plan.steps import CHECKPOINT_SENSOR
from trainpipe.settings import Settings
from trainpipe.spec.sections.kubernetes import KubernetesSpec


def test_plan_of_fraud_example():
    plan = compile_file(REPO / "dag_configs" / "fraud_detector.yaml", "dag_configs/fraud_detector.yaml",
                        settings=Settings.from_env())
    assert [t.task_id for t in plan.tasks] == ["snapshot", "validate", "train", CHECKPOINT_SENSOR, "evaluate", "gate",
                                               "register", "promote"]
    assert [t.upstream for t in plan.tasks] == [(), ("snapshot",), ("validate",), ("validate",), ("train",), ("evaluate",),
                                                ("gate",), ("register",)]
    assert plan.spec_file == "dag_configs/fraud_detector.yaml"
    assert plan.spec_relative_path == "fraud_detector.yaml"  # relative to the configs root: the registry's spec_file
    assert (plan.registration.alias, plan.registration.challenger_alias, plan.registration.previous_alias) == (
        "champion", "challenger", "previous_champion")
    assert plan.launch.launcher == "local"
    assert plan.launch.argv == ("python", "-m", "trainpipe_trainer.elastic", "--nnodes=1", "--nproc_per_node=2",
                                "--standalone", "-m", "trainpipe_trainer", "--config", "{config_uri}")
    assert plan.launch.preemption_restarts == 3  # training.preemption.max_restarts, by default
    assert plan.trainer.seed == 42 and plan.trainer.features[:3] == ("amount", "merchant_risk", "hour_of_day")
    assert plan.evaluation.metrics[:2] == ("auc", "f1") and str(plan.evaluation.gates[2]) == "auc >= +0.1% vs champion"
    assert plan.sensor.checkpoint_poll_seconds == checkpoint_poll_seconds(plan.sensor.stall_timeout)
    assert plan.to_dict()["trainer"]["seed"] == 42
    assert "source_path" not in plan.to_dict()  # where this machine keeps the file is nobody's business
    assert "spec_text" not in plan.to_dict() and hashlib.sha256(plan.spec_text.encode()).hexdigest() == plan.spec_sha256


def test_launch_resolves_every_placeholder_for_a_run():
    plan = compile_file(REPO / "dag_configs" / "fraud_detector.yaml", settings=Settings.from_env())

    launch = resolve(plan.launch, LaunchValues(config_uri="s3://b/c.json", mlflow_tracking_uri="http://mlflow:5000"))

    assert launch.argv == ("python", "-m", "trainpipe_trainer.elastic", "--nnodes=1", "--nproc_per_node=2",
                           "--standalone", "-m", "trainpipe_trainer", "--config", "s3://b/c.json")
    assert launch.env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000" and launch.env["OMP_NUM_THREADS"] == "1"


def test_a_multinode_launch_needs_its_job_name():
    plan = compile_file(REPO / "dag_configs" / "fraud_detector_multinode.yaml", settings=Settings.from_env())
    values = LaunchValues(config_uri="s3://b/c.json", mlflow_tracking_uri="http://mlflow:5000")

    with pytest.raises(ValueError, match="resolved with its Job's name"):
        resolve(plan.launch, values)
    argv = resolve(plan.launch, dataclasses.replace(values, job_name="job-x-t1")).argv
    assert "--rdzv_endpoint=job-x-t1-0.job-x-t1:29500" in argv and "--node_rank=$(JOB_COMPLETION_INDEX)" in argv


def test_run_params_replace_the_plans_values_and_leave_the_compiled_plan_alone():
    plan = compile_file(REPO / "dag_configs" / "fraud_detector.yaml", settings=Settings.from_env())
    assert {p.name: p.target for p in plan.params}["learning_rate"] == ("trainer", "learning_rate")

    run, changed = apply_run_params(plan, {"learning_rate": 0.01, "epochs": 8, "seed": None})

    assert changed == {"learning_rate": 0.01}  # epochs 8 is the spec's own value; None means "not given"
    assert run.trainer.learning_rate == 0.01 and plan.trainer.learning_rate == 0.003
    assert dataclasses.replace(run, trainer=plan.trainer) == plan  # nothing else moved


def test_a_run_param_outside_its_bounds_is_a_located_error():
    plan = compile_file(REPO / "dag_configs" / "fraud_detector.yaml", "dag_configs/fraud_detector.yaml",
                        settings=Settings.from_env())
    param = next(p for p in plan.params if p.name == "epochs")
    file, line, column = param.declared_at

    with pytest.raises(SpecError) as err:
        apply_run_params(plan, {"epochs": 0})
    assert str(err.value) == (f"{file}:{line}:{column}: params.epochs: this run's value 0 is not >= 1 "
                              "(training.epochs); trigger the run with a value within the param's bounds")
    assert file == "dag_configs/fraud_detector.yaml" and line is not None
    with pytest.raises(SpecError, match="this run's value 2.5 is not a whole number"):
        apply_run_params(plan, {"epochs": 2.5})
    assert apply_run_params(plan, {"epochs": 3.0})[0].trainer.epochs == 3  # a whole float is an integer


def test_sensor_timings_scale_with_the_stall_timeout():
    assert checkpoint_poll_seconds(timedelta(minutes=30)) == 60.0
    assert checkpoint_poll_seconds(timedelta(seconds=2)) == 0.5
    assert checkpoint_poll_seconds(timedelta(minutes=2)) == 30.0


def test_the_kubernetes_plan_carries_every_field_of_the_spec_section():
    assert {f.name for f in dataclasses.fields(KubernetesPlan)} == set(KubernetesSpec.model_fields)


@pytest.mark.parametrize("run_id", [".", "~.~", "_._", "..", "+"])
def test_a_run_id_of_dots_gets_a_folder_of_its_own(run_id):
    """Airflow's run id pattern admits "." and "~.~": as a path part, the pipeline's runs folder itself."""
    key = run_key(run_id)
    assert key.startswith("run-") and key == run_key(run_id) and key != run_key(run_id + run_id)


def test_run_key_is_path_safe_and_stable():
    key = run_key("scheduled__2026-11-22T00:00:00+00:00")
    assert key == run_key("scheduled__2026-11-22T00:00:00+00:00")
    assert "/" not in key and ":" not in key and "+" not in key


def test_plan_of_the_approval_example_puts_approve_between_register_and_promote():
    plan = compile_file(REPO / "dag_configs" / "fraud_detector_approval.yaml", "dag_configs/fraud_detector_approval.yaml",
                        settings=Settings.from_env())

    order = [t.task_id for t in plan.tasks if t.task_id != CHECKPOINT_SENSOR]
    assert order[-3:] == ["register", "approve", "promote"]
    assert plan.task("approve").upstream == ("register",) and plan.task("promote").upstream == ("approve",)
    assert plan.registration.approval == ApprovalPlan(required=True, timeout=timedelta(hours=24), on_timeout="reject")
    assert plan.evaluation.on_gate_failure == "fail"
    assert plan.task("gate").summary == "every gate must pass, else the run fails (nothing is registered)"
    assert plan.notify == NotifyPlan(channels=(NotifyChannel(
        kind="email", conn_id="smtp_default", to=("risk-ml-oncall@example.com",),
        events=("gate_failure", "task_failure", "approval", "promotion")),))


@pytest.mark.parametrize(("approval", "expected"), [
    ("none", ApprovalPlan(required=False)),
    ("required", ApprovalPlan(required=True, timeout=timedelta(hours=24), on_timeout="reject")),
    ("{mode: required, timeout: 90m, on_timeout: approve}",
     ApprovalPlan(required=True, timeout=timedelta(minutes=90), on_timeout="approve")),
])
def test_approval_forms(tmp_path, approval, expected):
    spec = spec_with(tmp_path, "  alias: champion\n", f"  alias: champion\n  approval: {approval}\n", name="x.yaml")

    plan = compile_file(spec, "x.yaml", settings=Settings.from_env())

    assert plan.registration.approval == expected
    assert ("approve" in [t.task_id for t in plan.tasks]) == expected.required


def test_notify_plan_keeps_each_channels_events_and_the_default_is_every_event(tmp_path):
    text = (REPO / "dag_configs" / "fraud_detector.yaml").read_text() + (
        "notify:\n  email:\n    to: a@example.com\n    events: [promotion, promotion, gate_failure]\n")
    spec = tmp_path / "x.yaml"
    spec.write_text(text)

    plan = compile_file(spec, "x.yaml", settings=Settings.from_env())

    [email] = plan.notify.channels
    assert (email.to, email.events, email.conn_id, email.from_email) == (
        ("a@example.com",), ("promotion", "gate_failure"), "smtp_default", None)
    assert plan.notify.for_event("task_failure") == ()
    assert compile_file(REPO / "dag_configs" / "fraud_detector.yaml", "f.yaml",
                        settings=Settings.from_env()).notify == NotifyPlan()
