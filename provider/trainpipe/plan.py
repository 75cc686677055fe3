"""Stage 3 of compilation: a validated spec -> an Airflow-free plan (tasks, edges, launcher, paths).

The plan is plain data: ``trainpipe render`` prints it and most tests assert on it. Only
``trainpipe.dag_builder`` turns it into Airflow objects.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from trainpipe.spec.models import PipelineSpec

TASK_ORDER: tuple[str, ...] = ("snapshot", "validate", "train", "evaluate", "gate", "register")

_TASK_SUMMARIES = {
    "snapshot": "immutable, content-addressed copy of the input window",
    "validate": "Great Expectations suite and volume check; stops the run before training on failure",
    "train": "torchrun the trainer; resumes from this run's latest checkpoint",
    "evaluate": "holdout metrics of the new model and of the current champion",
    "gate": "every gate must pass, else registration is skipped",
    "register": "new MLflow model version, tags, alias",
}


def run_key(airflow_run_id: str) -> str:
    """A DAG run id made safe for paths; stable across task tries, distinct across runs."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", airflow_run_id).strip("_")


def trainer_command(*, nproc_per_node: int, nnodes: int, config_uri: str, torchrun: str = "torchrun",
                    rendezvous: list[str] | None = None) -> list[str]:
    """The one command every launcher runs (local subprocess, Kubernetes pod)."""
    return [
        torchrun,
        f"--nnodes={nnodes}",
        f"--nproc_per_node={nproc_per_node}",
        *(rendezvous or ["--standalone"]),
        "-m",
        "trainpipe_trainer",
        "--config",
        config_uri,
    ]


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannedTask:
    task_id: str
    upstream: tuple[str, ...]
    summary: str


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchPlan:
    launcher: str
    nproc_per_node: int
    nnodes: int
    strategy: str
    # The command with the config URI left as a placeholder; filled per DAG run.
    command: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelinePlan:
    dag_id: str
    spec_file: str
    spec_sha256: str
    description: str
    owner: str
    tags: tuple[str, ...]
    schedule: str | None
    start_date: datetime
    retries: int
    tasks: tuple[PlannedTask, ...]
    launch: LaunchPlan
    spec: PipelineSpec = field(repr=False)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["spec"] = self.spec.model_dump(mode="json")
        out["start_date"] = self.start_date.isoformat()
        return out


CONFIG_URI_PLACEHOLDER = "<storage_root>/runs/<pipeline_id>/<run>/trainer_config.json"


def build_plan(spec: PipelineSpec, *, spec_file: str, spec_text: str) -> PipelinePlan:
    tasks = tuple(
        PlannedTask(task_id=task_id, upstream=(TASK_ORDER[i - 1],) if i else (), summary=_TASK_SUMMARIES[task_id])
        for i, task_id in enumerate(TASK_ORDER)
    )
    distributed = spec.training.distributed
    launch = LaunchPlan(
        launcher=spec.training.launcher,
        nproc_per_node=distributed.nproc_per_node,
        nnodes=distributed.nnodes,
        strategy=distributed.strategy,
        command=tuple(
            trainer_command(
                nproc_per_node=distributed.nproc_per_node, nnodes=distributed.nnodes, config_uri=CONFIG_URI_PLACEHOLDER
            )
        ),
    )
    return PipelinePlan(
        dag_id=spec.pipeline_id,
        spec_file=spec_file,
        spec_sha256=hashlib.sha256(spec_text.encode()).hexdigest(),
        description=spec.description,
        owner=spec.owner,
        tags=("trainpipe", *spec.tags),
        schedule=spec.schedule,
        start_date=spec.start_date,
        retries=spec.retries,
        tasks=tasks,
        launch=launch,
        spec=spec,
    )
