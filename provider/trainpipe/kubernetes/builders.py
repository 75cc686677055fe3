"""The plan's Kubernetes part (``PipelinePlan.kubernetes``) -> arguments of the cncf.kubernetes operators.

The operators in ``trainpipe.operators.kubernetes`` are built from these functions at DAG parse
time (everything that depends only on the plan) and bound to a run at execute time (command,
environment, names). ``trainpipe render --k8s`` builds the same operators the same way and asks
them for their manifests: there is no second manifest builder.

The container runs the plan's launch (``trainpipe.plan.launch.resolve``: argv and environment), the
same as the local launcher (ADR 0002).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainpipe.errors import MissingExtraError, TrainpipeError
from trainpipe.plan.launch import LaunchValues, resolve
from trainpipe.spec.environment import env_name_problem, reserved_env_reason
from trainpipe.spec.pod_keys import is_accelerator_resource, metadata_key_problem
from trainpipe_trainer.outcomes import CUDA_OOM_EXIT_CODE, PREEMPTED_EXIT_CODE

if TYPE_CHECKING:
    from kubernetes.client import models as k8s

    from trainpipe.kubernetes.tries import TryResources
    from trainpipe.plan.model import KubernetesPlan, PipelinePlan

SHM_VOLUME = "dshm"
# KubernetesJobOperator prefixes every Job name with this.
JOB_NAME_PREFIX = "job-"
# Pod hostnames of an Indexed Job are "<job name>-<index>" and must stay a DNS label (63).
_MAX_JOB_NAME = 56
LABEL_PIPELINE = "trainpipe.io/pipeline"
LABEL_RUN = "trainpipe.io/run"
LABEL_JOB = "trainpipe.io/job"


def k8s_models():
    try:
        from kubernetes.client import models
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise MissingExtraError("launcher 'kubernetes'", "kubernetes", field_path=("training", "launcher")) from err
    return models


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainerLaunch:
    """The per-run part of the train pods."""

    # URI of this run's trainer_config.json (the pods read it with fsspec; no Airflow inside).
    config_uri: str
    mlflow_tracking_uri: str
    dag_id: str
    airflow_run_id: str
    try_number: int


def _kubernetes(plan: PipelinePlan) -> KubernetesPlan:
    if plan.kubernetes is None:
        raise TrainpipeError(f"{plan.dag_id}: launcher 'kubernetes' needs a training.kubernetes section (image, resources)")
    return plan.kubernetes


def _slug(text: str, length: int) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:length].strip("-") or "x"


def _label_value(text: str) -> str:
    # Label values: <= 63 characters of [A-Za-z0-9_.-], alphanumeric at both ends.
    value = re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_.-")
    if len(value) > 63:
        value = value[:54].strip("_.-") + "-" + hashlib.sha256(text.encode()).hexdigest()[:8]
    return value


def run_label(dag_id: str, airflow_run_id: str) -> str:
    """Identifies one DAG run's train objects (run ids are too long and too free-form for a label)."""
    return hashlib.sha256(f"{dag_id}\0{airflow_run_id}".encode()).hexdigest()[:16]


def pod_base_name(plan: PipelinePlan) -> str:
    return f"{_slug(plan.dag_id, 40)}-train"


def job_name(plan: PipelinePlan, launch: TrainerLaunch) -> str:
    """The multi-node Job's full name (``job-...``), per DAG run and try; also its Service's name."""
    suffix = f"-{run_label(launch.dag_id, launch.airflow_run_id)[:8]}-t{launch.try_number}"
    base = _slug(plan.dag_id, _MAX_JOB_NAME - len(JOB_NAME_PREFIX) - len(suffix))
    return f"{JOB_NAME_PREFIX}{base}{suffix}"


