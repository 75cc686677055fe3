"""Stage 4: plan -> Airflow DAG objects; the DAG files, their shards, the spec watcher, import errors."""
