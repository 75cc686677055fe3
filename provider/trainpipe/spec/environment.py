"""Environment names a spec may not set: what the launch, torchrun and the platform own.

The spec stage refuses them (``training.kubernetes.env``, ``secret_env``); ``trainpipe.plan.launch``
sets the trainer's own. Airflow-free.
"""

from __future__ import annotations

import re

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
# Names a spec's environment (training.kubernetes.env, secret_env) may not set, with why: exact names,
# then prefixes, then suffixes; compared in upper case (proxies are read in lower case too). Tuning
# knobs (NCCL_DEBUG, NCCL_SOCKET_IFNAME, CUDA_*, TORCH_NCCL_*, MALLOC_ARENA_MAX, ...) stay allowed.
_RESERVED_NAMES = {
    **{name: "trainpipe sets it for the trainer" for name, _ in trainer_environment()},
    # How long torchrun lets its workers commit after SIGTERM (the launch sets it from the grace period).
    SHUTDOWN_TIMEOUT_ENV: "trainpipe sets it from the grace period (training.kubernetes.termination_grace_period)",
    **{name: "torchrun sets it for each rank" for name in TORCHRUN_ENV},
    "PATH": "it chooses which programs run", "HOME": "it redirects the user's configuration and credentials files",
    # Programs that a shell, git, pydoc or webbrowser start by these names.
    **{name: "it chooses which program runs" for name in ("SHELL", "EDITOR", "VISUAL", "PAGER", "MANPAGER",
                                                          "BROWSER")},
    # Python's tempfile falls back to TEMP and TMP; torch.compile's and Triton's caches default to it.
    **{name: "it redirects temporary files" for name in ("TMPDIR", "TMP", "TEMP")},
    "TORCH_EXTENSIONS_DIR": "it chooses which compiled code torch loads",
    # curl's and gRPC's (the NCCL/gRPC clients) besides the HTTP ones.
    **{name: "it redirects network traffic" for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY",
                                                         "FTP_PROXY", "WS_PROXY", "WSS_PROXY", "GRPC_PROXY",
                                                         "NO_GRPC_PROXY")},
    **{name: "it replaces the trusted certificates" for name in ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE",
                                                                 "CURL_CA_BUNDLE")},
    # The rest of glibc's list of variables it ignores in setuid programs (unsecvars.h): each loads
    # modules or files, reconfigures the library, or redirects name resolution. MALLOC_ARENA_MAX & co stay.
    **{name: "it makes the C library load other code or files" for name in ("GCONV_PATH", "GETCONF_DIR", "LOCPATH",
                                                                            "NLSPATH", "NIS_PATH", "TZDIR")},
    "GLIBC_TUNABLES": "it reconfigures the C library and the dynamic loader",
    "MALLOC_TRACE": "it makes the C library write a trace file",
    **{name: "it redirects host name resolution" for name in ("HOSTALIASES", "LOCALDOMAIN", "RES_OPTIONS",
                                                              "RESOLV_HOST_CONF")},
    # Shells run the file ENV/BASH_ENV names at start, and SHELLOPTS=xtrace runs PS4's substitutions.
    **{name: "it makes a shell run other code" for name in ("ENV", "SHELLOPTS", "BASHOPTS", "PS4")},
    # Other interpreters' start-up options and library paths (a subprocess may be one of them).
    **{name: "it makes an interpreter load other code" for name in ("PERL5OPT", "PERL5LIB", "PERLLIB", "PERL5DB",
                                                                   "RUBYOPT", "RUBYLIB", "NODE_OPTIONS",
                                                                   "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS")},
    # Writes every TLS session key: whoever reads the file decrypts the traffic, credentials included.
    "SSLKEYLOGFILE": "it writes the TLS session keys to a file",
    # Where cloud SDKs and HTTP clients find credentials, or the servers that hand them out.
    **{name: "it redirects credentials or their endpoint" for name in ("NETRC", "KUBECONFIG", "STORAGE_EMULATOR_HOST",
                                                                      "IDENTITY_ENDPOINT", "IMDS_ENDPOINT",
                                                                      "MSI_ENDPOINT")},
    # NCCL's bootstrap root (ranks would rendezvous at that address) and its status listener.
    "NCCL_COMM_ID": "it redirects NCCL's rendezvous", "NCCL_RAS_ADDR": "it exposes NCCL's status on another address",
    # torch's logging and tracing outputs (their *_DIR and *_FILE siblings are caught by suffix).
    **{name: "it redirects torch's logs or traces" for name in ("TORCH_LOGS_OUT", "TORCH_TRACE")},
    # Configuration folders without the _DIR suffix below (matplotlibrc can name a backend module to import).
    **{name: "it makes a library load other configuration" for name in ("MPLCONFIGDIR", "IPYTHONDIR")},
}
_RESERVED_PREFIXES = {
    "MLFLOW_": "it redirects the tracking server or its credentials",
    "AWS_": "it redirects storage or its credentials",
    "GOOGLE_": "it redirects cloud credentials", "AZURE_": "it redirects cloud credentials",
    "GCE_METADATA_": "it redirects cloud credentials",
    "FSSPEC_": "it redirects storage",
    "TRAINPIPE_": "it is a trainpipe setting, the platform's",
    "AIRFLOW_": "it is an Airflow setting, the platform's",
    "LD_": "it makes the dynamic loader run other code", "DYLD_": "it makes the dynamic loader run other code",
    "PYTHON": "it changes which code the interpreter runs",
    "KUBERNETES_": "it redirects cluster access",
    "TORCHELASTIC_": "torchrun sets it",
    # TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD makes torch.load unpickle anything: a checkpoint could run code.
    "TORCH_FORCE_": "it switches off torch.load's safe loading",
    # Exported functions (BASH_FUNC_name%%), BASH_ENV, BASH_LOADABLES_PATH (builtins from a .so), ...
    "BASH_": "it makes a shell run other code",
    # OPENSSL_CONF can load engines and providers; OPENSSL_ENGINES and OPENSSL_MODULES name their folders.
    "OPENSSL_": "it makes OpenSSL load other code or configuration",
    # The NVIDIA container runtime reads them as it creates the container (NVIDIA_VISIBLE_DEVICES=all: every GPU).
    "NVIDIA_": "it chooses the GPUs and driver files the container gets, the platform's",
    "CUDA_MPS_": "it connects to the GPU-sharing daemon, the platform's",
    # Compiled kernels are loaded from these caches (local or remote); TRITON_* also picks ptxas and libcuda.
    "TORCHINDUCTOR_": "it chooses which compiled code torch loads",
    "TRITON_": "it chooses which compiled code or compiler Triton uses",
    "KINETO_": "it redirects the profiler's configuration or outputs",
    "OMP_TOOL": "it makes the OpenMP runtime load a tool library",
    # The whole hub family: endpoint, caches (HF_MODULES_CACHE is imported code), tokens, remote-code switches.
    **{prefix: "it redirects the model hub, its caches or credentials" for prefix in ("HF_", "HUGGING_FACE_",
                                                                                     "HUGGINGFACE_", "TRANSFORMERS_")},
    "XDG_": "it redirects the user's configuration, cache and data folders",
    # GIT_SSH_COMMAND, GIT_CONFIG_*, GIT_ASKPASS, GIT_PYTHON_GIT_EXECUTABLE (MLflow records the commit).
    "GIT_": "it chooses which programs, configuration or credentials git uses",
    "SSH_": "it chooses which program or key agent ssh uses",
    "KRB5": "it redirects Kerberos configuration or credentials",
    **{prefix: "it redirects package indexes or installs" for prefix in ("PIP_", "UV_", "CONDA_")},
}
# A name ending so names a file, folder or library the process loads or writes: NCCL's plugins and
# files (NCCL_NET_PLUGIN, NCCL_TOPO_FILE, NCCL_CONF_FILE), CUDA's injection libraries and JIT cache
# (CUDA_INJECTION64_PATH, CUDA_CACHE_PATH), torch's caches (TORCH_HOME, PYTORCH_KERNEL_CACHE_PATH), and
# the next library's, whose name nobody listed yet.
_RESERVED_SUFFIXES = ("_PATH", "_DIR", "_DIRS", "_DIRECTORY", "_FILE", "_FILENAME", "_HOME", "_PLUGIN")
# Credentials and endpoints may come from a platform-owned Secret (secret_env) though never from plain text.
_FROM_SECRETS_ALLOWED = ("MLFLOW_", "AWS_", "GOOGLE_", "AZURE_", "HF_", "HUGGING_FACE_")


