"""The trainer launch: the one command and environment that every launcher runs (ADR 0002).

The plan resolves a ``LaunchPlan`` when a spec is compiled, with placeholders for what only a run
knows: the URI of its trainer config, the tracking server, a multi-node Job's name. ``resolve``
fills them the same way for the local launcher, the Pod and every rank of a Job, and
``trainpipe render`` prints the plan's launch, so the rendered command is the command that runs.
Airflow-free and torch-free.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from trainpipe.spec.environment import SHUTDOWN_TIMEOUT_ENV, TRACKING_URI, reserved_env_reason, trainer_environment
from trainpipe.spec.types import Launcher
from trainpipe_trainer.config import PREEMPTION_GRACE_SECONDS

CONFIG_URI = "{config_uri}"
# A multi-node Job's name: also its headless Service's, so node 0 is "<job>-0.<job>" in DNS.
JOB_NAME = "{job_name}"
# Expanded by the kubelet from the variable the Job controller sets in each pod of an Indexed Job.
JOB_COMPLETION_INDEX = "$(JOB_COMPLETION_INDEX)"

# torchrun with an exit code that says "preempted" (trainpipe_trainer.elastic; ADR 0017): same options.
TORCHRUN: tuple[str, ...] = ("python", "-m", "trainpipe_trainer.elastic")


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchPlan:
    launcher: Launcher
    nproc_per_node: int
    nnodes: int
    strategy: str
    # torchrun's argv and the trainer's environment, with the placeholders above.
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    # Local launcher: how often a preempted trainer (it committed its step and exited) is launched
    # again within one task try (training.preemption.max_restarts).
    preemption_restarts: int = 0
    # How long torchrun lets its workers finish a step and commit after SIGTERM before it kills them.
    shutdown_timeout_seconds: int = PREEMPTION_GRACE_SECONDS

    @property
    def world_size(self) -> int:
        """Trainer processes of one run: what the resume guard and reproduce compare."""
        return self.nnodes * self.nproc_per_node


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchValues:
    """What one run (and try) fills in."""

    config_uri: str
    mlflow_tracking_uri: str
    job_name: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ResolvedLaunch:
    argv: tuple[str, ...]
    env: dict[str, str]


def plan_launch(*, launcher: Launcher, nproc_per_node: int, nnodes: int, strategy: str,
                rendezvous_port: int | None = None, max_restarts: int = 0,
                extra_env: tuple[tuple[str, str], ...] = (), preemption_restarts: int = 0,
                shutdown_timeout_seconds: int = PREEMPTION_GRACE_SECONDS, min_nodes: int | None = None) -> LaunchPlan:
    """``torchrun -m trainpipe_trainer --config <uri>`` (through ``TORCHRUN``); several Kubernetes nodes
    rendezvous (c10d)
    at the Job's index-0 pod, one node runs ``--standalone``."""
    if launcher == "kubernetes" and nnodes > 1:
        if rendezvous_port is None:
            raise ValueError("a multi-node Kubernetes launch needs the rendezvous port")
        rendezvous: tuple[str, ...] = (
            f"--node_rank={JOB_COMPLETION_INDEX}",
            "--rdzv_backend=c10d",
            f"--rdzv_endpoint={JOB_NAME}-0.{JOB_NAME}:{rendezvous_port}",
            f"--rdzv_id={JOB_NAME}",
            f"--max_restarts={max_restarts}",
        )
    else:
        rendezvous = ("--standalone",)
    for name, _ in extra_env:
        reason = reserved_env_reason(name)
        if reason is not None:  # the spec stage refuses it with its line; a plan made another way too
            raise ValueError(f"environment variable {name!r} is reserved: {reason}")
    # Elastic: torchrun goes on with at least min_nodes (and lets a replaced node rejoin, up to nnodes).
    nodes = f"{min_nodes}:{nnodes}" if min_nodes is not None else str(nnodes)
    argv = (*TORCHRUN, f"--nnodes={nodes}", f"--nproc_per_node={nproc_per_node}", *rendezvous,
            "-m", "trainpipe_trainer", "--config", CONFIG_URI)
    # torchrun's own SIGTERM handling forwards the signal to its workers, waits this long, then
    # SIGKILLs them (30 s by default): long enough for every rank to finish its step and commit.
    shutdown = ((SHUTDOWN_TIMEOUT_ENV, str(shutdown_timeout_seconds)),)
    return LaunchPlan(launcher=launcher, nproc_per_node=nproc_per_node, nnodes=nnodes, strategy=strategy,
                      argv=argv, env=(*trainer_environment(), *shutdown, *extra_env),
                      preemption_restarts=preemption_restarts, shutdown_timeout_seconds=shutdown_timeout_seconds)


def with_nproc_per_node(launch: LaunchPlan, nproc_per_node: int) -> LaunchPlan:
    """The same launch with another number of processes per node (``trainpipe train --nproc-per-node``,
    ``trainpipe reproduce`` replaying a world-size history)."""
    if nproc_per_node < 1:
        raise ValueError(f"nproc_per_node must be >= 1, got {nproc_per_node}")
    argv = tuple(f"--nproc_per_node={nproc_per_node}" if arg.startswith("--nproc_per_node=") else arg
                 for arg in launch.argv)
    return dataclasses.replace(launch, nproc_per_node=nproc_per_node, argv=argv)


def resolve(launch: LaunchPlan, values: LaunchValues) -> ResolvedLaunch:
    """The launch of one run: every placeholder replaced by that run's value."""
    if not values.job_name and any(JOB_NAME in arg for arg in launch.argv):
        raise ValueError("a multi-node Kubernetes launch is resolved with its Job's name")
    replacements = {CONFIG_URI: values.config_uri, TRACKING_URI: values.mlflow_tracking_uri,
                    JOB_NAME: values.job_name}

    def fill(text: str) -> str:
        for placeholder, value in replacements.items():
            text = text.replace(placeholder, value)
        return text

    # Only trainpipe's own variables carry placeholders. A spec's value is passed as written, so
    # "{mlflow_tracking_uri}" in it never becomes the server's address (and the credentials in it).
    own = {name for name, _ in trainer_environment()}
    return ResolvedLaunch(argv=tuple(fill(arg) for arg in launch.argv),
                          env={name: fill(value) if name in own else value for name, value in launch.env})
