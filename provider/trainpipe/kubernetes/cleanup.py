"""What to delete when a multi-node train Job ends or is killed: one decision, two transports.

The operator (sync client, on the worker) and its trigger (asyncio client, on the triggerer) both
delete a train Job and its headless Service; ``deletions`` decides what and in which order, and
``delete_sync`` / ``delete_async`` only carry the calls out. A resource that is already gone
(404) is not an error: Kubernetes deletes the Service with the Job that owns it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Deletion:
    kind: Literal["Job", "Service"]
    name: str
    namespace: str

    def call(self, core_v1: Any, batch_v1: Any) -> Any:
        """The API call (a coroutine for the asyncio client)."""
        if self.kind == "Job":
            # Foreground: the Job is gone only once its pods are, so no trainer outlives it.
            return batch_v1.delete_namespaced_job(name=self.name, namespace=self.namespace,
                                                  propagation_policy="Foreground")
        return core_v1.delete_namespaced_service(name=self.name, namespace=self.namespace)


def deletions(*, job_name: str, namespace: str, service_name: str | None, delete_job: bool) -> list[Deletion]:
    """The Job first (it stops the trainers), then its Service (the rendezvous DNS name)."""
    planned = [Deletion("Job", job_name, namespace)] if delete_job else []
    if service_name:
        planned.append(Deletion("Service", service_name, namespace))
    return planned


def delete_job_on_finish(on_finish_action: str, *, succeeded: bool) -> bool:
    """Whether the operator's ``on_finish_action`` deletes a Job that ended this way."""
    return on_finish_action == "delete_pod" or (on_finish_action == "delete_succeeded_pod" and succeeded)


def delete_sync(planned: list[Deletion], *, core_v1: Any, batch_v1: Any, logger: logging.Logger = log) -> None:
    for deletion in planned:
        try:
            deletion.call(core_v1, batch_v1)
        except Exception as err:
            _report(deletion, err, logger)
        else:
            logger.info("deleted %s %s/%s", deletion.kind, deletion.namespace, deletion.name)


async def delete_async(planned: list[Deletion], *, core_v1: Any, batch_v1: Any, logger: logging.Logger = log) -> None:
    for deletion in planned:
        try:
            await deletion.call(core_v1, batch_v1)
        except Exception as err:
            _report(deletion, err, logger)
        else:
            logger.info("deleted %s %s/%s", deletion.kind, deletion.namespace, deletion.name)


def _report(deletion: Deletion, err: Exception, logger: logging.Logger) -> None:
    # Report and go on: one failed delete must not leave the other resource behind, nor turn a
    # finished training into a failed task (the Job's ttl_after_finished is the backstop).
    if getattr(err, "status", None) != 404:  # ApiException of either client; 404: already gone
        logger.warning("could not delete %s %s/%s: %s", deletion.kind, deletion.namespace, deletion.name,
                       getattr(err, "reason", None) or err)
