"""Airflow DAG file: every spec in dag_configs/ (or TRAINPIPE_DAG_CONFIGS) becomes one trainpipe DAG.

This call is all a DAG file of trainpipe holds (docs/install.md). shards=64: above 300 specs, the 63 files
in shards/ each compile a share of the folder, so no one file parses for too long (ADR 0012); up to
300 specs this file compiles them all and those return at once.
"""

from trainpipe import load_dags

load_dags(globals(), shards=64)
