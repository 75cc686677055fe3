"""trainpipe's Airflow plugin (entry point ``airflow.plugins`` in pyproject.toml): the run-note listener, the
specs folder's watcher in the dag-processor (ADR 0022), and
the fleet view (ADR 0019): a FastAPI app at ``/trainpipe`` (API and pages) with a "Training pipelines" entry
in the UI's navigation.

The FastAPI app is built only where Airflow asks for it (the api-server); the scheduler, which loads the
plugin for its listener, never imports FastAPI routes or MLflow through it.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from trainpipe.dags import spec_watch
from trainpipe.listeners import run_notes


class _LazyApps(list):
    """``fastapi_apps`` built on first look: importing the app pulls in the api-server's security modules."""

    def _fill(self) -> None:
        if not super().__len__():
            from trainpipe.fleet.app import URL_PREFIX, create_app

            super().append({"app": create_app(), "url_prefix": URL_PREFIX, "name": "trainpipe fleet view"})

    def __iter__(self):
        self._fill()
        return super().__iter__()

    def __len__(self) -> int:
        self._fill()
        return super().__len__()

    def __getitem__(self, index):
        self._fill()
        return super().__getitem__(index)


class TrainpipePlugin(AirflowPlugin):
    name = "trainpipe"
    listeners = [run_notes, spec_watch]
    fastapi_apps = _LazyApps()
    external_views = [
        {
            "name": "Training pipelines",
            # Relative to the UI's base: the api-server serves this page from the plugin's app.
            "href": "trainpipe/",
            "url_route": "training-pipelines",
            "destination": "nav",
            "category": "browse",
        }
    ]
