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

        async with self.hook.get_conn() as api:
            self.log.info("task killed: deleting Job %s/%s and its pods", self.job_namespace, self.job_name)
            try:
                await BatchV1Api(api).delete_namespaced_job(
                    name=self.job_name, namespace=self.job_namespace, propagation_policy="Foreground")
            except Exception:  # noqa: BLE001 - report and go on to the Service
                self.log.exception("could not delete Job %s/%s", self.job_namespace, self.job_name)
            if self.service_name:
                try:
                    await CoreV1Api(api).delete_namespaced_service(name=self.service_name, namespace=self.job_namespace)
                except Exception:  # noqa: BLE001
                    self.log.exception("could not delete Service %s/%s", self.job_namespace, self.service_name)
