"""Kueue admission of a queued train Job (``training.kubernetes.queue``).

The Job is created suspended; Kueue unsuspends it when the whole of it fits its ClusterQueue's quota
(all pods at once). Until then no pod exists and no device is held: the train task says "waiting for
quota in queue X since ..." (task log and ``status.json``, which the checkpoint sensor reads, so the
wait is not a stall) and starts its clock, and the cost of the try, at admission. The Job's own
``spec.suspend``, read through the operator's Kubernetes client, is the admission signal.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

# Kueue's label of the LocalQueue a workload waits in, and of its WorkloadPriorityClass.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
ADMISSION_POLL_SECONDS = 10.0
# While waiting, the task log repeats the waiting line this often (the first line comes at once).
WAITING_LOG_EVERY_SECONDS = 300.0


def is_suspended(job: Any) -> bool:
    return bool(job.spec is not None and job.spec.suspend)


def wait_for_admission(read_job: Callable[[], Any], *, on_waiting: Callable[[datetime], None],
                       poll_seconds: float = ADMISSION_POLL_SECONDS,
                       log_every_seconds: float = WAITING_LOG_EVERY_SECONDS,
                       sleep: Callable[[float], None] = time.sleep) -> tuple[Any, datetime | None]:
    """Read the Job until it is no longer suspended; ``on_waiting(since)`` on the first suspended read
    and then every ``log_every_seconds``. Returns the admitted Job and since when it waited (None: never)."""
    since = None
    last_said = 0.0
    while True:
        job = read_job()
        if not is_suspended(job):
            return job, since
        if since is None or time.monotonic() - last_said >= log_every_seconds:
            since = since or datetime.now(UTC)
            on_waiting(since)
            last_said = time.monotonic()
        sleep(poll_seconds)