# Environment variable names that must come from a Secret, never from the YAML.
_SECRET_LIKE = re.compile(r"(SECRET|PASSWORD|PASSWD|TOKEN|CREDENTIAL|PRIVATE_KEY|ACCESS_KEY|API_KEY)", re.I)


def looks_like_credential(name: str) -> bool:
    """An environment variable name that must come from a Secret, never from the YAML."""
    return bool(_SECRET_LIKE.search(name))


# ASCII letters, digits and '_': a look-alike of a reserved name (full-width letters, a zero-width
# space) is refused as a name rather than judged as some other variable.
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def env_name_problem(name: str) -> str | None:
    if _ENV_NAME.fullmatch(name):
        return None
    return f"{name!r} is not an environment variable name: ASCII letters, digits and '_', not starting with a digit"


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
    if from_secret and upper.startswith(_FROM_SECRETS_ALLOWED):
        return None  # e.g. AWS_SHARED_CREDENTIALS_FILE: the platform's Secret chose the path
    if upper.endswith(_RESERVED_SUFFIXES):
        return "it names a file, folder or library the process loads or writes"
    if from_secret and not looks_like_credential(upper):
        # The spec chooses the name, the platform the Secret: a setting such as TORCH_LOGS or
        # NCCL_DEBUG_SUBSYS is printed by the program that reads it, so the Secret would reach the log.
        return ("a Secret's value goes only into a credential's variable (a name with TOKEN, SECRET, PASSWORD, "
                "CREDENTIAL, ACCESS_KEY, API_KEY or PRIVATE_KEY, or MLFLOW_, AWS_, GOOGLE_, AZURE_ or HF_): "
                "another variable may be printed by the program that reads it")
    return None
