"""Fair queues for GPUs: the plan's pool, pool slots and priority weight; a queued Job for Kueue (label, suspended,
priority class, valid manifests); the wait for quota read from the Job through the real Kubernetes client and
reported as a wait, not a stall."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import kubernetes_validate
import pytest

from tests.kubernetes.fake_apiserver import FakeApiServer, job_status
from tests.support import REPO
from trainpipe.compile.compiler import compile_text
from trainpipe.errors import SpecError
from trainpipe.kubernetes.admission import wait_for_admission
from trainpipe.kubernetes.builders import TrainerLaunch
from trainpipe.operators.kubernetes_render import render_manifests
from trainpipe.plan.build import build_plan
from trainpipe.plan.model import PRIORITY_WEIGHTS, TeamPlan
from trainpipe.settings import Settings
from trainpipe.spec.loader import load_yaml_text
from trainpipe.spec.validate import validate_loaded
from trainpipe.state.checkpoint_state import CheckpointState, TrainingStatus, assess

MULTINODE = (REPO / "dag_configs" / "fraud_detector_multinode.yaml").read_text()
LAUNCH = TrainerLaunch(config_uri="s3://bucket/trainpipe/runs/p/r/trainer_config.json",
                       mlflow_tracking_uri="http://mlflow.mlflow.svc:5000", dag_id="p",
                       airflow_run_id="scheduled__2026-06-30T00:00:00+00:00", try_number=1)


def _queued(text: str = MULTINODE, *, queue: str = "team-a-gpus", priority: str = "high") -> str:
    text = text.replace("    namespace: ml-training\n", f"    namespace: ml-training\n    queue: {queue}\n", 1)
    return f"priority: {priority}\n{text}"


def _compile(text: str):
    return compile_text(text, "fraud_detector_multinode.yaml", configs_root=REPO / "dag_configs", settings=Settings.from_env())


def test_gpu_tasks_take_the_pool_with_one_slot_per_gpu_and_the_priority_weight():
    plan = _compile(_queued())
    train = plan.task("train")
    nodes, gpus = plan.launch.nnodes, plan.kubernetes.resources["gpus"]
    assert (train.pool, train.pool_slots, train.priority_weight) == ("default_pool", nodes * gpus, PRIORITY_WEIGHTS["high"])
    assert plan.resources.gpus == nodes * gpus and plan.resources.gpu_resource == "nvidia.com/gpu"
    # Tasks that hold no GPU keep Airflow's defaults.
    assert plan.task("evaluate").pool is None
    plain = _compile(MULTINODE)
    assert plain.task("train").priority_weight == PRIORITY_WEIGHTS["normal"] and plain.kubernetes.queue is None


def test_the_team_pool_of_the_policy_is_the_gpu_tasks_pool():
    loaded = load_yaml_text(_queued(), "fraud_detector_multinode.yaml")
    spec = validate_loaded(loaded)
    plan = build_plan(spec, spec_file="f.yaml", spec_text="x", team=TeamPlan(name="team-a", pool="team-a-gpu"))
    assert (plan.task("train").pool, plan.task("train").priority_weight) == ("team-a-gpu", PRIORITY_WEIGHTS["high"])
    assert plan.resources.team == "team-a" and plan.kubernetes.priority_class == "trainpipe-high"
    # A policy's limits.max_priority refuses a higher priority at the spec stage (tests/policy/test_spec_rules.py).


def test_dag_train_task_carries_pool_slots_and_absolute_priority_weight():
    from trainpipe.dags.builder import build_dag

    plan = _compile(_queued())
    task = build_dag(plan).get_task("train")
    assert (task.pool, task.pool_slots, task.priority_weight) == ("default_pool", plan.task("train").pool_slots, 100)
    assert task.weight_rule == "absolute"


@pytest.mark.parametrize("version", ("1.30", kubernetes_validate.latest_version()))
def test_queued_job_is_suspended_and_labelled_for_kueue_and_valid(version):
    service, job = render_manifests(_compile(_queued()), launch=LAUNCH, settings=Settings.from_env())
    assert job["kind"] == "Job" and job["spec"]["suspend"] is True
    for labels in (job["metadata"]["labels"], job["spec"]["template"]["metadata"]["labels"]):
        assert labels["kueue.x-k8s.io/queue-name"] == "team-a-gpus"
        assert labels["kueue.x-k8s.io/priority-class"] == "trainpipe-high"
    assert job["spec"]["template"]["spec"]["priorityClassName"] == "trainpipe-high"
    for manifest in (service, job):
        kubernetes_validate.validate(manifest, version, strict=True)
    # Without a queue the Job starts at once and carries no Kueue label.
    _, plain = render_manifests(_compile(MULTINODE), launch=LAUNCH, settings=Settings.from_env())
    assert "suspend" not in plain["spec"] and "kueue.x-k8s.io/queue-name" not in plain["metadata"]["labels"]


@pytest.mark.parametrize("queue", ["Team A", "'{{ var.value.queue }}'", "a" * 64, "gpus;rm"])
def test_a_queue_name_that_is_no_label_value_is_refused(queue):
    with pytest.raises(SpecError, match=r"fraud_detector_multinode.yaml:\d+:\d+: training.kubernetes.queue: "):
        _compile(_queued(queue=queue))


def test_priority_outside_low_normal_high_is_refused():
    with pytest.raises(SpecError, match=r":1:\d+: priority: .*'low', 'normal' or 'high'"):
        _compile(_queued(priority="urgent"))


@pytest.fixture
def apiserver():
    server = FakeApiServer(job_statuses=[job_status(active=2)], suspended_reads=3)
    server.start()
    yield server
    server.stop()


def test_wait_for_admission_reads_the_suspended_job_until_kueue_admits_it(apiserver, tmp_path):
    from kubernetes import client, config

    api = client.BatchV1Api(config.new_client_from_config(str(apiserver.kubeconfig(tmp_path))))
    said: list[datetime] = []
    job, since = wait_for_admission(lambda: api.read_namespaced_job(name="job-a", namespace="ml-training"),
                                    on_waiting=said.append, poll_seconds=0.01, log_every_seconds=0)
    assert job.spec.suspend is False and job.status.active == 2
    # Three suspended reads, one waiting line each (log_every_seconds 0), all with the same start of the wait.
    assert len(said) == 3 and set(said) == {since}
    assert [path for method, path, _ in apiserver.requests] == ["/apis/batch/v1/namespaces/ml-training/jobs/job-a"] * 4


def test_a_queued_try_is_a_wait_not_a_stall():
    since = datetime(2026, 6, 1, 8, 0, tzinfo=UTC)
    queued = TrainingStatus(state="queued", try_number=1, final=False, started_at=since, updated_at=since,
                            queue="team-a-gpus", queued_since=since)
    state = CheckpointState(checkpoints=(), committed_count=0, status=queued)
    progress = assess(state, now=since + timedelta(hours=6), stall_timeout=timedelta(minutes=30))
    assert progress.kind == "waiting"
    assert progress.message.startswith("waiting for quota in queue team-a-gpus since 2026-06-01 08:00:00 UTC")
    assert TrainingStatus.from_dict(__import__("json").loads(queued.to_json())) == queued
    # The same hours after admission, with no checkpoint: a stall.
    running = CheckpointState(checkpoints=(), committed_count=0,
                              status=TrainingStatus(state="running", try_number=1, final=False, started_at=since,
                                                    updated_at=since))
    assert assess(running, now=since + timedelta(hours=6), stall_timeout=timedelta(minutes=30)).kind == "stalled"
