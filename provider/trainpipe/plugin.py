"""trainpipe's Airflow plugin (entry point ``airflow.plugins`` in pyproject.toml): its listeners only."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from trainpipe.listeners import run_notes


class TrainpipePlugin(AirflowPlugin):
    name = "trainpipe"
    listeners = [run_notes]
