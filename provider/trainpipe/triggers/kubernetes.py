"""The multi-node train Job's trigger: the provider's KubernetesJobTrigger, plus cleanup on a user kill.

While the train task is deferred, no operator runs, so ``on_kill`` of the operator cannot delete the
Job; Airflow (3.3+) calls the trigger's ``on_kill`` instead. Nothing is left running or orphaned.
"""

from __future__ import annotations

from typing import Any

from airflow.providers.cncf.kubernetes.triggers.job import KubernetesJobTrigger


class TrainJobTrigger(KubernetesJobTrigger):
    """Waits for the Job like ``KubernetesJobTrigger``; on a user kill deletes the Job and its Service."""

    def __init__(self, *, service_name: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.service_name = service_name

    def serialize(self) -> tuple[str, dict[str, Any]]:
        _, kwargs = super().serialize()
        return "trainpipe.triggers.kubernetes.TrainJobTrigger", {**kwargs, "service_name": self.service_name}

    async def on_kill(self) -> None:
        from kubernetes_asyncio.client import BatchV1Api, CoreV1Api

        from trainpipe.kubernetes.cleanup import delete_async, deletions

        self.log.info("task killed: deleting Job %s/%s and its pods", self.job_namespace, self.job_name)
        async with self.hook.get_conn() as api:
            await delete_async(
                deletions(job_name=self.job_name, namespace=self.job_namespace, service_name=self.service_name,
                          delete_job=True),
                core_v1=CoreV1Api(api), batch_v1=BatchV1Api(api), logger=self.log)