def _resources(k: KubernetesPlan, *, memory: str | None = None, memory_limit: str | None = None,
               ) -> k8s.V1ResourceRequirements:
    """``memory``/``memory_limit``: a try's own (grown after an OOM kill, ``trainpipe.kubernetes.tries``)."""
    models = k8s_models()
    r = k.resources
    requests: dict[str, str] = {"cpu": r["cpu"], "memory": memory or r["memory"]}
    limits: dict[str, str] = {"memory": memory_limit or r["limits"]["memory"] or r["memory"]}
    if r["limits"]["cpu"]:
        limits["cpu"] = r["limits"]["cpu"]
    if r["gpus"]:
        requests[r["gpu_resource"]] = limits[r["gpu_resource"]] = str(r["gpus"])
    return models.V1ResourceRequirements(requests=requests, limits=limits)


def _affinity(k: KubernetesPlan) -> k8s.V1Affinity | None:
    models = k8s_models()

    def requirement(item: dict[str, Any]) -> k8s.V1NodeSelectorRequirement:
        return models.V1NodeSelectorRequirement(key=item["key"], operator=item["operator"],
                                                values=list(item["values"]) or None)

    if not k.affinity["required"] and not k.affinity["preferred"]:
        return None
    required = None
    if k.affinity["required"]:
        required = models.V1NodeSelector(node_selector_terms=[
            models.V1NodeSelectorTerm(match_expressions=[requirement(i) for i in k.affinity["required"]])
        ])
    preferred = [
        models.V1PreferredSchedulingTerm(weight=i["weight"],
                                         preference=models.V1NodeSelectorTerm(match_expressions=[requirement(i)]))
        for i in k.affinity["preferred"]
    ] or None
    return models.V1Affinity(node_affinity=models.V1NodeAffinity(
        required_during_scheduling_ignored_during_execution=required,
        preferred_during_scheduling_ignored_during_execution=preferred,
    ))


def kueue_labels(plan: PipelinePlan) -> dict[str, str]:
    """With ``queue``: the LocalQueue label (and the WorkloadPriorityClass of the spec's priority). Both values
    are validated spec data (a DNS label) or trainpipe's own class names, never templates."""
    from trainpipe.kubernetes.admission import PRIORITY_CLASS_LABEL, QUEUE_LABEL

    queue = _kubernetes(plan).queue
    if queue is None:
        return {}
    labels = {QUEUE_LABEL: queue}
    if plan.resources.priority_class:
        labels[PRIORITY_CLASS_LABEL] = plan.resources.priority_class
    return labels


def static_operator_kwargs(plan: PipelinePlan) -> dict[str, Any]:
    """Arguments of KubernetesPodOperator (and, by inheritance, KubernetesJobOperator) that depend on
    the plan only: image, resources, scheduling, identity, volumes, security, lifecycle."""
    models = k8s_models()
    k = _kubernetes(plan)
    _refuse_reserved_metadata(plan, k)
    return {
        "namespace": k.namespace,
        "image": k.image,
        "kubernetes_conn_id": k.kubernetes_conn_id,
        "service_account_name": k.service_account,
        "image_pull_policy": k.image_pull_policy,
        "image_pull_secrets": [models.V1LocalObjectReference(name=s) for s in k.image_pull_secrets],
        "container_resources": _resources(k),
        "node_selector": dict(k.node_selector),
        "tolerations": _tolerations(k.tolerations),
        "affinity": _affinity(k),
        "priority_class_name": k.priority_class,
        "labels": {**k.labels, LABEL_PIPELINE: _label_value(plan.dag_id), **kueue_labels(plan)},
        # A training pod evicted by the cluster autoscaler loses the work since its last checkpoint.
        "annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false", **k.annotations},
        "env_from": [models.V1EnvFromSource(secret_ref=models.V1SecretEnvSource(name=s)) for s in k.env_from_secrets],
        # NCCL and DataLoader workers share memory through /dev/shm; the runtime's default is 64Mi.
        "volumes": [models.V1Volume(
            name=SHM_VOLUME, empty_dir=models.V1EmptyDirVolumeSource(medium="Memory", size_limit=k.shm_size))],
        "volume_mounts": [models.V1VolumeMount(name=SHM_VOLUME, mount_path="/dev/shm")],
        "security_context": models.V1PodSecurityContext(
            run_as_non_root=True, run_as_user=k.run_as_user, run_as_group=k.run_as_user, fs_group=k.run_as_user,
            seccomp_profile=models.V1SeccompProfile(type="RuntimeDefault"),
        ),
        "container_security_context": models.V1SecurityContext(
            allow_privilege_escalation=False, capabilities=models.V1Capabilities(drop=["ALL"]),
        ),
        "termination_grace_period": int(k.termination_grace_period.total_seconds()),
        "schedule_timeout_seconds": int(k.schedule_timeout.total_seconds()),
        "startup_timeout_seconds": int(k.startup_timeout.total_seconds()),
        "on_finish_action": k.on_finish_action,
        "get_logs": True,
        "deferrable": True,
        # The pod is the only place the trainer runs: no sidecar, the result comes from storage.
        "do_xcom_push": False,
    }


