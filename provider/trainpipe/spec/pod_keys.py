"""Pod label and annotation keys, and the GPU resource a spec may name: what the cluster's controllers and
admission webhooks act on is refused. Plain functions without pydantic or Airflow: the spec stage judges
each key at its line (``trainpipe.spec.sections.kubernetes``), and the pod builder again before any pod is
made (``trainpipe.kubernetes.builders``), so a plan made without the spec stage cannot set them either."""

from __future__ import annotations

import re

# A label or annotation key: an optional DNS-subdomain prefix and "/", then a name (Kubernetes' syntax).
METADATA_KEY = re.compile(
    r"^(?:(?P<prefix>[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)/)?"
    r"(?P<name>[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$"
)
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
# Label and annotation keys a spec may not set: what the cluster's own controllers and admission webhooks
# act on. The one list: the spec stage refuses these at the key, and docs/kubernetes.md prints it. Each
# group: the domains (a key's prefix is one of them or a subdomain, e.g. vault.hashicorp.com), what a key
# there would hand the pod, and the fix.
RESERVED_KEY_GROUPS: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (("kubernetes.io", "k8s.io", "x-k8s.io"),
     "Kubernetes and its SIG projects take AppArmor and seccomp profiles, the autoscaler's safe-to-evict, "
     "Kueue's queue and priority and JobSet's and the coscheduler's groups from it",
     "use training.kubernetes.queue for a Kueue queue and priority for a priority"),
    (("trainpipe.io",),
     "trainpipe's own Jobs and Services select their pods by it, so the pod would join another run's",
     "trainpipe sets its own"),
    (("amazonaws.com", "gke.io", "azure.com", "azure.workload.identity", "k8s.aws", "spiffe.io"),
     "a cloud identity webhook would give the pod the cloud role or workload identity the key names",
     "the pods' identity is service_account, which the policy judges"),
    (("hashicorp.com", "banzaicloud.io", "bank-vaults.io", "1password.io", "conjur.org"),
     "a secret injector (Vault's agent injector, Consul, Bank-Vaults, 1Password, Conjur) would run a container "
     "with the image the key names and fetch the secrets of the role it names",
     "Secrets reach the trainer through secret_env and env_from_secrets, which the policy judges"),
    (("istio.io", "linkerd.io", "kuma.io", "dapr.io", "opentelemetry.io", "datadoghq.com", "jaegertracing.io",
      "newrelic.com"),
     "a service mesh, Dapr or an instrumentation webhook (OpenTelemetry, Datadog) would inject a sidecar, init "
     "container or library with the image, app identity and traffic routing the key names",
     "the platform switches these on per namespace"),
    (("volcano.sh", "yunikorn.apache.org", "run.ai", "runai", "kai.scheduler", "koordinator.sh"),
     "a batch scheduler (Volcano, YuniKorn, Run:ai and KAI, Koordinator) would give the pod the queue, gang "
     "group, user, priority or GPU share the key names, on another team's quota",
     "use training.kubernetes.queue for a Kueue queue and priority for a priority"),
    (("karpenter.sh",),
     "Karpenter would keep the pod's node from being consolidated, drained or expired (do-not-disrupt)",
     "how long a node lives is the platform's"),
    (("kubeflow.org", "ray.io", "argoproj.io"),
     "a training operator (Kubeflow, KubeRay) or Argo would count the pod in the job, workflow or rollout the key "
     "names and send it that one's traffic",
     "use a key of your own (example.com/job)"),
    (("openshift.io", "kyverno.io", "gatekeeper.sh", "cert-manager.io"),
     "an admission policy (OpenShift's security context constraints, Kyverno, Gatekeeper) or cert-manager would "
     "admit the pod under another constraint or policy exception, or issue it a certificate",
     "admission is the platform's"),
    (("fluentbit.io", "co.elastic.logs", "co.elastic.metrics", "co.elastic.hints"),
     "the log pipeline (Fluent Bit, Elastic's autodiscover) would drop the pod's logs or parse them as the key says",
     "which logs are collected is the platform's"),
    (("cncf.io", "projectcalico.org", "cilium.io", "antrea.io"),
     "the network plugin (Multus, Calico, Cilium, Antrea) would attach the pod to another network, give it the "
     "IP address or pool the key names, or change its network policy",
     "the pods' network is the platform's"),
    (("gke-gcsfuse", "hami.io", "kruise.io"),
     "a storage or device webhook (GKE's Cloud Storage FUSE, HAMi's GPU sharing) or OpenKruise would inject a "
     "sidecar, a device share or an in-place update the key names",
     "storage reaches the trainer through data.uri, GPUs through resources.gpus"),
)
RESERVED_KEY_DOMAINS: tuple[str, ...] = tuple(domain for domains, _, _ in RESERVED_KEY_GROUPS for domain in domains)
# Keys without a domain that schedulers read, refused in labels and annotations alike (compared ignoring case),
# with what each hands the pod and the fix. Volcano reads domain keys only (volcano.sh, scheduling.k8s.io).
RESERVED_PLAIN_KEY_GROUPS: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (("queue", "applicationId", "spark-app-selector", "disableStateAware"),
     "YuniKorn would put the pod in the queue or application the value names, on another team's quota",
     "use training.kubernetes.queue for a Kueue queue, or a key with a domain of your own (example.com/queue)"),
    (("project", "pod-group-name", "gpu-fraction", "gpu-memory", "gpu-fraction-num-devices"),
     "Run:ai and the KAI scheduler would put the pod in the project or pod group the value names, on its quota, "
     "or give it a GPU share that no resources.gpus asked for",
     "use resources.gpus, or a key with a domain of your own (example.com/project)"),
)
RESERVED_PLAIN_KEYS: tuple[str, ...] = tuple(key for keys, _, _ in RESERVED_PLAIN_KEY_GROUPS for key in keys)


