"""The train task on Kubernetes (``training.launcher: kubernetes``).

- ``nnodes: 1``: ``KubernetesTrainPodOperator``, a KubernetesPodOperator running the trainer in one pod
  (deferrable, durable, logs copied into the task log every ``log_interval``).
- ``nnodes > 1``: ``KubernetesTrainJobOperator``, a KubernetesJobOperator running an Indexed Job (one
  pod per node) plus the headless Service that gives node 0 a DNS name for the c10d rendezvous.

Both run the command and environment of the local launcher (``trainpipe.kubernetes.builders``),
write the trainer config into the run folder before the pods start (the pods read it from storage
and need no Airflow), and return the trainer's ``TrainingResult`` as the task's XCom, like
``TrainOperator``. Retries resume: the run folder, and so the checkpoints, are per DAG run.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import asdict, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from trainpipe.errors import MissingExtraError, TrainpipeError

try:
    from airflow.providers.cncf.kubernetes.operators.job import KubernetesJobOperator
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise MissingExtraError("launcher 'kubernetes'", "kubernetes", field_path=("training", "launcher")) from err

from trainpipe.kubernetes import builders
from trainpipe.operators.context import TaskSettings
from trainpipe.operators.literal import LiteralFields
from trainpipe.plan.tracking import TRAINER_IMAGE_DIGEST_TAG

if TYPE_CHECKING:
    from airflow.sdk import Context
    from kubernetes.client import models as k8s

    from trainpipe.kubernetes.tries import TryResources
    from trainpipe.plan.model import PipelinePlan
    from trainpipe.settings import Settings

operator_log = logging.getLogger(__name__)
# How long create_job waits for the Job controller to create every pod before monitoring starts.
POD_DISCOVERY_TIMEOUT_SECONDS = 120


def check_reachable_from_pods(storage_root: str, mlflow_tracking_uri: str) -> None:
    """Pods cannot read the worker's disk: fail before submitting anything, and say what to set."""
    if storage_root.startswith("file://") or "://" not in storage_root:
        raise TrainpipeError(
            f"launcher 'kubernetes': the storage root {storage_root} is on the Airflow worker's disk, which the "
            "training pods cannot read; set TRAINPIPE_STORAGE_ROOT to a bucket (s3://bucket/trainpipe) and "
            "TRAINPIPE_STORAGE_CONN_ID to its Airflow connection (docs/kubernetes.md)"
        )
    if mlflow_tracking_uri.startswith(("sqlite:", "file:")) or "://" not in mlflow_tracking_uri:
        raise TrainpipeError(
            f"launcher 'kubernetes': MLFLOW_TRACKING_URI {mlflow_tracking_uri} is local to the Airflow worker; the "
            "training pods need a tracking server they can reach (http://mlflow.mlflow.svc:5000)"
        )


def prepare_launch(operator: Any, context: Context) -> tuple[builders.TrainerLaunch, TryResources]:
    """Write this try's trainer config into the run folder (same code as the local launcher), and find what
    this try asks of the cluster after the run's earlier tries (grown memory, on-demand capacity, a split batch):
    recorded on the MLflow run (the registered version copies it) and, when it changed, in the run note."""
    from mlflow.entities import RunTag

    from trainpipe.hooks.mlflow import MlflowHook
    from trainpipe.operators.context import failed_for_good_on_refused_resume, train_inputs, training_key_unless_cached
    from trainpipe.state.run_notes import leave_note, retry_note
    from trainpipe.steps.train.train import prepare_training_run

    plan: PipelinePlan = operator.plan
    settings = operator.settings
    check_reachable_from_pods(settings.storage_root, settings.mlflow_tracking_uri)
    inputs = train_inputs(plan, context)
    hook = MlflowHook(settings)
    # Before any pod: a run whose inputs a registered version already carries launches nothing.
    training_key_unless_cached(plan, context, inputs, client=hook.client, log=operator.log)
    # Before the config is written: after a CUDA OOM, this try may train with a smaller batch (on_oom.reduce_batch).
    resources = resources_for_try(inputs.plan, settings=settings, airflow_run_id=inputs.run.airflow_run_id,
                                  try_number=inputs.run.try_number)
    run_plan = replace(inputs.plan, trainer=resources.trainer(inputs.plan.trainer))
    with failed_for_good_on_refused_resume():
        prepared = prepare_training_run(run_plan, inputs.snapshot, settings=settings, run=inputs.run,
                                        hook=hook, param_overrides=inputs.param_overrides)
    operator.log.info("trainer config: %s (MLflow run %s)", prepared.config_uri, prepared.mlflow_run_id)
    launch = builders.TrainerLaunch(config_uri=prepared.config_uri, mlflow_tracking_uri=settings.mlflow_tracking_uri,
                                    dag_id=inputs.run.dag_id, airflow_run_id=inputs.run.airflow_run_id,
                                    try_number=inputs.run.try_number)
    hook.client.log_batch(prepared.mlflow_run_id, tags=[
        RunTag(key, value) for key, value in resources.tags(plan.kubernetes.resources["gpus"]).items()])
    if resources.changes:
        line = retry_note(resources.try_number, resources.changes)
        operator.log.warning("%s", line)
        leave_note(context["ti"], line)
    return launch, resources


