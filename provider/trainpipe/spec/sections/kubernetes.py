"""The ``training.kubernetes`` section of a spec: how the train task's pods are built.

Everything here is plain data; ``trainpipe.kubernetes.builders`` turns it into Kubernetes objects.
Secrets never appear in a spec: ``secret_env`` and ``env_from_secrets`` name Kubernetes Secrets,
and ``env`` refuses names that look like credentials.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, WithJsonSchema, field_validator, model_validator

from trainpipe.quantities import QUANTITY_PATTERN
from trainpipe.spec.environment import looks_like_credential
from trainpipe.spec.pod_keys import (
    ACCELERATOR_RESOURCES,
    METADATA_KEY,
    is_accelerator_resource,
    key_syntax_problem,
    label_value_problem,
    reserved_key_domain,
)
from trainpipe.spec.sections.common import SpecModel
from trainpipe.spec.types import Duration

_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# Names of Secrets, service accounts and priority classes (at most 253 characters).
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_SECRET_DATA_KEY = r"^[-._a-zA-Z0-9]+$"
# What each name pattern means, for error messages.
NAME_PATTERN_MEANINGS = {
    _DNS_LABEL: "a DNS label: lowercase letters, digits and '-', starting and ending with a letter or digit",
    _DNS_SUBDOMAIN: "a DNS subdomain: lowercase letters, digits, '-' and '.', starting and ending with a letter or "
                    "digit (e.g. 'ml-trainer')",
    _SECRET_DATA_KEY: "a Secret key: letters, digits, '-', '_' and '.' only (no '/')",
}
# Kubernetes stores these in int32 fields.
_INT32_MAX = 2**31 - 1
# A container image reference (the distribution/reference grammar): [registry[:port]/]path[:tag][@digest].
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REGISTRY = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?"
_IMAGE_REFERENCE = re.compile(
    rf"^(?:{_REGISTRY}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)
def _quantity(value: Any) -> Any:
    # YAML reads `cpu: 4` as an int and `cpu: 0.5` as a float; Kubernetes wants strings. repr keeps every
    # digit (format "g" rounded 17179869184 to 1.71799e+10) and writes inf and nan as the pattern refuses them.
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        value = repr(value)
    if isinstance(value, str) and not re.fullmatch(QUANTITY_PATTERN, value):
        raise ValueError(f"{value!r} is not a Kubernetes quantity: a non-negative number with an optional unit, such "
                         "as 500m, 4, 16Gi or 512Mi")
    return value


Quantity = Annotated[
    str,
    BeforeValidator(_quantity),
    WithJsonSchema({
        "anyOf": [{"type": "string", "pattern": QUANTITY_PATTERN}, {"type": "number", "minimum": 0}],
        "description": "A Kubernetes quantity: '500m', '4', '16Gi', or a number.",
    }),
]


class ResourceLimitsSpec(SpecModel):
    cpu: Quantity | None = Field(
        default=None, description="CPU limit; none by default (CPU limits throttle data loading).", examples=["48"]
    )
    memory: Quantity | None = Field(
        default=None,
        description="Memory limit; defaults to the memory request (a pod is never OOM-killed above what it asked for).",
        examples=["320Gi"],
    )


class ResourcesSpec(SpecModel):
    gpus: int = Field(
        default=0, ge=0,
        description="GPUs per pod (the `gpu_resource` limit). torchrun starts one process per GPU, so this must "
        "equal training.distributed.nproc_per_node when > 0.",
        examples=[8],
    )
    gpu_resource: str = Field(
        default="nvidia.com/gpu",
        description="Extended resource name of the accelerator on this cluster: nvidia.com/gpu, "
        "nvidia.com/gpu.shared, nvidia.com/mig-<profile>, amd.com/gpu, gpu.intel.com/i915 or xe, habana.ai/gaudi, "
        "aws.amazon.com/neuron, neuroncore or neurondevice, google.com/tpu, huawei.com/Ascend<model>; other "
        "extended resources (host devices) are refused.",
        examples=["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "amd.com/gpu"],
    )
    cpu: Quantity = Field(default="2", description="CPU request per pod.", examples=["32"])
    memory: Quantity = Field(default="8Gi", description="Memory request per pod.", examples=["256Gi"])
    limits: ResourceLimitsSpec = Field(
        default_factory=ResourceLimitsSpec, description="CPU and memory limits; the GPU limit always equals `gpus`.",
        examples=[{"memory": "300Gi"}],
    )

    @field_validator("gpu_resource")
    @classmethod
    def _an_extended_resource(cls, name: str) -> str:
        # The GPU count becomes a limit named this: "cpu" or "memory" would turn it into one of those.
        match = METADATA_KEY.fullmatch(name)
        if match is None or not match.group("prefix") or "." not in match.group("prefix") or reserved_key_domain(name):
            raise ValueError(
                f"{name!r} is not an extended resource name: a device plugin's domain and name, such as "
                "nvidia.com/gpu or amd.com/gpu"
            )
        # Any other extended resource would hand the pod a host device (devices.kubevirt.io/kvm, a NIC).
        if not is_accelerator_resource(name):
            raise ValueError(
                f"{name!r} is not an accelerator resource: the GPU count goes only to an accelerator device plugin's "
                f"resource ({', '.join(ACCELERATOR_RESOURCES)}, where * is the rest of a name such as "
                "mig-1g.10gb); another extended resource would hand the pod a host device: use one of these, "
                "e.g. nvidia.com/gpu"
            )
        return name


class TolerationSpec(SpecModel):
    key: str | None = Field(
        default=None, description="Taint key; omit with operator Exists to tolerate every taint.", examples=["nvidia.com/gpu"]
    )
    operator: Literal["Equal", "Exists"] = Field(
        default="Equal", description="Equal matches `value`; Exists matches any value.", examples=["Exists"]
    )
    value: str | None = Field(default=None, description="Taint value (operator Equal).", examples=["spot"])
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to tolerate; all effects when omitted.", examples=["NoSchedule"]
    )
    toleration_seconds: int | None = Field(
        default=None, ge=0, le=2**63 - 1,
        description="NoExecute only: how long the pod stays bound after the taint appears.", examples=[300]
    )

    @model_validator(mode="after")
    def _as_kubernetes_admits(self) -> TolerationSpec:
        # The API server refuses these only when the pod is created, long after the DAG was parsed.
        if self.key is not None and (problem := key_syntax_problem(self.key, what="taint")) is not None:
            raise ValueError(problem)
        if self.operator == "Exists" and self.value is not None:
            raise ValueError("operator Exists matches any value of the taint: remove value, or use operator Equal")
        if self.operator == "Equal" and self.key is None:
            raise ValueError("a toleration without a key tolerates every taint and needs operator Exists: add the "
                             "taint's key, or set operator: Exists")
        if self.value is not None and (problem := label_value_problem(self.value, what="taint")) is not None:
            raise ValueError(problem)
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("toleration_seconds applies only to effect NoExecute (how long a pod stays after the taint "
                             "appears): set effect: NoExecute, or remove toleration_seconds")
        return self


class NodeRequirementSpec(SpecModel):
    key: str = Field(description="Node label key.", examples=["node.kubernetes.io/instance-type"])
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"] = Field(
        default="In", description="How the label is matched.", examples=["In"]
    )
    values: list[str] = Field(default_factory=list, description="Label values (In, NotIn, Gt, Lt).", examples=[["p4d.24xlarge"]])

    @model_validator(mode="after")
    def _as_kubernetes_admits(self) -> NodeRequirementSpec:
        if (problem := key_syntax_problem(self.key, what="node label")) is not None:
            raise ValueError(problem)
        if self.operator in ("In", "NotIn"):
            if not self.values:
                raise ValueError(f"operator {self.operator} needs values: list the node label values to match, or use "
                                 "operator Exists")
            for value in self.values:
                if (problem := label_value_problem(value)) is not None:
                    raise ValueError(problem)
        elif self.operator in ("Exists", "DoesNotExist"):
            if self.values:
                raise ValueError(f"operator {self.operator} looks at the key only: remove values, or use operator In")
        elif len(self.values) != 1 or not re.fullmatch(r"[-+]?[0-9]+", self.values[0]):
            raise ValueError(f"operator {self.operator} compares the node label with one whole number: write "
                             "values: ['8'] (one value)")
        return self


class PreferredNodeSpec(NodeRequirementSpec):
    weight: int = Field(default=100, ge=1, le=100, description="Preference weight, 1-100.", examples=[100])


class AffinitySpec(SpecModel):
    required: list[NodeRequirementSpec] = Field(
        default_factory=list,
        description="Node labels a pod must match (all of them): hard placement.",
        examples=[[{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["p4d.24xlarge"]}]],
    )
    preferred: list[PreferredNodeSpec] = Field(
        default_factory=list,
        description="Node labels a pod should match: soft placement, e.g. prefer spot capacity.",
        examples=[[{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"], "weight": 100}]],
    )


class SecretKeySpec(SpecModel):
    secret: str = Field(
        max_length=253, pattern=_DNS_SUBDOMAIN, description="Name of the Kubernetes Secret.",
        examples=["mlflow-credentials"],
    )
    key: str = Field(max_length=253, pattern=_SECRET_DATA_KEY, description="Key inside the Secret.", examples=["token"])


class OnOomSpec(SpecModel):
    memory_factor: float = Field(
        default=1.5, gt=1, le=4,
        description="After a try whose pod was OOM-killed (reason OOMKilled), the next try asks for the memory "
        "request and limit of the try before it times this (compounding per OOM-killed try), up to max_memory.",
        examples=[1.5],
    )
    max_memory: Quantity = Field(
        description="The most memory (request and limit) a grown try asks for; at least resources.memory and "
        "within the platform policy's kubernetes.max_memory_per_pod.",
        examples=["512Gi"],
    )
    reduce_batch: bool = Field(
        default=False,
        description="After a try that ended with the trainer's CUDA out-of-memory error, the next try trains with "
        "half the batch_size and twice the gradient_accumulation_steps (per such try, while batch_size divides): "
        "the same samples per optimizer step, so the result stays comparable and the checkpoint resumes. Needs an "
        "even training.batch_size. Unset: a CUDA OOM is retried with the same batch (more pod memory does not "
        "help the GPU's).",
        examples=[True],
    )


class PlacementSpec(SpecModel):
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels of this capacity, added to training.kubernetes.node_selector.",
        examples=[{"karpenter.sh/capacity-type": "spot"}],
    )
    tolerations: list[TolerationSpec] = Field(
        default_factory=list, description="Taints of this capacity the pods tolerate, added to "
        "training.kubernetes.tolerations.",
        examples=[[{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}]],
    )


class CapacitySpec(SpecModel):
    spot: PlacementSpec = Field(
        description="Where the tries run first: spot (preemptible) capacity, priced with the policy's spot_discount.",
        examples=[{"node_selector": {"karpenter.sh/capacity-type": "spot"}}],
    )
    on_demand: PlacementSpec = Field(
        description="Where the tries run once on_demand_after_preemptions tries of the run were preempted.",
        examples=[{"node_selector": {"karpenter.sh/capacity-type": "on-demand"}}],
    )
    on_demand_after_preemptions: int = Field(
        default=2, ge=1,
        description="Preempted tries in one DAG run after which the next tries run on on_demand capacity.",
        examples=[2],
    )


# The longest each wait of a pod may be, and what a longer one holds (KubernetesSpec._a_bounded_wait).
_LONGEST_WAITS = {
    "termination_grace_period": (timedelta(hours=1), "a stopped pod would keep its GPUs that long"),
    "schedule_timeout": (timedelta(days=7), "an unschedulable pod would hold the train task's pool slot that long"),
    "startup_timeout": (timedelta(days=1), "a pod that cannot start would hold its node and the task's slot that long"),
    "ttl_after_finished": (timedelta(days=30), "finished Jobs and their pods would pile up in the namespace"),
}


def _duration_text(value: timedelta) -> str:
    return f"{value.days}d" if value.days and not value.seconds else f"{int(value.total_seconds() // 3600)}h"


def _secret_ref(value: Any) -> Any:
    # Friendly form "secret-name/key".
    if isinstance(value, str):
        name, sep, key = value.partition("/")
        if not sep or not name or not key:
            raise ValueError(f"expected 'SECRET_NAME/KEY' or {{secret: ..., key: ...}}, got {value!r}")
        return {"secret": name, "key": key}
    return value


SecretRef = Annotated[
    SecretKeySpec,
    BeforeValidator(_secret_ref),
    WithJsonSchema({
        "anyOf": [
            {"type": "string", "pattern": rf"{_DNS_SUBDOMAIN[:-1]}/{_SECRET_DATA_KEY[1:]}"},
            {"type": "object", "properties": {
                "secret": {"type": "string", "maxLength": 253, "pattern": _DNS_SUBDOMAIN,
                           "description": "Name of the Kubernetes Secret.", "examples": ["mlflow-credentials"]},
                "key": {"type": "string", "maxLength": 253, "pattern": _SECRET_DATA_KEY,
                        "description": "Key inside the Secret.", "examples": ["token"]},
            }, "required": ["secret", "key"], "additionalProperties": False},
        ],
        "description": "A key of a Kubernetes Secret: 'secret-name/key' or {secret: ..., key: ...}.",
    }),
]


class KubernetesSpec(SpecModel):
    image: str = Field(description="Trainer image (see trainer_image/README.md).", examples=["ghcr.io/trainpipe/trainer:0.1.0"])
    namespace: str = Field(
        default="default", max_length=63, pattern=_DNS_LABEL, description="Namespace of the training pods.",
        examples=["ml-training"]
    )
    kubernetes_conn_id: str = Field(
        default="kubernetes_default",
        description="Airflow connection (type kubernetes) to the cluster; in-cluster or kubeconfig.",
        examples=["kubernetes_default"],
    )
    service_account: str | None = Field(
        default=None, max_length=253, pattern=_DNS_SUBDOMAIN,
        description="Service account of the pods (e.g. one bound to a cloud role for the bucket).",
        examples=["trainer"],
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default="IfNotPresent", description="Kubernetes imagePullPolicy.", examples=["IfNotPresent"]
    )
    image_pull_secrets: list[Annotated[str, Field(max_length=253, pattern=_DNS_SUBDOMAIN)]] = Field(
        default_factory=list, description="Secrets (docker-registry) used to pull the image.", examples=[["ghcr-pull"]]
    )
    resources: ResourcesSpec = Field(
        default_factory=ResourcesSpec,
        description="Per-pod GPUs, CPU and memory.",
        examples=[{"gpus": 8, "cpu": "32", "memory": "256Gi"}],
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict,
        description="Node labels the pods must have.",
        examples=[{"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}],
    )
    tolerations: list[TolerationSpec] = Field(
        default_factory=list,
        description="Taints the pods tolerate (GPU pools, spot/preemptible pools are usually tainted).",
        examples=[[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]],
    )
    affinity: AffinitySpec = Field(
        default_factory=AffinitySpec, description="Node affinity: required and preferred node labels.",
        examples=[{"preferred": [{"key": "cloud.google.com/gke-spot", "values": ["true"]}]}],
    )
    priority_class: str | None = Field(
        default=None, max_length=253, pattern=_DNS_SUBDOMAIN, description="PriorityClass of the pods.",
        examples=["training-high"],
    )
    queue: str | None = Field(
        default=None, max_length=63, pattern=_DNS_LABEL,
        description="Kueue LocalQueue (in the pods' namespace) the training waits in: the Job or pod is labelled "
        "kueue.x-k8s.io/queue-name and created suspended, and Kueue starts it when the whole of it fits the "
        "ClusterQueue's quota (all pods at once).",
        examples=["team-a-gpus"],
    )
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="Extra pod labels (cost allocation, ownership). Keys the cluster's controllers and webhooks read "
        "are refused: the domains of Kubernetes (kubernetes.io, k8s.io incl. Kueue's), trainpipe.io, cloud "
        "identities, secret injectors (Vault), service meshes and instrumentation, batch schedulers (Volcano, "
        "YuniKorn, Run:ai), Karpenter, training operators, admission policies, and the plain keys schedulers read "
        "(queue, applicationId, project, ...); docs/kubernetes.md lists them. The Kueue queue is `queue`, the "
        "priority `priority`. The platform policy may list the keys allowed.",
        examples=[{"cost-center": "risk-1234"}],
    )
    annotations: dict[str, str] = Field(
        default_factory=dict,
        description="Extra pod annotations; keys as for `labels` (the same domains are refused).",
        examples=[{"team": "risk-ml"}],
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Plain environment variables of the trainer: tuning (NCCL_DEBUG, ...). Never secrets: use secret_env "
        "or env_from_secrets. Names trainpipe or torchrun set, and those that redirect code, credentials or outputs "
        "(MLFLOW_*, AWS_*, TRAINPIPE_*, LD_*, PYTHON*, KUBERNETES_*, PATH, HOME, MASTER_ADDR, RANK, ...) are refused.",
        examples=[{"NCCL_DEBUG": "WARN", "NCCL_SOCKET_IFNAME": "eth0"}],
    )
    secret_env: dict[str, SecretRef] = Field(
        default_factory=dict,
        description="Environment variables read from a Kubernetes Secret: NAME: 'secret-name/key'.",
        examples=[{"MLFLOW_TRACKING_TOKEN": "mlflow-credentials/token"}],
    )
    env_from_secrets: list[Annotated[str, Field(max_length=253, pattern=_DNS_SUBDOMAIN)]] = Field(
        default_factory=list,
        description="Secrets whose every key becomes an environment variable (e.g. AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY).",
        examples=[["training-bucket-credentials"]],
    )
    shm_size: Quantity = Field(
        default="16Gi",
        description="Size of the memory-backed /dev/shm (NCCL and data loader workers need more than the container "
        "default 64Mi). It counts against the pod's memory.",
        examples=["16Gi"],
    )
    run_as_user: int = Field(
        default=1000, ge=1, le=_INT32_MAX, description="Non-root UID of the trainer (the image's `trainer` user).",
        examples=[1000],
    )
    on_finish_action: Literal["delete_pod", "delete_succeeded_pod", "keep_pod"] = Field(
        default="delete_succeeded_pod",
        description="What happens to the pods (multi-node: the Job) when training ends: failed ones are kept for "
        "debugging by default. The headless Service is always deleted.",
        examples=["delete_succeeded_pod"],
    )
    schedule_timeout: Duration = Field(
        default=timedelta(minutes=30), description="How long a pod may stay unscheduled (GPU node scale-up); at most 7d.",
        examples=["30m"]
    )
    startup_timeout: Duration = Field(
        default=timedelta(minutes=15), description="How long a scheduled pod may take to start (image pull); at most 1d.",
        examples=["15m"]
    )
    log_interval: Duration = Field(
        default=timedelta(minutes=2),
        description="Single node: how often the deferred train task wakes up to copy new pod log lines into the task log.",
        examples=["2m"],
    )
    termination_grace_period: Duration = Field(
        default=timedelta(minutes=2), description="Time between SIGTERM and SIGKILL when a pod is stopped; at most 1h.",
        examples=["2m"]
    )
    max_pod_restarts: int = Field(
        default=0, ge=0, le=_INT32_MAX,
        description="Multi-node: pod failures the Job tolerates (backoffLimit; torchrun --max_restarts). A restarted "
        "pod resumes from the latest checkpoint. 0 fails fast and leaves recovery to the Airflow retry.",
        examples=[0],
    )
    ttl_after_finished: Duration = Field(
        default=timedelta(hours=24),
        description="Multi-node: Kubernetes deletes a finished Job (and its pods) this long after it ended, when it was "
        "kept; at most 30d.",
        examples=["24h"],
    )
    rendezvous_port: int = Field(
        default=29500, ge=1024, le=65535, description="Multi-node: c10d rendezvous port on the index-0 pod.", examples=[29500]
    )
    on_oom: OnOomSpec | None = Field(
        default=None,
        description="Retry with more memory: after a try whose pod was OOM-killed, the next try's memory request "
        "and limit are multiplied by memory_factor, up to max_memory; with reduce_batch, after a CUDA OOM the next "
        "try splits its batch into more accumulation steps (the run note says what changed). Unset: every try "
        "asks for the same memory and trains with the same batch.",
        examples=[{"memory_factor": 1.5, "max_memory": "512Gi"}],
    )
    capacity: CapacitySpec | None = Field(
        default=None,
        description="Spot capacity with an on-demand fallback: tries run with the spot placement until "
        "on_demand_after_preemptions tries of the DAG run were preempted, then with the on_demand placement.",
        examples=[{"spot": {"node_selector": {"karpenter.sh/capacity-type": "spot"}},
                   "on_demand": {"node_selector": {"karpenter.sh/capacity-type": "on-demand"}},
                   "on_demand_after_preemptions": 2}],
    )

    @field_validator(*_LONGEST_WAITS)
    @classmethod
    def _a_bounded_wait(cls, value: timedelta, info: Any) -> timedelta:
        # A year-long wait is a mistake, or a way to hold what the cluster shares.
        longest, holds = _LONGEST_WAITS[info.field_name]
        if value > longest:
            raise ValueError(f"at most {_duration_text(longest)}: longer, {holds}")
        return value

    @field_validator("image")
    @classmethod
    def _an_image_reference(cls, image: str) -> str:
        # Judged by the policy's image globs as text: only a real reference means what it reads.
        if not _IMAGE_REFERENCE.fullmatch(image):
            raise ValueError(
                f"{image!r} is not a container image reference: [registry[:port]/]name[:tag][@sha256:digest], e.g. "
                "ghcr.io/trainpipe/trainer:0.1.0 (lower-case name, no spaces)"
            )
        return image

    @field_validator("env")
    @classmethod
    def _no_literal_secrets(cls, env: dict[str, str]) -> dict[str, str]:
        for name in env:
            if looks_like_credential(name):
                raise ValueError(
                    f"{name!r} looks like a credential; never put secrets in a spec: move it to "
                    f"secret_env ({name}: SECRET_NAME/KEY) or env_from_secrets"
                )
        return env
