"""Airflow DAG file: shard 52 of the 64 that share a large folder of trainpipe specs (../trainpipe_dags.py)."""

from trainpipe import load_dags

load_dags(globals(), shards=64, shard=52)
