"""Airflow DAG file, shard 48 of trainpipe (see trainpipe_dags.py and ADR 0012)."""

from trainpipe.shards import register_shard

register_shard(globals(), 48, __file__)
