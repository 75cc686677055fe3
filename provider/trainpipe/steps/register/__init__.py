"""The register and promote steps: the MLflow model registry (versions, aliases, promotion history, reject and
rollback: ``model_registry``) and lineage (``lineage``). Airflow-free."""
