"""The trained model outside torch: the numpy scorer, the MLflow pyfunc, the export."""
