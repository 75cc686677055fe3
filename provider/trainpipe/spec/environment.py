"""Environment names a spec may not set: what the launch, torchrun and the platform own.

The spec stage refuses them (``training.kubernetes.env``, ``secret_env``); ``trainpipe.plan.launch``
sets the trainer's own. Airflow-free.
"""

from __future__ import annotations

from trainpipe_trainer.config import SHUTDOWN_TIMEOUT_ENV

TRACKING_URI = "{mlflow_tracking_uri}"


def trainer_environment() -> tuple[tuple[str, str], ...]:
    """Variables the trainer needs wherever it runs (never secrets: pods get those from Secrets)."""
    return (
        ("MLFLOW_TRACKING_URI", TRACKING_URI),
        ("MLFLOW_DISABLE_TELEMETRY", "true"),
        # Progress bars are noise in a task log.
        ("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false"),
        ("PYTHONUNBUFFERED", "1"),
        # One BLAS thread per rank: torchrun starts one process per core/GPU already.
        ("OMP_NUM_THREADS", "1"),
    )


# torchrun's rendezvous and rank variables (torch.distributed.run) and the one the Job controller sets
# in each pod of an Indexed Job: the launch sets them, a spec never does.
TORCHRUN_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "NODE_RANK", "JOB_COMPLETION_INDEX")
# Names a spec's environment (training.kubernetes.env, secret_env) may not set, with why. Exact names
# first, then prefixes; compared in upper case. Tuning knobs (NCCL_*, CUDA_*, TORCH_NCCL_*) stay allowed.
# How long torchrun lets its workers commit after SIGTERM (the launch sets it from the grace period).
_RESERVED_NAMES = {
    **{name: "trainpipe sets it for the trainer" for name, _ in trainer_environment()},
    SHUTDOWN_TIMEOUT_ENV: "trainpipe sets it from the grace period (training.kubernetes.termination_grace_period)",
    **{name: "torchrun sets it for each rank" for name in TORCHRUN_ENV},
    "PATH": "it chooses which programs run", "HOME": "it redirects the user's configuration and credentials files",
    "SHELL": "it chooses which program runs", "TMPDIR": "it redirects temporary files",
    "TORCH_EXTENSIONS_DIR": "it chooses which compiled code torch loads",
    **{name: "it redirects network traffic" for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")},
    **{name: "it replaces the trusted certificates" for name in ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE",
                                                                 "CURL_CA_BUNDLE")},
}
_RESERVED_PREFIXES = {
    "MLFLOW_": "it redirects the tracking server or its credentials",
    "AWS_": "it redirects storage or its credentials",
    "GOOGLE_": "it redirects cloud credentials", "AZURE_": "it redirects cloud credentials",
    "FSSPEC_": "it redirects storage",
    "TRAINPIPE_": "it is a trainpipe setting, the platform's",
    "AIRFLOW_": "it is an Airflow setting, the platform's",
    "LD_": "it makes the dynamic loader run other code", "DYLD_": "it makes the dynamic loader run other code",
    "PYTHON": "it changes which code the interpreter runs",
    "KUBERNETES_": "it redirects cluster access",
    "TORCHELASTIC_": "torchrun sets it",
}
# Credentials and endpoints may come from a platform-owned Secret (secret_env) though never from plain text.
_FROM_SECRETS_ALLOWED = ("MLFLOW_", "AWS_", "GOOGLE_", "AZURE_")


def reserved_env_reason(name: str, *, from_secret: bool = False) -> str | None:
    """Why a spec may not set environment variable ``name`` (None: it may). ``from_secret``: the
    value comes from a Kubernetes Secret (``secret_env``), where credentials and endpoints are allowed
    but not what trainpipe or torchrun set, nor what changes which code runs."""
    upper = name.upper()
    if upper in _RESERVED_NAMES:
        return _RESERVED_NAMES[upper]
    for prefix, reason in _RESERVED_PREFIXES.items():
        if upper.startswith(prefix) and not (from_secret and prefix in _FROM_SECRETS_ALLOWED):
            return reason
    return None
