"""What one try of the train task asks of the cluster, from the tries of its DAG run before it: more memory
after an OOM kill (``training.kubernetes.on_oom``), on-demand capacity after preemptions (``capacity``).

A try learns the earlier tries' ends from the run folder's ledger (``usage.json``, ``trainpipe.runtime.usage``),
which every try of the run appends to whatever its outcome: the run folder outlives the task's tries (XCom of
a task instance is cleared when it is retried), and it is read again by ``trainpipe render --k8s`` for the same
run. Airflow-free plain data; ``trainpipe.kubernetes.builders`` turns it into the pod's fields.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainpipe.quantities import format_memory, quantity_bytes

if TYPE_CHECKING:
    from trainpipe.plan import KubernetesPlan

# A try's ``reason`` in the ledger when the trainer container was OOM-killed (the kubelet's own word).
OOM_KILLED = "OOMKilled"
# A try's ``outcome`` in the ledger when its pod was preempted, evicted, or its trainer left for a SIGTERM.
PREEMPTED = "preempted"
SPOT = "spot"
ON_DEMAND = "on_demand"
# Tags of the training's MLflow run, copied onto the registered version: the resources it trained with.
RESOURCE_TAG_PREFIX = "trainpipe.resources."


@dataclass(frozen=True, slots=True, kw_only=True)
class TryResources:
    """The memory and placement of one try, and what changed from the first try's (run-note facts)."""

    try_number: int
    memory: str
    memory_limit: str
    # spot | on_demand with a capacity section, else None (the section's own placement only).
    capacity: str | None
    node_selector: dict[str, str]
    tolerations: tuple[dict[str, Any], ...]
    changes: tuple[str, ...] = ()

    def tags(self, gpus: int) -> dict[str, str]:
        """The MLflow tags that record what this try trained with."""
        tags = {f"{RESOURCE_TAG_PREFIX}memory": self.memory, f"{RESOURCE_TAG_PREFIX}memory_limit": self.memory_limit,
                f"{RESOURCE_TAG_PREFIX}gpus_per_pod": str(gpus), f"{RESOURCE_TAG_PREFIX}try": str(self.try_number)}
        if self.capacity is not None:
            tags[f"{RESOURCE_TAG_PREFIX}capacity"] = self.capacity
        return tags


def try_resources(k: KubernetesPlan, *, try_number: int, earlier: Sequence[Any]) -> TryResources:
    """``earlier``: the ledger entries (``outcome``, ``reason``) of the run's tries before this one."""
    oom_kills = sum(1 for entry in earlier if getattr(entry, "reason", None) == OOM_KILLED)
    preemptions = sum(1 for entry in earlier if entry.outcome == PREEMPTED)
    memory, limit = k.resources["memory"], k.resources["limits"]["memory"] or k.resources["memory"]
    changes: list[str] = []
    if k.on_oom is not None and oom_kills:
        factor, ceiling = k.on_oom["memory_factor"], k.on_oom["max_memory"]
        # Per OOM-killed try, compounding: the second OOM kill grows the already grown request again.
        grown = _grown(memory, factor ** oom_kills, ceiling), _grown(limit, factor ** oom_kills, ceiling)
        kills = f"{oom_kills} OOM kill{'s' if oom_kills > 1 else ''} ({OOM_KILLED})"
        changes.append(f"memory {memory} -> {grown[0]}, limit {limit} -> {grown[1]} after {kills} "
                       f"(on_oom: x{factor:g} per OOM kill, max {ceiling})")
        memory, limit = grown
    capacity = None
    node_selector = dict(k.node_selector)
    tolerations = tuple(k.tolerations)
    if k.capacity is not None:
        after = k.capacity["on_demand_after_preemptions"]
        capacity = ON_DEMAND if preemptions >= after else SPOT
        placement = k.capacity[capacity]
        node_selector.update(placement["node_selector"])
        tolerations += tuple(placement["tolerations"])
        if capacity == ON_DEMAND:
            changes.append(f"on-demand capacity after {preemptions} preempted tr{'y' if preemptions == 1 else 'ies'} "
                           f"(capacity.on_demand_after_preemptions: {after})")
    return TryResources(try_number=try_number, memory=memory, memory_limit=limit, capacity=capacity,
                        node_selector=node_selector, tolerations=tolerations, changes=tuple(changes))


def _grown(quantity: str, factor: float, ceiling: str) -> str:
    top = quantity_bytes(ceiling)
    grown = math.ceil(quantity_bytes(quantity) * factor)
    # At the ceiling the spec's own text, so the request never exceeds it by a rounding.
    return ceiling if grown >= top else min(format_memory(grown), ceiling, key=quantity_bytes)


def failed_try_end(pods: Sequence[Any]) -> tuple[str, str | None]:
    """How a failed try ended, from its pods (``kubernetes.client`` V1Pod objects): (outcome, reason).

    An OOM kill of any container wins (the next try needs more memory whatever else happened);
    then a preemption: the pod's ``DisruptionTarget`` condition (preempted, evicted, node drained or shut
    down), a pod evicted, or a trainer that left for a SIGTERM after committing its step (exit code 75).
    """
    from trainpipe_trainer.config import PREEMPTED_EXIT_CODE

    preempted = False
    for pod in pods:
        status = getattr(pod, "status", None)
        if status is None:
            continue
        for container in status.container_statuses or ():
            for state in (container.state, container.last_state):
                ended = state.terminated if state is not None else None
                if ended is None:
                    continue
                if ended.reason == OOM_KILLED:
                    return "failed", OOM_KILLED
                preempted = preempted or ended.exit_code == PREEMPTED_EXIT_CODE
        disrupted = any(c.type == "DisruptionTarget" and c.status == "True" for c in status.conditions or ())
        preempted = preempted or disrupted or status.reason == "Evicted"
    return (PREEMPTED, None) if preempted else ("failed", None)
