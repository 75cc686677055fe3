"""Airflow DAG file, shard 49 of trainpipe (see trainpipe_dags.py and ADR 0012)."""

from trainpipe.shards import register_shard

register_shard(globals(), 49, __file__)
