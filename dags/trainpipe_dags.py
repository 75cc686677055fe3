"""Airflow DAG file, shard 0 of trainpipe: every spec of ``dag_configs/`` (or ``TRAINPIPE_DAG_CONFIGS``)
becomes one DAG. This file compiles them all while there are at most 300 specs; above that each of
``trainpipe_dags.py`` and ``trainpipe_dags_01.py`` .. ``_63.py`` compiles its own share (ADR 0012)."""

from trainpipe.shards import register_shard

register_shard(globals(), 0, __file__)