def _training_key(plan: PipelinePlan, context: Context) -> str:
    """The run's training key again (``finish`` may run in another process than ``prepare_launch``)."""
    from trainpipe.operators.context import run_training_key, train_inputs

    return run_training_key(train_inputs(plan, context))


def resources_for_try(plan: PipelinePlan, *, settings: Settings, airflow_run_id: str, try_number: int) -> TryResources:
    """What a try of the run asks of the cluster, from the ledger of the run's earlier tries (the run
    folder's usage.json): the same for a real try and for ``trainpipe render --k8s``."""
    from trainpipe.kubernetes.tries import try_resources
    from trainpipe.state.run_folder import run_dir_for
    from trainpipe.state.usage import tries_before

    earlier = tries_before(run_dir_for(plan.dag_id, settings, airflow_run_id), try_number)
    batch = (plan.trainer.batch_size, plan.trainer.optimization.gradient_accumulation_steps)
    return try_resources(plan.kubernetes, try_number=try_number, earlier=earlier, batch=batch)


def finish(operator: Any, context: Context) -> dict[str, Any]:
    """The trainer's result (written to storage by rank 0) becomes the task's return value."""
    from trainpipe.operators.context import leave_usage_note, log_trained
    from trainpipe.state.run_folder import read_training_result, run_dir_for

    settings = operator.settings
    run_dir = run_dir_for(operator.plan.dag_id, settings, context["run_id"])
    result = read_training_result(run_dir)
    log_trained(operator.log, result)
    record_pulled_images(operator, result.mlflow_run_id)
    account_kubernetes_try(operator.plan, context, settings=settings, outcome="succeeded",
                           mlflow_run_id=result.mlflow_run_id,
                           resources=_try_resources_of(operator, context))
    leave_usage_note(context, operator.plan, settings, result)
    value = {**asdict(result), "training_key": _training_key(operator.plan, context)}
    # do_xcom_push stays False (it would add the provider's XCom sidecar): push the result ourselves.
    context["ti"].xcom_push(key="return_value", value=value)
    return value


def record_pulled_images(operator: Any, mlflow_run_id: str | None) -> None:
    """Tag the run with the images the nodes ran (read from the pods before they were deleted): the digest a
    tag in the spec resolved to, for reproduce and audits. Never raises: the training succeeded."""
    images = operator.pulled_images
    if not images or mlflow_run_id is None:
        return
    if len(images) > 1:
        operator.log.warning("the nodes of this training ran different images (a tag moved between pulls): %s",
                             ", ".join(images))
    try:
        from trainpipe.hooks.mlflow import MlflowHook

        MlflowHook(operator.settings).client.set_tag(mlflow_run_id, TRAINER_IMAGE_DIGEST_TAG, ",".join(images))
    except Exception as err:
        operator.log.warning("could not record the trainer image's digest on the MLflow run: %s: %s",
                             type(err).__name__, err)


def read_pulled_images(operator: Any, pods: Any) -> None:
    """``operator.pulled_images`` from ``pods`` (a callable); a failed read leaves it empty with a warning."""
    from trainpipe.kubernetes.tries import pulled_images

    try:
        operator.pulled_images = pulled_images(pods())
    except Exception as err:
        operator.log.warning("could not read which image the pods ran: %s: %s", type(err).__name__, err)