def _refuse_reserved_metadata(plan: PipelinePlan, k: KubernetesPlan) -> None:
    """The spec stage refuses these keys at their line; checked again here, as the variables are, so a plan
    built another way cannot hand the pod a Vault role, a mesh sidecar or another team's queue."""
    for what, keys in (("label", k.labels), ("annotation", k.annotations)):
        for key in keys:
            problem = metadata_key_problem(key, what=what)
            if problem is not None:
                raise TrainpipeError(f"{plan.dag_id}: pod {what} {key!r} is refused: {problem}")
    resource = k.resources["gpu_resource"]
    if k.resources["gpus"] and not is_accelerator_resource(resource):
        raise TrainpipeError(f"{plan.dag_id}: the GPU resource {resource!r} is refused: it is no accelerator "
                             "device plugin's resource")


def _tolerations(items: tuple[dict[str, Any], ...]) -> list[k8s.V1Toleration]:
    models = k8s_models()
    return [models.V1Toleration(key=t["key"], operator=t["operator"], value=t["value"], effect=t["effect"],
                                toleration_seconds=t["toleration_seconds"]) for t in items]


def try_operator_fields(plan: PipelinePlan, resources: TryResources) -> dict[str, Any]:
    """The operator attributes one try sets over the plan's: its memory (grown after an OOM kill) and its
    placement (spot or on-demand); the same names as the operator's arguments."""
    k = _kubernetes(plan)
    return {
        "container_resources": _resources(k, memory=resources.memory, memory_limit=resources.memory_limit),
        "node_selector": dict(resources.node_selector),
        "tolerations": _tolerations(resources.tolerations),
    }


def container_command(plan: PipelinePlan, launch: TrainerLaunch) -> list[str]:
    """The pod's command: the plan's launch argv, resolved for this run (and, for a multi-node Job,
    its name: c10d rendezvous at the index-0 pod)."""
    return list(_resolved(plan, launch).argv)


def container_env(plan: PipelinePlan, launch: TrainerLaunch) -> list[k8s.V1EnvVar]:
    """The plan's launch environment (as for the local launcher, plus the spec's plain variables),
    then the spec's Secret variables."""
    models = k8s_models()
    k = _kubernetes(plan)
    for name in k.secret_env:
        # The spec stage refuses these at their line; checked again as the plain variables are
        # (plan.launch), so a plan built another way cannot hand a reserved name a Secret's value.
        problem = env_name_problem(name) or reserved_env_reason(name, from_secret=True)
        if problem is not None:
            raise TrainpipeError(f"{plan.dag_id}: secret_env variable {name!r} is refused: {problem}")
    # The kubelet expands $(NAME) in a value from the container's other variables, Secrets included, and
    # reads $$ as $: a spec's value is escaped so it reaches the trainer exactly as written.
    env = [models.V1EnvVar(name=name, value=value.replace("$", "$$") if name in k.env else value)
           for name, value in _resolved(plan, launch).env.items()]
    env += [
        models.V1EnvVar(name=name, value_from=models.V1EnvVarSource(
            secret_key_ref=models.V1SecretKeySelector(name=ref["secret"], key=ref["key"])))
        for name, ref in k.secret_env.items()
    ]
    return env


