"""What a training used: every try's wall time x its devices, kept in the run folder and on the MLflow run.

Each try of the train task (and of a trial, and of ``trainpipe reproduce``) appends one entry to
``<run_dir>/usage.json``: when it started and ended and the GPUs and CPUs it held, whatever its
outcome (succeeded, failed, preempted). After each try the totals over all entries go on the MLflow
run as the metrics ``gpu_hours``, ``cpu_hours`` and, with a price table (``trainpipe.plan.costs``),
``cost``; a later try logs larger totals, so the latest value is the run's. ``register`` copies
them onto the model version as tags and ``trainpipe cost`` sums them.

Accounting never fails a training: a problem is logged as a warning.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from trainpipe import storage
from trainpipe.plan.costs import (
    COST,
    CPU_HOURS,
    GPU_HOURS,
    ON_DEMAND_GPU_HOURS,
    SPOT_GPU_HOURS,
    USAGE_KEYS,
    PriceTable,
    format_usage,
)
from trainpipe.plan.tracking import PIPELINE_TAG, RESOURCE_TAG_PREFIX, TEAM_TAG
from trainpipe.policy.model import load_price_table

if TYPE_CHECKING:
    from trainpipe.plan.model import ResourcePlan
    from trainpipe.settings import Settings

log = logging.getLogger(__name__)

USAGE_FILE = "usage.json"
# A try's ``reason`` in the ledger when the trainer container was OOM-killed (the kubelet's own word).
OOM_KILLED = "OOMKilled"
# A try's ``reason`` when the trainer exited with its CUDA out-of-memory code (trainpipe_trainer.config).
CUDA_OOM = "CUDAOutOfMemory"
# A try's ``outcome`` when its pod was preempted, evicted, or its trainer left for a SIGTERM.
PREEMPTED = "preempted"
# A try's ``capacity`` with a training.kubernetes.capacity section (trainpipe.kubernetes.tries picks it).
SPOT = "spot"
ON_DEMAND = "on_demand"


@dataclass(frozen=True, slots=True, kw_only=True)
class TryUsage:
    try_number: int
    started_at: str
    ended_at: str
    seconds: float
    gpus: int
    cpus: float
    outcome: str  # succeeded | failed | preempted
    # Why it ended, when known: OOM_KILLED or CUDA_OOM (trainpipe.kubernetes.tries reads it for the next try).
    reason: str | None = None
    # Kubernetes: the memory request the try asked for, and its capacity (spot | on_demand) with a capacity section.
    memory: str | None = None
    capacity: str | None = None

    def on_spot(self, resources: ResourcePlan) -> bool:
        return self.capacity == SPOT if self.capacity is not None else resources.spot

    @property
    def gpu_hours(self) -> float:
        return self.gpus * self.seconds / 3600

    @property
    def cpu_hours(self) -> float:
        return self.cpus * self.seconds / 3600


@dataclass(frozen=True, slots=True, kw_only=True)
class RunUsage:
    gpu_hours: float
    cpu_hours: float
    cost: float | None
    tries: int
    # The part of gpu_hours on spot capacity (priced with the spot discount); the rest ran on demand.
    spot_gpu_hours: float = 0.0

    def describe(self) -> str:
        tries = f"{self.tries} tr{'y' if self.tries == 1 else 'ies'}"
        text = f"{format_usage(self.gpu_hours, self.cpu_hours, self.cost)} over {tries}"
        if self.spot_gpu_hours and self.spot_gpu_hours < self.gpu_hours:
            text += (f" ({self.spot_gpu_hours:.3g} GPU-hours on spot, {self.gpu_hours - self.spot_gpu_hours:.3g} "
                     "on demand)")
        return text


def usage_path(run_dir: Any) -> Any:  # ObjectStoragePath in and out
    return run_dir / USAGE_FILE


def read_tries(run_dir: Any) -> list[TryUsage]:
    path = usage_path(run_dir)
    if not path.exists():
        return []
    raw = storage.read_json(path)
    return [TryUsage(**entry) for entry in raw.get("tries", [])]


def tries_before(run_dir: Any, try_number: int) -> list[TryUsage]:
    """The ledger's entries of the run's tries before ``try_number`` (what a try learns its retry from)."""
    return [entry for entry in read_tries(run_dir) if entry.try_number < try_number]


def record_try(run_dir: Any, *, try_number: int, started_at: datetime, ended_at: datetime, resources: ResourcePlan,
               outcome: str, reason: str | None = None, memory: str | None = None,
               capacity: str | None = None) -> list[TryUsage]:
    """Append this try (once: a try already recorded keeps its first entry) and return every try."""
    tries = read_tries(run_dir)
    if any(t.try_number == try_number for t in tries):
        return tries
    seconds = max(0.0, (ended_at - started_at).total_seconds())
    tries.append(TryUsage(try_number=try_number, started_at=started_at.isoformat(), ended_at=ended_at.isoformat(),
                          seconds=seconds, gpus=resources.gpus, cpus=resources.cpus, outcome=outcome, reason=reason,
                          memory=memory, capacity=capacity))
    path = usage_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"tries": [asdict(t) for t in tries]}, indent=2))
    return tries


def totals(tries: list[TryUsage], resources: ResourcePlan, prices: PriceTable | None) -> RunUsage:
    """The run's hours, and its cost with the spot tries and the on-demand tries priced apart."""
    cost: float | None = 0.0 if prices is not None else None
    for spot in (True, False):
        part = [t for t in tries if t.on_spot(resources) == spot]
        if part and cost is not None:
            priced = prices.cost(gpu_hours=sum(t.gpu_hours for t in part), cpu_hours=sum(t.cpu_hours for t in part),
                                 gpu_resource=resources.gpu_resource, spot=spot)
            cost = None if priced is None else cost + priced
    return RunUsage(gpu_hours=sum(t.gpu_hours for t in tries), cpu_hours=sum(t.cpu_hours for t in tries), cost=cost,
                    tries=len(tries), spot_gpu_hours=sum(t.gpu_hours for t in tries if t.on_spot(resources)))