def account_kubernetes_try(plan: PipelinePlan, context: Context, *, settings: Settings, outcome: str,
                           mlflow_run_id: str | None,
                           resources: TryResources | None = None, reason: str | None = None) -> None:
    """This try's pods held their devices from the try's start (status.json) until now: record it, with
    how it ended (``reason``: OOMKilled) and what it asked for (``resources``), which the next try reads.
    Never raises: it also runs while a failure propagates, which it must not replace."""
    try:
        _account_kubernetes_try(plan, context, settings=settings, outcome=outcome, mlflow_run_id=mlflow_run_id,
                                resources=resources,
                                reason=reason)
    except Exception as err:
        operator_log.warning("could not record the GPU/CPU hours of this try: %s: %s", type(err).__name__, err)


def _account_kubernetes_try(plan: PipelinePlan, context: Context, *, settings: Settings, outcome: str,
                            mlflow_run_id: str | None,
                            resources: TryResources | None, reason: str | None) -> None:

    from trainpipe.hooks.mlflow import MlflowHook
    from trainpipe.state.checkpoint_state import read_training_status
    from trainpipe.state.run_folder import run_dir_for
    from trainpipe.state.usage import account_try

    run_dir = run_dir_for(plan.dag_id, settings, context["run_id"])
    try_number = context["ti"].try_number
    hook = MlflowHook(settings)
    if mlflow_run_id is None:  # a failed try: the DAG run's MLflow run (prepare_launch made it)
        try:
            mlflow_run_id = hook.run_for_dag_run(pipeline_id=plan.dag_id, dag_id=context["ti"].dag_id,
                                                 airflow_run_id=context["run_id"], tags={})
        except Exception as err:
            operator_log.warning("MLflow unreachable: the failed try's hours are only in usage.json (%s)", err)
    status = read_training_status(run_dir)
    started_at = (status.started_at if status is not None and status.try_number == try_number
                  else datetime.now(UTC))
    account_try(run_dir, settings=settings, resources=plan.resources, pipeline_id=plan.dag_id, try_number=try_number,
                started_at=started_at, outcome=outcome, client=hook.client, mlflow_run_id=mlflow_run_id, reason=reason,
                memory=resources.memory if resources is not None else None,
                capacity=resources.capacity if resources is not None else None)


def account_failed_try(operator: Any, context: Context, pods: Any) -> None:
    """A failed try: how it ended, read from its pods (``pods``: a callable, so reading them cannot
    replace the failure being raised), recorded for the next try."""
    from trainpipe.kubernetes.tries import failed_try_end

    try:
        outcome, reason = failed_try_end(pods())
    except Exception as err:
        operator.log.warning("could not read how the pods ended: %s: %s", type(err).__name__, err)
        outcome, reason = "failed", None
    if reason is not None or outcome != "failed":
        operator.log.warning("this try ended %s%s", outcome, f" ({reason})" if reason else "")
    account_kubernetes_try(operator.plan, context, settings=operator.settings, outcome=outcome, mlflow_run_id=None,
                           reason=reason,
                           resources=_try_resources_of(operator, context))


def _try_resources_of(operator: Any, context: Context) -> TryResources | None:
    """What this try asked for: bound at submission, or, in the process that resumes after a deferral, read
    again from the ledger; None (and a warning) when that fails, which must not fail the try."""
    bound = getattr(operator, "try_resources", None)
    if bound is not None:
        return bound
    try:
        return resources_for_try(operator.plan, settings=operator.settings, airflow_run_id=context["run_id"],
                                 try_number=context["ti"].try_number)
    except Exception as err:
        operator.log.warning("could not read the run's earlier tries: %s: %s", type(err).__name__, err)
        return None


@contextlib.contextmanager
def failed_try_accounted(operator: Any, context: Context, pods: Any) -> Iterator[None]:
    """A try that ends in an error still held its devices: record them (a deferral is no end)."""
    from airflow.sdk.exceptions import TaskDeferred

    try:
        yield
    except TaskDeferred:
        raise
    except BaseException:
        account_failed_try(operator, context, pods)
        raise