# The resources the GPU count may go to without a platform policy: accelerator device plugins' own names.
# Exact names, not whole domains: nvidia.com also names the network operator's RDMA and SR-IOV NICs
# (nvidia.com/rdma_shared_device_a), gpu.intel.com the monitoring handle that opens every GPU of a node
# (i915_monitoring), and any other extended resource a host device (devices.kubevirt.io/kvm, github.com/fuse).
# A "*" stands for the rest of a resource name (letters, digits, '-', '_', '.').
ACCELERATOR_RESOURCES: tuple[str, ...] = (
    "nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-*",  # GPUs, time-sliced GPUs, MIG profiles
    "amd.com/gpu",
    "gpu.intel.com/i915", "gpu.intel.com/xe",
    "habana.ai/gaudi",  # Intel Gaudi
    "aws.amazon.com/neuron", "aws.amazon.com/neuroncore", "aws.amazon.com/neurondevice",  # Trainium, Inferentia
    "google.com/tpu",
    "huawei.com/Ascend*",  # Ascend NPUs (Ascend910, Ascend910B, Ascend310P, ...)
)
_ACCELERATOR_RESOURCE = re.compile(
    "|".join(re.escape(name).replace(r"\*", "[-A-Za-z0-9_.]*") for name in ACCELERATOR_RESOURCES)
)


def is_accelerator_resource(name: str) -> bool:
    """Whether ``name`` is one of ``ACCELERATOR_RESOURCES`` (case matters: resource names are exact)."""
    return _ACCELERATOR_RESOURCE.fullmatch(name) is not None


def reserved_key_domain(key: str) -> str | None:
    """The reserved domain a label or annotation key's prefix falls in, if any."""
    prefix = key.partition("/")[0].lower() if "/" in key else ""
    for domain in RESERVED_KEY_DOMAINS:
        if prefix == domain or prefix.endswith("." + domain):
            return domain
    return None


def _reserved_key_reason(key: str) -> str | None:
    """Why a spec may not set the label or annotation ``key``, with the fix; None when it may."""
    domain = reserved_key_domain(key)
    for domains, hands_over, fix in RESERVED_KEY_GROUPS:
        if domain in domains:
            return (f"{key!r} is in the domain {domain}, which the cluster's own controllers read: {hands_over}; "
                    f"remove it: {fix}")
    if "/" not in key:
        for keys, hands_over, fix in RESERVED_PLAIN_KEY_GROUPS:
            if key.lower() in (reserved.lower() for reserved in keys):
                return (f"{key!r} is a key without a domain which the cluster's own controllers read: {hands_over}; "
                        f"remove it: {fix}")
    return None


def key_syntax_problem(key: str, *, what: str) -> str | None:
    """Why ``key`` is not a Kubernetes qualified name (label, annotation, node label or taint key)."""
    match = METADATA_KEY.fullmatch(key)
    if match is None or len(key.rpartition("/")[2]) > 63 or len(match.group("prefix") or "") > 253:
        return (f"{key!r} is not a Kubernetes {what} key: an optional lowercase DNS prefix and '/', then a name of at "
                "most 63 letters, digits, '-', '_' or '.' (e.g. 'team' or 'example.com/cost-center')")
    return None


def metadata_key_problem(key: str, *, what: str) -> str | None:
    """Why ``key`` cannot be a pod label or annotation key of a spec (None when it can)."""
    malformed = key_syntax_problem(key, what=what)
    if malformed is not None:
        return malformed
    return _reserved_key_reason(key)


def label_value_problem(value: str, *, what: str = "label") -> str | None:
    if len(value) > 63 or not _LABEL_VALUE.fullmatch(value):
        return (f"{value!r} is not a Kubernetes {what} value: at most 63 letters, digits, '-', '_' or '.', starting and "
                "ending with a letter or digit")
    return None
