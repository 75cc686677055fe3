"""What one try of the train task asks of the cluster, from the tries of its DAG run before it: more memory
after an OOM kill (``training.kubernetes.on_oom``), a smaller batch with more accumulation steps after a CUDA
out-of-memory error (``on_oom.reduce_batch``), on-demand capacity after preemptions (``capacity``).

A try learns the earlier tries' ends from the run folder's ledger (``usage.json``, ``trainpipe.state.usage``),
which every try of the run appends to whatever its outcome: the run folder outlives the task's tries (XCom of
a task instance is cleared when it is retried), and it is read again by ``trainpipe render --k8s`` for the same
run. Airflow-free plain data; ``trainpipe.kubernetes.builders`` turns it into the pod's fields.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

# The ledger's words, defined with its entries (one reader of usage.json: trainpipe.state.usage).
from trainpipe.plan.tracking import RESOURCE_TAG_PREFIX
from trainpipe.quantities import format_memory, quantity_bytes
from trainpipe.state.usage import CUDA_OOM, ON_DEMAND, OOM_KILLED, PREEMPTED, SPOT, TryUsage

if TYPE_CHECKING:
    from trainpipe.plan.model import KubernetesPlan
    from trainpipe_trainer.config import TrainingConfig



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
    # Set only when on_oom.reduce_batch changed them after a CUDA OOM (else the trainer config's own).
    batch_size: int | None = None
    gradient_accumulation_steps: int | None = None

    def trainer(self, template: TrainingConfig) -> TrainingConfig:
        """The trainer config this try trains with: ``template`` with the batch this try changed, if any."""
        if self.batch_size is None:
            return template
        optimization = dataclasses.replace(template.optimization,
                                           gradient_accumulation_steps=self.gradient_accumulation_steps)
        return dataclasses.replace(template, batch_size=self.batch_size, optimization=optimization)

    def tags(self, gpus: int) -> dict[str, str]:
        """The MLflow tags that record what this try trained with."""
        tags = {f"{RESOURCE_TAG_PREFIX}memory": self.memory, f"{RESOURCE_TAG_PREFIX}memory_limit": self.memory_limit,
                f"{RESOURCE_TAG_PREFIX}gpus_per_pod": str(gpus), f"{RESOURCE_TAG_PREFIX}try": str(self.try_number)}
        if self.capacity is not None:
            tags[f"{RESOURCE_TAG_PREFIX}capacity"] = self.capacity
        if self.batch_size is not None:
            tags[f"{RESOURCE_TAG_PREFIX}batch_size"] = str(self.batch_size)
            tags[f"{RESOURCE_TAG_PREFIX}gradient_accumulation_steps"] = str(self.gradient_accumulation_steps)
        return tags


def try_resources(k: KubernetesPlan, *, try_number: int, earlier: Sequence[TryUsage],
                  batch: tuple[int, int] | None = None) -> TryResources:
    """``earlier``: the ledger entries of the run's tries before this one; ``batch``: the trainer config's
    (batch_size, gradient_accumulation_steps), which ``on_oom.reduce_batch`` splits after a CUDA OOM."""
    oom_kills = sum(1 for entry in earlier if entry.reason == OOM_KILLED)
    cuda_ooms = sum(1 for entry in earlier if entry.reason == CUDA_OOM)
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
    batch_size = accumulation = None
    if k.on_oom is not None and k.on_oom.get("reduce_batch") and cuda_ooms and batch is not None:
        batch_size, accumulation = batch
        # Halved per CUDA OOM while it divides (spec validation refuses an odd batch_size): the same samples
        # per optimizer step, so the result stays comparable and the checkpoint resumes.
        for _ in range(cuda_ooms):
            if batch_size % 2:
                break
            batch_size, accumulation = batch_size // 2, accumulation * 2
        ooms = f"{cuda_ooms} CUDA OOM{'s' if cuda_ooms > 1 else ''} ({CUDA_OOM})"
        if batch_size == batch[0]:
            changes.append(f"batch_size {batch_size} cannot be halved after {ooms}: unchanged (on_oom.reduce_batch)")
            batch_size = accumulation = None
        else:
            changes.append(f"batch_size {batch[0]} -> {batch_size}, accumulation {batch[1]} -> {accumulation} after "
                           f"{ooms} (on_oom.reduce_batch: same {batch[0] * batch[1]} samples per step)")
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
                        node_selector=node_selector, tolerations=tolerations, changes=tuple(changes),
                        batch_size=batch_size, gradient_accumulation_steps=accumulation)


def _grown(quantity: str, factor: float, ceiling: str) -> str:
    top = quantity_bytes(ceiling)
    grown = math.ceil(quantity_bytes(quantity) * factor)
    # At the ceiling the spec's own text, so the request never exceeds it by a rounding.
    return ceiling if grown >= top else min(format_memory(grown), ceiling, key=quantity_bytes)


# The trainer's container in the pods both operators build (KubernetesPodOperator's base container).
TRAINER_CONTAINER = "base"
# How container runtimes prefix a status's imageID (dockershim; containerd and CRI-O write none).
_IMAGE_ID_SCHEMES = ("docker-pullable://", "docker://")


def pulled_images(pods: Sequence[Any]) -> tuple[str, ...]:
    """The images the trainer containers of ``pods`` ran, as their nodes resolved them (status ``imageID``:
    ``repo@sha256:...``), each once, sorted: what a tag in the spec meant when it trained."""
    images = set()
    for pod in pods:
        status = getattr(pod, "status", None)
        for container in (status.container_statuses or ()) if status is not None else ():
            if container.name == TRAINER_CONTAINER and container.image_id:
                image = container.image_id
                for scheme in _IMAGE_ID_SCHEMES:
                    image = image.removeprefix(scheme)
                images.add(image)
    return tuple(sorted(images))


def failed_try_end(pods: Sequence[Any]) -> tuple[str, str | None]:
    """How a failed try ended, from its pods (``kubernetes.client`` V1Pod objects): (outcome, reason).

    An OOM kill of any container wins (the next try needs more memory whatever else happened); then a
    trainer's CUDA out-of-memory error (its exit code, ``CUDA_OOM_EXIT_CODE``); then a preemption: the pod's
    ``DisruptionTarget`` condition (preempted, evicted, node drained or shut down), a pod evicted, or a
    trainer that left for a SIGTERM after committing its step (exit code 75).
    """
    from trainpipe_trainer.outcomes import CUDA_OOM_EXIT_CODE, PREEMPTED_EXIT_CODE

    preempted = cuda_oom = False
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
                cuda_oom = cuda_oom or ended.exit_code == CUDA_OOM_EXIT_CODE
        disrupted = any(c.type == "DisruptionTarget" and c.status == "True" for c in status.conditions or ())
        preempted = preempted or disrupted or status.reason == "Evicted"
    if cuda_oom:
        return "failed", CUDA_OOM
    return (PREEMPTED, None) if preempted else ("failed", None)
