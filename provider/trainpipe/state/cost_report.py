"""``trainpipe cost``: the GPU-hours, CPU-hours and money of the trainings in MLflow, summed per pipeline or team.

It reads what each training logged (``trainpipe.state.usage``): the metrics ``gpu_hours``,
``cpu_hours`` and ``cost`` of every run of trainpipe's experiments (``trainpipe/<pipeline>``) that has
them, trials and ``trainpipe reproduce`` runs included (they used devices too); the GPU-hours on spot and on
on-demand capacity apart (``spot_gpu_hours``, ``on_demand_gpu_hours``: each run's cost already prices them
apart, ``trainpipe.state.usage.totals``). Searches go in
batches: a page of up to 1,000 runs over up to 100 experiments per request, never one request per run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from trainpipe.plan.costs import COST, CPU_HOURS, GPU_HOURS, ON_DEMAND_GPU_HOURS, SPOT_GPU_HOURS
from trainpipe.plan.tracking import EXPERIMENT_PREFIX, PIPELINE_TAG, TEAM_TAG

PAGE_SIZE = 1000
EXPERIMENTS_PER_SEARCH = 100
GROUPINGS = ("pipeline", "team")


@dataclass(slots=True)
class CostGroup:
    name: str
    runs: int = 0
    gpu_hours: float = 0.0
    # Of gpu_hours: on spot capacity and on demand (runs logged before the split count in neither).
    spot_gpu_hours: float = 0.0
    on_demand_gpu_hours: float = 0.0
    cpu_hours: float = 0.0
    cost: float = 0.0
    # Runs without a cost (logged while there was no price table): their hours count, their money cannot.
    unpriced_runs: int = 0

    def add(self, metrics: dict[str, float]) -> None:
        self.runs += 1
        self.gpu_hours += metrics.get(GPU_HOURS, 0.0)
        self.spot_gpu_hours += metrics.get(SPOT_GPU_HOURS, 0.0)
        self.on_demand_gpu_hours += metrics.get(ON_DEMAND_GPU_HOURS, 0.0)
        self.cpu_hours += metrics.get(CPU_HOURS, 0.0)
        if COST in metrics:
            self.cost += metrics[COST]
        else:
            self.unpriced_runs += 1


@dataclass(slots=True)
class CostSummary:
    by: str
    since: datetime | None
    groups: list[CostGroup] = field(default_factory=list)

    @property
    def total(self) -> CostGroup:
        total = CostGroup(name="total")
        for group in self.groups:
            total.runs += group.runs
            total.gpu_hours += group.gpu_hours
            total.spot_gpu_hours += group.spot_gpu_hours
            total.on_demand_gpu_hours += group.on_demand_gpu_hours
            total.cpu_hours += group.cpu_hours
            total.cost += group.cost
            total.unpriced_runs += group.unpriced_runs
        return total

    def to_dict(self) -> dict[str, Any]:
        return {"by": self.by, "since": self.since.isoformat() if self.since else None,
                "groups": [asdict(g) for g in self.groups], "total": asdict(self.total)}

    def as_text(self) -> str:
        width = max([len(self.by), *(len(g.name) for g in self.groups), len("total")])
        header = (f"{self.by:<{width}}  {'runs':>5}  {'GPU-hours':>10}  {'spot':>10}  {'on-demand':>10}  "
                  f"{'CPU-hours':>10}  {'cost':>10}")
        lines = [header, "-" * len(header)]
        for group in [*self.groups, self.total]:
            if group.name == "total":
                lines.append("-" * len(header))
            note = f"  ({group.unpriced_runs} run(s) without a price)" if group.unpriced_runs else ""
            lines.append(f"{group.name:<{width}}  {group.runs:>5}  {group.gpu_hours:>10.3f}  {group.spot_gpu_hours:>10.3f}"
                         f"  {group.on_demand_gpu_hours:>10.3f}  {group.cpu_hours:>10.3f}  {group.cost:>10.2f}{note}")
        return "\n".join(lines)


def _trainpipe_experiments(client: Any) -> dict[str, str]:
    """Experiment id -> pipeline id, for every ``trainpipe/<pipeline>`` experiment."""
    found: dict[str, str] = {}
    token = None
    while True:
        page = client.search_experiments(filter_string=f"name LIKE '{EXPERIMENT_PREFIX}%'", max_results=PAGE_SIZE,
                                         page_token=token)
        for experiment in page:
            found[experiment.experiment_id] = experiment.name.removeprefix(EXPERIMENT_PREFIX)
        token = page.token
        if not token:
            return found


def summarize_costs(client: Any, *, by: str = "pipeline", since: datetime | None = None) -> CostSummary:
    """Sum the usage metrics of every trainpipe run started at or after ``since`` (all when None)."""
    if by not in GROUPINGS:
        raise ValueError(f"by must be one of {', '.join(GROUPINGS)}, got {by!r}")
    experiments = _trainpipe_experiments(client)
    conditions = [f"metrics.{GPU_HOURS} >= 0"]
    if since is not None:
        conditions.append(f"attributes.start_time >= {int(since.timestamp() * 1000)}")
    groups: dict[str, CostGroup] = {}
    ids = sorted(experiments)
    for start in range(0, len(ids), EXPERIMENTS_PER_SEARCH):
        token = None
        while True:
            page = client.search_runs(ids[start:start + EXPERIMENTS_PER_SEARCH], filter_string=" and ".join(conditions),
                                      max_results=PAGE_SIZE, page_token=token)
            for run in page:
                tags = run.data.tags
                if by == "pipeline":
                    name = tags.get(PIPELINE_TAG) or experiments[run.info.experiment_id]
                else:
                    name = tags.get(TEAM_TAG) or "(no team)"
                groups.setdefault(name, CostGroup(name=name)).add(run.data.metrics)
            token = page.token
            if not token:
                break
    return CostSummary(by=by, since=since, groups=sorted(groups.values(), key=lambda g: (-g.cost, -g.gpu_hours, g.name)))
