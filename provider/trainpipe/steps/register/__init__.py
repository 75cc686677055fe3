"""The MLflow model registry: versions, aliases, promotion history, lineage tags. Airflow-free."""
