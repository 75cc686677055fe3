"""Airflow parses this file: every spec in ``dag_configs/`` becomes one DAG."""

import os
from pathlib import Path

from trainpipe.factory import register_dags

DAG_CONFIGS = Path(os.environ.get("TRAINPIPE_DAG_CONFIGS") or Path(__file__).resolve().parent.parent / "dag_configs")

register_dags(globals(), DAG_CONFIGS)
