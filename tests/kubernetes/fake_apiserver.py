"""A Kubernetes API server stand-in on 127.0.0.1: the real clients (sync and asyncio) talk HTTP to it.

It serves the few endpoints the train Job's operator and trigger use, records every request, and
plays a Job's status as a script: each read of the Job's status takes the next entry.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web


def job_status(*, active: int = 0, succeeded: int = 0, failed_reason: str | None = None,
               complete: bool = False) -> dict[str, Any]:
    conditions = []
    if complete:
        conditions.append({"type": "Complete", "status": "True"})
    if failed_reason:
        conditions.append({"type": "Failed", "status": "True", "reason": failed_reason})
    return {"active": active, "succeeded": succeeded, "conditions": conditions or None}


@dataclass
class FakeApiServer:
    # Status of the Job at each successive read; the last one repeats.
    job_statuses: list[dict[str, Any]] = field(default_factory=lambda: [job_status(complete=True, succeeded=1)])
    # (kind, name) of resources that do not exist: deleting them answers 404.
    missing: set[tuple[str, str]] = field(default_factory=set)
    # (kind, name) whose deletion fails with a server error.
    failing: set[tuple[str, str]] = field(default_factory=set)
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    # The first this-many reads of the Job show it suspended (waiting for Kueue's admission).
    suspended_reads: int = 0
    # Pods the pod list answers with (as the API server returns them), whatever the label selector.
    pods: list[dict[str, Any]] = field(default_factory=list)
    port: int = 0
    _reads: int = 0

    def deleted(self) -> list[tuple[str, str, str]]:
        """(kind, name, propagationPolicy) of every DELETE, in order."""
        out = []
        for method, path, query in self.requests:
            if method == "DELETE":
                parts = path.strip("/").split("/")
                kind = {"jobs": "Job", "services": "Service"}[parts[-2]]
                out.append((kind, parts[-1], query.get("propagationPolicy", "")))
        return out

    async def _job(self, request: web.Request) -> web.Response:
        self._record(request)
        name, namespace = request.match_info["name"], request.match_info["namespace"]
        if request.method == "DELETE":
            return self._deleted_or_404("Job", name)
        status = self.job_statuses[min(self._reads, len(self.job_statuses) - 1)]
        suspended = self._reads < self.suspended_reads
        self._reads += 1
        return web.json_response({"apiVersion": "batch/v1", "kind": "Job",
                                  "metadata": {"name": name, "namespace": namespace, "uid": "u-1"},
                                  "spec": {"suspend": suspended, "template": {}},
                                  "status": {} if suspended else status})

    async def _pods(self, request: web.Request) -> web.Response:
        self._record(request)
        return web.json_response({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": self.pods})

    async def _service(self, request: web.Request) -> web.Response:
        self._record(request)
        return self._deleted_or_404("Service", request.match_info["name"])

    def _record(self, request: web.Request) -> None:
        self.requests.append((request.method, request.path, dict(request.query)))

    def _deleted_or_404(self, kind: str, name: str) -> web.Response:
        if (kind, name) in self.failing:
            return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                      "reason": "InternalError", "code": 500}, status=500)
        if (kind, name) in self.missing:
            return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                                      "code": 404}, status=404)
        return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Success"})

    def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/apis/batch/v1/namespaces/{namespace}/jobs/{name}", self._job)
        app.router.add_route("GET", "/apis/batch/v1/namespaces/{namespace}/jobs/{name}/status", self._job)
        app.router.add_route("DELETE", "/api/v1/namespaces/{namespace}/services/{name}", self._service)
        app.router.add_route("GET", "/api/v1/namespaces/{namespace}/pods", self._pods)
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        async def serve() -> None:
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]
            self._runner = runner
            ready.set()

        self._thread = threading.Thread(target=lambda: (self._loop.run_until_complete(serve()), self._loop.run_forever()),
                                        daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the fake Kubernetes API server did not start")

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def kubeconfig(self, folder: Path) -> Path:
        path = folder / "kubeconfig.json"
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
            "users": [{"name": "fake", "user": {"token": "not-a-secret"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        }))
        return path
