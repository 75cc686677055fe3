"""Airflow DAG file, shard 62 of trainpipe (see trainpipe_dags.py and ADR 0012)."""

from trainpipe.shards import register_shard

register_shard(globals(), 62, __file__)
