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

from trainpipe.spec.models import (
    OVERRIDABLE_PARAMS,
    AssetScheduleSpec,
    PipelineSpec,
    overridden_value,
    param_bounds,
)

TASK_ORDER: tuple[str, ...] = ("snapshot", "validate", "train", "evaluate", "gate", "register")
TRAIN_TASK = "train"
# Runs beside `train` (same upstream), outside the chain: watches its checkpoints for stalls.
CHECKPOINT_SENSOR = "watch_checkpoints"

_TASK_SUMMARIES = {
    "snapshot": "immutable, content-addressed copy of the input window",
    "validate": "Great Expectations suite and volume check; stops the run before training on failure",
    "train": "torchrun the trainer; resumes from this run's latest checkpoint",
    "evaluate": "holdout metrics of the new model and of the current champion",
    "gate": "every gate must pass, else registration is skipped",
    "register": "new MLflow model version, tags, alias",
    CHECKPOINT_SENSOR: "beside train: logs checkpoint progress, fails when none is committed for stall_timeout",
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


def multinode_rendezvous(*, endpoint: str, rdzv_id: str, node_rank: str, max_restarts: int = 0) -> list[str]:
    """torchrun flags of one node of a multi-node run: c10d rendezvous hosted by node 0 at ``endpoint``."""
    return [
        f"--node_rank={node_rank}",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint={endpoint}",
        f"--rdzv_id={rdzv_id}",
        f"--max_restarts={max_restarts}",
    ]


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannedTask:
    task_id: str
    upstream: tuple[str, ...]
    summary: str
    # URIs of the Airflow Assets this task updates when it succeeds.
    outlets: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannedParam:
    """A run parameter (Airflow Param) that overrides the spec value at ``path`` for one run."""

    name: str
    path: tuple[str, ...]
    type: str
    default: float | int | None
    description: str
    # JSON Schema bounds (keyword, value): the declared minimum/maximum within the field's own.
    bounds: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class AssetSchedule:
    uris: tuple[str, ...]
    mode: str  # "all" or "any"


def snapshot_asset_uri(pipeline_id: str) -> str:
    return f"trainpipe://{pipeline_id}/snapshot"


def model_asset_uri(pipeline_id: str) -> str:
    return f"trainpipe://{pipeline_id}/model"


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
    schedule: str | AssetSchedule | None
    start_date: datetime
    retries: int
    tasks: tuple[PlannedTask, ...]
    launch: LaunchPlan
    params: tuple[PlannedParam, ...] = ()
    spec: PipelineSpec = field(repr=False)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["spec"] = self.spec.model_dump(mode="json")
        out["start_date"] = self.start_date.isoformat()
        return out


CONFIG_URI_PLACEHOLDER = "<storage_root>/runs/<pipeline_id>/<run>/trainer_config.json"


def build_plan(spec: PipelineSpec, *, spec_file: str, spec_text: str) -> PipelinePlan:
    outlets = {"snapshot": (snapshot_asset_uri(spec.pipeline_id),), "register": (model_asset_uri(spec.pipeline_id),)}
    tasks = tuple(
        PlannedTask(task_id=task_id, upstream=(TASK_ORDER[i - 1],) if i else (), summary=_TASK_SUMMARIES[task_id],
                    outlets=outlets.get(task_id, ()))
        for i, task_id in enumerate(TASK_ORDER)
    )
    train = TASK_ORDER.index(TRAIN_TASK)
    sensor = PlannedTask(task_id=CHECKPOINT_SENSOR, upstream=(TASK_ORDER[train - 1],),
                         summary=_TASK_SUMMARIES[CHECKPOINT_SENSOR])
    tasks = (*tasks[: train + 1], sensor, *tasks[train + 1 :])
    distributed = spec.training.distributed
    rendezvous = None
    if spec.training.launcher == "kubernetes" and distributed.nnodes > 1 and spec.training.kubernetes is not None:
        # Filled per run by trainpipe.kubernetes.builders (the Job's name is per run and try).
        port = spec.training.kubernetes.rendezvous_port
        rendezvous = multinode_rendezvous(endpoint=f"<job>-0.<job>:{port}", rdzv_id="<job>",
                                          node_rank="$(JOB_COMPLETION_INDEX)",
                                          max_restarts=spec.training.kubernetes.max_pod_restarts)
    launch = LaunchPlan(
        launcher=spec.training.launcher,
        nproc_per_node=distributed.nproc_per_node,
        nnodes=distributed.nnodes,
        strategy=distributed.strategy,
        command=tuple(
            trainer_command(
                nproc_per_node=distributed.nproc_per_node, nnodes=distributed.nnodes, config_uri=CONFIG_URI_PLACEHOLDER,
                rendezvous=rendezvous,
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
        schedule=_schedule(spec),
        start_date=spec.start_date,
        retries=spec.retries,
        tasks=tasks,
        launch=launch,
        params=_params(spec),
        spec=spec,
    )


def _schedule(spec: PipelineSpec) -> str | AssetSchedule | None:
    if isinstance(spec.schedule, AssetScheduleSpec):
        return AssetSchedule(uris=tuple(spec.schedule.assets), mode=spec.schedule.mode)
    return spec.schedule


def _params(spec: PipelineSpec) -> tuple[PlannedParam, ...]:
    planned = []
    for name, param in spec.params.items():
        path, json_type = OVERRIDABLE_PARAMS[name]
        planned.append(PlannedParam(
            name=name, path=path, type=json_type,
            default=param.default if param.default is not None else overridden_value(spec, name),
            description=param.description or f"overrides {'.'.join(path)} for this run",
            bounds=tuple((bound.keyword, bound.value) for bound in param_bounds(name, param)),
        ))
    return tuple(planned)


def apply_param_overrides(plan: PipelinePlan, values: dict[str, Any]) -> tuple[PipelineSpec, dict[str, Any]]:
    """The spec of one run: declared params present in ``values`` replace their spec values.

    Returns the run's spec and the overrides that changed something (recorded in MLflow).
    """
    raw = plan.spec.model_dump()
    changed: dict[str, Any] = {}
    for param in plan.params:
        if param.name not in values or values[param.name] is None:
            continue
        node = raw
        for part in param.path[:-1]:
            node = node[part]
        if node[param.path[-1]] != values[param.name]:
            changed[param.name] = values[param.name]
            node[param.path[-1]] = values[param.name]
    if not changed:
        return plan.spec, {}
    return PipelineSpec.model_validate(raw), changed