def log_usage(client: Any, mlflow_run_id: str, usage: RunUsage, *, pipeline_id: str, team: str) -> None:
    """The totals as metrics, and the tags ``trainpipe cost`` groups by, in one request."""
    import time

    from mlflow.entities import Metric, RunTag

    now = int(time.time() * 1000)
    values = {GPU_HOURS: usage.gpu_hours, CPU_HOURS: usage.cpu_hours, COST: usage.cost,
              SPOT_GPU_HOURS: usage.spot_gpu_hours, ON_DEMAND_GPU_HOURS: usage.gpu_hours - usage.spot_gpu_hours}
    metrics = [Metric(key, value, now, 0) for key, value in values.items() if value is not None]
    tags = [RunTag(PIPELINE_TAG, pipeline_id), RunTag(TEAM_TAG, team)]
    client.log_batch(mlflow_run_id, metrics=metrics, tags=tags)


def account_try(run_dir: Any, *, settings: Settings, resources: ResourcePlan, pipeline_id: str, try_number: int,
                started_at: datetime, outcome: str, client: Any, mlflow_run_id: str | None, reason: str | None = None,
                memory: str | None = None, capacity: str | None = None) -> RunUsage | None:
    """Record one ended try and log the run's totals, priced by the settings' policy; None (and a warning) when
    that failed."""
    try:
        tries = record_try(run_dir, try_number=try_number, started_at=started_at, ended_at=datetime.now(UTC),
                           resources=resources, outcome=outcome, reason=reason, memory=memory, capacity=capacity)
        usage = totals(tries, resources, load_price_table(settings.policy_path))
        if mlflow_run_id is not None:
            log_usage(client, mlflow_run_id, usage, pipeline_id=pipeline_id, team=resources.team)
        log.info("this training used %s", usage.describe())
        return usage
    except Exception as err:
        log.warning("could not record the GPU/CPU hours of try %d: %s: %s", try_number, type(err).__name__, err)
        return None


def version_usage_tags(client: Any, mlflow_run_id: str) -> dict[str, str]:
    """The training run's usage metrics, and the resources its last try trained with (memory, capacity:
    ``trainpipe.kubernetes.tries``), as registered-version tags (none when it has none)."""
    data = client.get_run(mlflow_run_id).data
    tags = {key: f"{data.metrics[key]:.6g}" for key in USAGE_KEYS if key in data.metrics}
    tags.update({key: value for key, value in data.tags.items() if key.startswith(RESOURCE_TAG_PREFIX)})
    return tags


def run_usage(run_dir: Any, resources: ResourcePlan, *, settings: Settings) -> RunUsage | None:
    """The totals of every try recorded so far; None when the ledger or the price table cannot be read."""
    try:
        return totals(read_tries(run_dir), resources, load_price_table(settings.policy_path))
    except Exception as err:
        log.warning("could not read the GPU/CPU hours of %s: %s: %s", run_dir, type(err).__name__, err)
        return None


def usage_note(usage: RunUsage, *, samples_per_second: float | None = None) -> str:
    """The run-note line (ADR 0009) that says what the training cost, and how fast it trained."""
    rate = f", at {samples_per_second:,.0f} samples/s" if samples_per_second else ""
    return f"training used {usage.describe()}{rate}"
