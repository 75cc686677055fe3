"""Airflow DAG file, shard 28 of trainpipe (see trainpipe_dags.py and ADR 0012)."""

from trainpipe.shards import register_shard

register_shard(globals(), 28, __file__)