class KubernetesTrainPodOperator(TaskSettings, LiteralFields, KubernetesPodOperator):
    """Single-node training in one pod: ``torchrun --nproc_per_node=<gpus> -m trainpipe_trainer``."""

    ui_color = "#fde9c9"
    # The images the trainer containers ran, read when the training succeeded (``finish`` tags the run).
    pulled_images: tuple[str, ...] = ()

    def __init__(self, *, plan: PipelinePlan, **kwargs: Any) -> None:
        options = {
            **builders.static_operator_kwargs(plan),
            "name": builders.pod_base_name(plan),
            # Reattach to the running pod after an Airflow worker restart instead of starting another.
            "durable": True,
            "logging_interval": int(plan.kubernetes.log_interval.total_seconds()),
            **kwargs,
        }
        super().__init__(**options)
        self.plan = plan

    def bind_launch(self, launch: builders.TrainerLaunch, resources: TryResources) -> None:
        """Set the per-run part of the pod: the trainer command and environment, this try's memory and placement."""
        self.cmds = builders.container_command(self.plan, launch)
        self.arguments = []
        self.env_vars = builders.container_env(self.plan, launch)
        bind_try_resources(self, resources)

    def execute(self, context: Context) -> Any:
        self.bind_launch(*prepare_launch(self, context))
        super().execute(context)  # defers; returns here only when not deferrable
        read_pulled_images(self, lambda: [self.pod] if self.pod is not None else [])
        return finish(self, context)

    def trigger_reentry(self, context: Context, event: dict[str, Any]) -> Any:
        with failed_try_accounted(self, context, lambda: [self.pod] if self.pod is not None else []):
            super().trigger_reentry(context, event)  # raises if the pod failed, re-defers while it runs
        read_pulled_images(self, lambda: [self.pod] if self.pod is not None else [])
        return finish(self, context)


def bind_try_resources(operator: Any, resources: TryResources) -> None:
    """The try's memory and placement over the plan's (the same fields the operator was built with)."""
    for name, value in builders.try_operator_fields(operator.plan, resources).items():
        setattr(operator, name, value)
    operator.try_resources = resources


class _PodTemplateDryRun(KubernetesPodOperator):
    """Placed between KubernetesJobOperator and KubernetesPodOperator in the MRO so that
    ``KubernetesJobOperator.build_job_request_obj`` builds its pod template with ``dry_run`` when
    asked to: the only part of building a Job that talks to a cluster is the pod's in-cluster label.
    """

    _dry_run_pod_template = False

    def build_pod_request_obj(self, context: Context | None = None, *, dry_run: bool = False) -> k8s.V1Pod:
        return super().build_pod_request_obj(context, dry_run=dry_run or self._dry_run_pod_template)


