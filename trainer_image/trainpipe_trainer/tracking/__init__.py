"""What a run reports: MLflow tracking, system metrics, the progress line, launch phases."""