def _resolved(plan: PipelinePlan, launch: TrainerLaunch):
    return resolve(plan.launch, LaunchValues(
        config_uri=launch.config_uri, mlflow_tracking_uri=launch.mlflow_tracking_uri,
        job_name=job_name(plan, launch) if plan.launch.nnodes > 1 else ""))


def job_operator_kwargs(plan: PipelinePlan) -> dict[str, Any]:
    """KubernetesJobOperator arguments of a multi-node run: one pod per node, all or nothing."""
    k = _kubernetes(plan)
    nnodes = plan.launch.nnodes
    return {
        "completion_mode": "Indexed",
        "completions": nnodes,
        "parallelism": nnodes,
        "backoff_limit": k.max_pod_restarts,
        "ttl_seconds_after_finished": int(k.ttl_after_finished.total_seconds()),
        "wait_until_job_complete": True,
        # The Job name is chosen per run and try (it is also the rendezvous host's subdomain).
        "random_name_suffix": False,
        # Queued: created suspended, Kueue unsuspends it when all its pods fit the quota (all-or-nothing).
        **({"suspend": True} if k.queue is not None else {}),
    }


def pod_failure_policy(*, disruption_ends_try: bool = False,
                       cuda_oom_ends_try: bool = False) -> k8s.V1PodFailurePolicy:
    """Only real failures count against ``backoffLimit``: a pod that was disrupted (preempted, evicted,
    its node drained or shut down: condition ``DisruptionTarget``) or whose trainer stopped for a
    SIGTERM after committing its step (``PREEMPTED_EXIT_CODE``) is replaced without counting it.
    ``disruption_ends_try`` (with ``capacity``): a disrupted pod fails the Job instead, so the try ends
    preempted and the run's later tries can move to on-demand capacity (a replaced pod would ask for
    the same spot capacity again). ``cuda_oom_ends_try`` (with ``on_oom.reduce_batch``): a trainer's CUDA OOM
    (``CUDA_OOM_EXIT_CODE``) fails the Job, whose replaced pod would run out again with the same batch; the
    next try splits it. Needs ``restartPolicy: Never`` in the pod template (KubernetesPodOperator
    sets it)."""
    models = k8s_models()
    return models.V1PodFailurePolicy(rules=[
        models.V1PodFailurePolicyRule(action="FailJob" if disruption_ends_try else "Ignore", on_pod_conditions=[
            models.V1PodFailurePolicyOnPodConditionsPattern(type="DisruptionTarget", status="True")]),
        models.V1PodFailurePolicyRule(action="Ignore", on_exit_codes=models.V1PodFailurePolicyOnExitCodesRequirement(
            operator="In", values=[PREEMPTED_EXIT_CODE])),
        *([models.V1PodFailurePolicyRule(action="FailJob", on_exit_codes=(
            models.V1PodFailurePolicyOnExitCodesRequirement(operator="In", values=[CUDA_OOM_EXIT_CODE])))]
          if cuda_oom_ends_try else []),
    ])


def headless_service(job: k8s.V1Job, *, port: int) -> k8s.V1Service:
    """The Service whose name is the Job pods' subdomain: gives pod 0 the DNS name torchrun rendezvous at."""
    models = k8s_models()
    name = job.metadata.name
    return models.V1Service(
        api_version="v1",
        kind="Service",
        metadata=models.V1ObjectMeta(name=name, namespace=job.metadata.namespace, labels=dict(job.metadata.labels or {})),
        spec=models.V1ServiceSpec(
            cluster_ip="None",
            selector={LABEL_JOB: name},
            # DNS records before the pods are Ready: rendezvous happens before any readiness.
            publish_not_ready_addresses=True,
            ports=[models.V1ServicePort(name="c10d", port=port, target_port=port, protocol="TCP")],
        ),
    )


def to_manifest(obj: Any) -> dict[str, Any]:
    """A kubernetes client object as the dict the API server receives (camelCase, no nulls)."""
    from kubernetes.client import ApiClient

    return ApiClient().sanitize_for_serialization(obj)