class KubernetesTrainJobOperator(TaskSettings, LiteralFields, KubernetesJobOperator, _PodTemplateDryRun):
    """Multi-node training: an Indexed Job (completions = parallelism = nnodes) and a headless Service.

    Pod ``i`` runs torchrun with ``--node_rank=$(JOB_COMPLETION_INDEX)`` and c10d rendezvous at
    ``<job>-0.<job>:<port>``. The Service is owned by the Job (Kubernetes deletes it with the Job) and
    is deleted when the task ends, fails or is killed; the Job follows ``on_finish_action``, with
    ``ttl_after_finished`` as the backstop.
    """

    ui_color = "#fde9c9"
    # The running try's context, for the status written while the Job waits for quota.
    _launch_context: Any = None

    pulled_images: tuple[str, ...] = ()

    def __init__(self, *, plan: PipelinePlan, **kwargs: Any) -> None:
        options = {**builders.static_operator_kwargs(plan), **builders.job_operator_kwargs(plan), **kwargs}
        super().__init__(**options)
        self.plan = plan

    @property
    def rendezvous_port(self) -> int:
        return self.plan.kubernetes.rendezvous_port

    def bind_launch(self, launch: builders.TrainerLaunch, resources: TryResources) -> None:
        """Set the per-run part: Job name (= Service name = pods' subdomain), command, environment, and this
        try's memory and placement."""
        full_name = builders.job_name(self.plan, launch)
        self.name = full_name.removeprefix(builders.JOB_NAME_PREFIX)  # the operator adds the prefix back
        self.subdomain = full_name
        self.labels = {**self.labels, builders.LABEL_JOB: full_name,
                       builders.LABEL_RUN: builders.run_label(launch.dag_id, launch.airflow_run_id)}
        self.cmds = builders.container_command(self.plan, launch)
        self.arguments = []
        self.env_vars = builders.container_env(self.plan, launch)
        bind_try_resources(self, resources)

    def build_job_request_obj(self, context: Context | None = None, *, dry_run: bool = False) -> k8s.V1Job:
        """The Job to submit; ``dry_run`` builds it without a cluster (``trainpipe render --k8s``)."""
        self._dry_run_pod_template = dry_run
        try:
            job = super().build_job_request_obj(context)
        finally:
            self._dry_run_pod_template = False
        # KubernetesJobOperator has no argument for it; a preemption must not count as a failure (with
        # capacity it ends the try, whose retry may run on on-demand capacity).
        on_oom = self.plan.kubernetes.on_oom
        job.spec.pod_failure_policy = builders.pod_failure_policy(
            disruption_ends_try=self.plan.kubernetes.capacity is not None,
            cuda_oom_ends_try=bool(on_oom and on_oom.get("reduce_batch")))
        return job

    def build_service(self, job: k8s.V1Job) -> k8s.V1Service:
        return builders.headless_service(job, port=self.rendezvous_port)

    # -- submission ------------------------------------------------------------------------------

    def execute(self, context: Context) -> Any:
        from airflow.sdk.exceptions import TaskDeferred

        launch, resources = prepare_launch(self, context)
        self.bind_launch(launch, resources)
        self._launch_context = context  # create_job records the queued status of this try
        self.delete_leftovers(builders.run_label(launch.dag_id, launch.airflow_run_id))
        try:
            super().execute(context)  # creates Service + Job (create_job below), then defers
        except TaskDeferred:
            raise
        except BaseException:
            account_failed_try(self, context, lambda: self._pods_of_job(self.job))
            self.delete_job_and_service(succeeded=False)
            raise
        read_pulled_images(self, lambda: self._pods_of_job(self.job))
        self.delete_job_and_service(succeeded=True)
        return finish(self, context)

    def create_job(self, job_request_obj: k8s.V1Job) -> k8s.V1Job:
        """Service first (its DNS must exist when node 0 starts), then the Job, then the Service's owner."""
        models = builders.k8s_models()
        namespace = job_request_obj.metadata.namespace
        service = self.build_service(job_request_obj)
        self.log.info("creating headless Service %s/%s", namespace, service.metadata.name)
        core = self.hook.core_v1_client
        core.create_namespaced_service(namespace=namespace, body=builders.to_manifest(service))
        self.job = job_request_obj  # from here on, on_kill deletes it
        created = self.hook.create_job(job=job_request_obj)
        owner = models.V1OwnerReference(api_version="batch/v1", kind="Job", name=created.metadata.name,
                                        uid=created.metadata.uid, block_owner_deletion=False)
        core.patch_namespaced_service(name=service.metadata.name, namespace=namespace,
                                      body={"metadata": {"ownerReferences": [builders.to_manifest(owner)]}})
        if self.plan.kubernetes.queue is not None:
            self._await_admission(job_request_obj)
        self._await_pods(job_request_obj)
        return job_request_obj

    def _await_admission(self, job: k8s.V1Job) -> None:
        """A queued Job has no pods until Kueue admits it: say so (task log, status.json) instead of
        timing out on pods; the try's clock (stall watch, cost) starts at admission."""
        from trainpipe.kubernetes.admission import wait_for_admission
        from trainpipe.state.checkpoint_state import queue_wait_text

        queue = self.plan.kubernetes.queue
        name, namespace = job.metadata.name, job.metadata.namespace

        def waiting(since: datetime) -> None:
            self.log.info("%s (Job %s/%s is suspended until it fits the quota)", queue_wait_text(queue, since),
                          namespace, name)
            self._record_status("queued", queue=queue)

        _, since = wait_for_admission(
            lambda: self.hook.batch_v1_client.read_namespaced_job(name=name, namespace=namespace),
            on_waiting=waiting)
        if since is not None:
            self.log.info("queue %s admitted Job %s/%s (waited since %s)", queue, namespace, name, since.isoformat())
            self._record_status("running")

    def _record_status(self, state: str, *, queue: str | None = None) -> None:
        from trainpipe.state.checkpoint_state import dag_run_clear_number, record_training_status

        context = self._launch_context
        try:
            record_training_status(self.plan.dag_id, settings=self.settings, airflow_run_id=context["run_id"],
                                   state=state, try_number=context["ti"].try_number,
                                   clear_number=dag_run_clear_number(context), queue=queue)
        except Exception as err:
            self.log.warning("could not record the %s status for the checkpoint sensor: %s", state, err)

    def _await_pods(self, job: k8s.V1Job) -> None:
        # KubernetesJobOperator.get_pods lists the pods right after creation without waiting.
        selector = f"{builders.LABEL_JOB}={job.metadata.name}"
        deadline = time.monotonic() + POD_DISCOVERY_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            pods = self.client.list_namespaced_pod(namespace=job.metadata.namespace, label_selector=selector).items
            if len(pods) >= self.parallelism:
                return
            time.sleep(2)
        self.log.warning("the Job controller created fewer than %d pods of %s within %ds",
                         self.parallelism, job.metadata.name, POD_DISCOVERY_TIMEOUT_SECONDS)

    def execute_deferrable(self) -> None:
        from trainpipe.triggers.kubernetes import TrainJobTrigger

        self.defer(
            trigger=TrainJobTrigger(
                job_name=self.job.metadata.name,
                job_namespace=self.job.metadata.namespace,
                pod_names=[pod.metadata.name for pod in self.pods],
                pod_namespace=self.pods[0].metadata.namespace,
                base_container_name=self.base_container_name,
                kubernetes_conn_id=self.kubernetes_conn_id,
                cluster_context=self.cluster_context,
                config_file=self.config_file,
                in_cluster=self.in_cluster,
                poll_interval=self.job_poll_interval,
                get_logs=self.get_logs,
                do_xcom_push=self.do_xcom_push,
                service_name=self.job.metadata.name,
            ),
            method_name="execute_complete",
        )

    def _pods_of_job(self, job: Any, name: str | None = None, namespace: str | None = None) -> list[Any]:
        if job is not None:
            name, namespace = job.metadata.name, job.metadata.namespace
        if name is None:
            return []
        return self.client.list_namespaced_pod(namespace=namespace,
                                               label_selector=f"{builders.LABEL_JOB}={name}").items

    def execute_complete(self, context: Context, event: dict, **kwargs: Any) -> Any:
        self.job = None
        try:
            with failed_try_accounted(self, context,
                                      lambda: self._pods_of_job(None, event["name"], event["namespace"])):
                super().execute_complete(context, event, **kwargs)
            read_pulled_images(self, lambda: self._pods_of_job(None, event["name"], event["namespace"]))
        finally:
            self.delete_job_and_service(name=event["name"], namespace=event["namespace"],
                                        succeeded=event["status"] == "success")
        return finish(self, context)

    # -- cleanup ---------------------------------------------------------------------------------

    def delete_job_and_service(self, *, succeeded: bool, name: str | None = None, namespace: str | None = None) -> None:
        """Always the Service; the Job (with its pods) as ``on_finish_action`` says."""
        from trainpipe.kubernetes.cleanup import delete_job_on_finish, delete_sync, deletions

        if name is None:
            if self.job is None:
                return
            name, namespace = self.job.metadata.name, self.job.metadata.namespace
        action = self.on_finish_action.value
        delete_job = delete_job_on_finish(action, succeeded=succeeded)
        delete_sync(deletions(job_name=name, namespace=namespace, service_name=name, delete_job=delete_job),
                    core_v1=self.hook.core_v1_client, batch_v1=self.hook.batch_v1_client, logger=self.log)
        if not delete_job:
            self.log.info("keeping Job %s/%s (on_finish_action %s); Kubernetes deletes it after ttl_after_finished",
                          namespace, name, action)

    def delete_leftovers(self, run: str) -> None:
        """Jobs and Services of an earlier try of this DAG run that a lost worker left running: two
        trainers must never write the same checkpoints."""
        selector = f"{builders.LABEL_RUN}={run}"
        jobs = self.hook.batch_v1_client.list_namespaced_job(namespace=self.namespace, label_selector=selector).items
        for job in jobs:
            if job.status and (job.status.active or 0) > 0:
                self.log.warning("deleting Job %s of an earlier try, still running", job.metadata.name)
                self.hook.batch_v1_client.delete_namespaced_job(
                    name=job.metadata.name, namespace=self.namespace, propagation_policy="Foreground")
        services = self.hook.core_v1_client.list_namespaced_service(namespace=self.namespace, label_selector=selector).items
        for service in services:
            self.hook.core_v1_client.delete_namespaced_service(name=service.metadata.name, namespace=self.namespace)

    def on_kill(self) -> None:
        job = self.job
        super().on_kill()  # deletes the Job (foreground: its pods too)
        if job is not None:
            self.delete_job_and_service(succeeded=False, name=job.metadata.name, namespace=job.metadata.namespace)


def kubernetes_train_operator(*, plan: PipelinePlan, **kwargs: Any) -> KubernetesPodOperator:
    """The train task of a ``launcher: kubernetes`` spec: a pod for one node, a Job for several."""
    if plan.launch.nnodes > 1:
        return KubernetesTrainJobOperator(plan=plan, **kwargs)
    return KubernetesTrainPodOperator(plan=plan, **kwargs)
